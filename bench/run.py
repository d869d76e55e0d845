"""Run every system on the workloads side by side and print one table (bench/README.md).

    bench/setup_peers.sh                      # once: Flower and pfl in their own environments
    python bench/run.py --workloads W1 W2 --reps 3 [--systems bare fedrun-1 fedrun-2 pfl-2 flower] [--record]
    python bench/run.py --systems fedrun-1 fedrun-2 --baseline ../old-checkout   # before/after a change
    python bench/run.py --systems fedrun-2 --baseline ../old --strategy vmap     # both sides with one strategy

Each (workload, system) runs ``--reps`` times as a fresh process; the table shows the median over
repetitions of each run's median s/round (rounds 4..end) with the min-max over repetitions, the ratio
of every system's time to fedrun on 2 ranks, its speed-up over the bare loop (bare's time / its time),
and the final accuracy (a system that is fast but learns
less is not faster). ``--record`` appends the table to bench/RESULTS.md with the date and machine.

Many small operations suffer more from a loaded machine than a few batched ones, so a ratio measured under
load flatters the batched side. Before every run the machine's busy cores are measured over half a second
(from /proc/stat, so the runs before it, which have ended, do not count, as they would in a load average)
and recorded with the 1-minute load average; the table shows the most busy cores per system, and a system
whose busy cores exceeded those the machine has left for it (cores minus the processes the system runs) is
marked ``loaded``: its ratios are not to be quoted, and ``--record`` refuses such a table unless
``--allow-loaded``.
``--baseline DIR`` adds ``fedrun-1@base`` and ``fedrun-2@base``: the fedrun of another checkout (a git
worktree of an earlier commit), run by that checkout's own bench/fedrun_side.py in the same interleaved
turns, so that a change's speed is measured side by side with the code before it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ENVS = BENCH / ".envs"
# processes each system runs (the cores it needs for itself)
PROCESSES = {"bare": 1, "fedrun-1": 1, "fedrun-2": 2, "pfl-1": 1, "pfl-2": 2, "flower": 2,
             "fedrun-1@base": 1, "fedrun-2@base": 2}
SYSTEMS = {
    "bare": (sys.executable, ["bare_loop.py"]),
    "fedrun-1": (sys.executable, ["fedrun_side.py", "--ranks", "1"]),
    "fedrun-2": (sys.executable, ["fedrun_side.py", "--ranks", "2"]),
    "pfl-1": (str(ENVS / "pfl" / "bin" / "python"), ["peer_pfl.py", "--workers", "1"]),
    "pfl-2": (str(ENVS / "pfl" / "bin" / "python"), ["peer_pfl.py", "--workers", "2"]),
    "flower": (str(ENVS / "flower" / "bin" / "python"), ["peer_flower.py"]),
}


def quiet_for(system: str, busy: float) -> bool:
    """Whether ``busy`` cores in use by others left ``system`` the cores it runs on."""
    return busy <= (os.cpu_count() or 1) - PROCESSES[system] + 0.5


def busy_cores(window_s: float = 0.5) -> float:
    """Cores busy (not idle or waiting on I/O) over the next ``window_s`` seconds, from /proc/stat."""
    def sample() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(fields), fields[3] + fields[4]  # all jiffies, idle + iowait

    total0, idle0 = sample()
    time.sleep(window_s)
    total1, idle1 = sample()
    return (os.cpu_count() or 1) * (1 - (idle1 - idle0) / max(1, total1 - total0))


def run_once(system: str, workload: str, extra: list[str]) -> dict:
    python, args = SYSTEMS[system]
    busy, load = busy_cores(), os.getloadavg()[0]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([python, *args, "--workload", workload, *extra], cwd=BENCH, env=env,
                          capture_output=True, text=True, timeout=3600)
    for line in reversed(proc.stdout.splitlines()):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "system" in rec:
            return {**rec, "busy": busy, "load": load}
    raise RuntimeError(f"{system} on {workload} printed no result (exit {proc.returncode}):\n{proc.stderr[-2000:]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", nargs="+", default=["W1", "W2"])
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--rounds", type=int, help="override the workloads' rounds (quick checks)")
    p.add_argument("--record", action="store_true", help="append the table to bench/RESULTS.md")
    p.add_argument("--allow-loaded", action="store_true", help="--record a table with runs on a loaded machine")
    p.add_argument("--baseline", type=Path, help="a checkout of an earlier fedrun to run beside this one")
    p.add_argument("--strategy", help="local.strategy of every fedrun system (default: each side's auto)")
    args = p.parse_args()
    if args.baseline is not None:
        side = args.baseline.resolve() / "bench" / "fedrun_side.py"
        if not side.is_file():
            p.error(f"--baseline {args.baseline}: expected a fedrun checkout with bench/fedrun_side.py")
        for ranks in (1, 2):
            SYSTEMS[f"fedrun-{ranks}@base"] = (sys.executable, [str(side), "--ranks", str(ranks)])
            args.systems.append(f"fedrun-{ranks}@base")
    extra = ["--rounds", str(args.rounds)] if args.rounds else []
    rows, loaded = [], False
    for workload in args.workloads:
        systems = [s for s in args.systems if Path(SYSTEMS[s][0]).exists()]
        for missing in sorted(set(args.systems) - set(systems)):
            print(f"skip {missing}: {SYSTEMS[missing][0]} missing (run bench/setup_peers.sh)", file=sys.stderr)
        runs: dict[str, list[dict]] = {s: [] for s in systems}
        for rep in range(args.reps):  # interleaved, so that a drift in machine load hits every system alike
            for system in systems:
                forced = ["--strategy", args.strategy] if args.strategy and system.startswith("fedrun") else []
                runs[system].append(run_once(system, workload, [*extra, *forced]))
                rec = runs[system][-1]
                chosen = f" ({rec['strategy']}, placement {rec['placement']})" if "strategy" in rec else ""
                print(f"{workload} rep {rep + 1} {system}: {rec['s_per_round_median']:.4f} s/round{chosen}, "
                      f"busy cores before {rec['busy']:.2f}, load average {rec['load']:.2f}",
                      file=sys.stderr, flush=True)
        results = {}
        for system, reps in runs.items():
            medians = [r["s_per_round_median"] for r in reps]
            results[system] = (statistics.median(medians), min(medians), max(medians),
                               statistics.median(r["final_accuracy"] for r in reps),
                               statistics.median(r["total_s"] for r in reps), max(r["busy"] for r in reps))
            loaded |= not all(quiet_for(system, r["busy"]) for r in reps)
        ref = results.get("fedrun-2", (float("nan"),))[0]
        bare = results.get("bare", (float("nan"),))[0]
        for system, (med, lo, hi, acc, total, busy) in results.items():
            mark = "" if quiet_for(system, busy) else " loaded"
            rows.append(f"| {workload} | {system} | {med:.4f} | {lo:.4f}-{hi:.4f} | {med / ref:.2f} | "
                        f"{bare / med:.2f}x | {acc:.3f} | {total:.1f} | {busy:.2f}{mark} |")
    table = "\n".join(["| workload | system | median s/round | min-max | ratio to fedrun-2 | speed-up over bare | "
                       "final acc | total s | max busy cores before |", "|---|---|---|---|---|---|---|---|---|", *rows])
    print(table)
    if loaded:
        print(f"some runs started with more busy cores than left them theirs ({os.cpu_count()} cores): "
              "their ratios are not quiet-machine figures", file=sys.stderr)
    if args.record and loaded and not args.allow_loaded:
        raise SystemExit("bench/run.py: --record refused: the machine was loaded (see 'max busy cores before'); "
                         "rerun on a quiet machine or pass --allow-loaded")
    if args.record:
        machine = f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}"
        stamp = f"{datetime.date.today()} on {platform.node()} ({machine})"
        with (BENCH / "RESULTS.md").open("a") as fh:
            fh.write(f"\n## {stamp}, {args.reps} repetitions\n\n{table}\n")


if __name__ == "__main__":
    main()
