"""Where a round's time goes: per-phase timers around the collaborators of fedrun's round, on W1 or W2.

    python bench/round_phases.py --workload W2 [--rounds 200] [--strategy auto]
    mpiexec -n 2 python bench/round_phases.py --workload W2          # every rank prints its own table
    python bench/round_phases.py --workload W2 --clock cpu           # this thread's CPU time (a shared machine)

The run is fedrun's own (bench/fedrun_side.py's config, built in this process), with each phase's function
wrapped by a timer; the wrappers cost about a microsecond a call, so the table is for finding where the
milliseconds go, not for quoting s/round (bench/run.py does that). Rounds 1-3 are warm-up and not counted.
``--clock cpu`` times with the thread's CPU time instead of the wall clock: on a machine whose other processes take
the cores, wall times grow with the load (3x at a load of 5 on 2 cores) while CPU times grow much less, so
before/after comparisons stay readable; waiting in a collective is not CPU time, so on several ranks it reads the
work only.
Phases (ms per round, mean over the counted rounds):

* ``schedule``: the cohort of the round and the participation bookkeeping (``begin``, ``hold``, ``end``);
* ``batches``: gathering the clients' minibatch indices of the round; ``oracle``: the forward and backward
  passes (per call, both chunks); ``solver``: run_local's own work around the oracle (steps, sums);
* ``client rules``: the algorithm's plan and finish, storing the trained clients' state;
* ``exchange``: the reduce (exact sums and the collective; ``reduce``), the server rule on rank 0 (``server
  rule``) and the broadcast of its result; ``downlink``: what the clients start the round from;
* ``bookkeeping``: the algorithm's after-round rules and the delay metrics; ``fingerprint``: the record's
  hash of the server state; ``other``: everything of the round not inside a phase.
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time
from pathlib import Path

import numpy as np
import workloads
from fedrun_side import fedrun_overrides, prepare

from fedrun.config import load_config
from fedrun.federation import rounds
from fedrun.federation.build import build
from fedrun.runtime.world import init_world

SPENT: dict[str, float] = collections.defaultdict(float)
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
clock = time.perf_counter  # what every timer reads (--clock)
TOP = ("schedule", "downlink", "batches", "oracle set-up", "solver", "client rules", "exchange", "bookkeeping",
       "fingerprint")
NESTED = {"solver": ("oracle",), "exchange": ("reduce", "server rule")}


def timed(phase: str, fn):
    """``fn`` with its seconds added to SPENT[phase] (nested phases count in both)."""
    def wrapper(*args, **kwargs):
        start = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[phase] += clock() - start
    return wrapper


def instrument(setup, state) -> None:
    """Wrap the round's collaborators (this process only; nothing of fedrun is changed on disk)."""
    schedule, trainer, ex = state.schedule, setup.round.trainer, setup.round.exchange
    for name in ("begin", "hold", "release", "end"):
        setattr(schedule, name, timed("schedule", getattr(schedule, name)))
    trainer.block.batches = timed("batches", trainer.block.batches)
    strategy, real_oracle = state.strategy, state.strategy.oracle

    def oracle(*args, **kwargs):
        return timed("oracle", real_oracle(*args, **kwargs))

    strategy.oracle = timed("oracle set-up", oracle)
    strategy.solve = timed("solver", strategy.solve)
    algorithm = trainer.algorithm
    for name in ("local_plan", "client_finish"):
        setattr(algorithm, name, timed("client rules", getattr(algorithm, name)))
    setup.round.store_state = timed("client rules", setup.round.store_state)
    ex._reduce = timed("reduce", ex._reduce)
    ex.downlink = timed("downlink", ex.downlink)
    trainer.update = timed("bookkeeping", trainer.update)
    state.delay.update = timed("bookkeeping", state.delay.update)
    rounds.fingerprint = timed("fingerprint", rounds.fingerprint)
    exchange_step = ex.step

    def step(label, ctx, uplink, server, rule):
        return exchange_step(label, ctx, uplink, server, timed("server rule", rule))

    ex.step = timed("exchange", step)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="W2", choices=sorted(workloads.WORKLOADS))
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--strategy", default="auto")
    p.add_argument("--clients", type=int, help="fewer clients than the workload's (a quick check)")
    p.add_argument("--clock", default="wall", choices=sorted(CLOCKS), help="wall clock or this thread's CPU time")
    args = p.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    smaller = {} if args.clients is None else {"num_clients": args.clients, "cohort": min(args.clients, 100)}
    wl = workloads.get_workload(args.workload, rounds=args.rounds, **smaller)
    arrays, trace = prepare(wl, "dirichlet")
    overrides = fedrun_overrides(wl, arrays, trace, args.strategy)
    world = init_world("cpu")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(None, [*overrides, f"run.dir={tmp}"])
        setup, state = build(cfg, world, Path(tmp))
        instrument(setup, state)
        walls = []
        for t in range(wl.rounds):
            if t == 3:
                SPENT.clear()
            start = clock()
            setup.round.run(state, t)
            walls.append(clock() - start)
    counted = wl.rounds - 3
    total = float(np.sum(walls[3:]))
    print(f"rank {world.rank} of {world.size}: {args.workload}, {counted} rounds, "
          f"{1e3 * total / counted:.3f} ms a round (median {1e3 * float(np.median(walls[3:])):.3f})")
    for phase in TOP:
        print(f"  {phase:<16} {1e3 * SPENT[phase] / counted:8.3f} ms")
        for inner in NESTED.get(phase, ()):
            print(f"    {inner:<14} {1e3 * SPENT[inner] / counted:8.3f} ms")
    other = total - sum(SPENT[phase] for phase in TOP)
    print(f"  {'other':<16} {1e3 * other / counted:8.3f} ms")
    world.close()


if __name__ == "__main__":
    main()
