"""A stand-in for ``python -m fedrun train`` that honours the launcher contract, for cluster tests.

    fake_train.py [train] --config FILE [--resume auto|PATH] [section.key=value ...]

It runs ``run.rounds`` rounds of a deterministic toy "model" on every MPI rank (mpi4py if the
launcher started ranks, else one rank), sleeping ``run.round_s`` seconds per round, and writes what the
real core writes to ``run.dir``: config.yaml, metrics.jsonl, ckpt_<round>.h5 (``server/x``, ``round``)
and result.json. SIGTERM or SIGUSR1: finish the round, write a checkpoint, exit 75.
Everything random is a function of (seed, round), so an interrupted + resumed run ends bit-identical
to an uninterrupted one.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import yaml

STOP = {"signal": 0}


def on_signal(signum, frame):  # noqa: ARG001
    STOP["signal"] = signum


def parse(argv: list[str]) -> tuple[dict, str | None]:
    if argv and argv[0] == "train":
        argv = argv[1:]
    cfg: dict = {}
    resume = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--config":
            cfg = yaml.safe_load(Path(argv[i + 1]).read_text()) or {}
            i += 2
            continue
        if a == "--resume":
            resume = argv[i + 1]
            i += 2
            continue
        key, raw = a.split("=", 1)
        node = cfg
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = yaml.safe_load(raw)
        i += 1
    return cfg, resume


def main(argv: list[str]) -> int:
    cfg, resume = parse(argv)
    run = cfg.setdefault("run", {})
    algo = cfg.setdefault("algorithm", {}).get("name", "fedavg")
    rounds, seed = int(run.get("rounds", 5)), int(run.get("seed", 0))
    round_s = float(run.get("round_s", 0.0))
    every = int(cfg.get("checkpoint", {}).get("every", 0))
    lr = float(cfg.get("local", {}).get("lr", 0.1))
    run_dir = Path(str(run.get("dir", "runs/fake")))
    try:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    except ImportError:  # pragma: no cover
        comm = None
    rank, size = (comm.Get_rank(), comm.Get_size()) if comm else (0, 1)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGUSR1, on_signal)
    d = 8
    x = np.zeros(d)
    start = 0
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    ckpts = sorted(run_dir.glob("ckpt_*.h5"), key=lambda p: int(p.stem.split("_")[1]))
    if resume == "auto" and ckpts:
        with h5py.File(ckpts[-1], "r") as f:
            x, start = f["server/x"][...], int(f["round"][()])
    if rank == 0:
        rows = []
        mpath = run_dir / "metrics.jsonl"
        if mpath.exists():
            rows = [r for r in map(json.loads, mpath.read_text().splitlines()) if r["round"] <= start]
        mpath.write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"fake_train rank0/{size}: {algo} rounds {start + 1}..{rounds} in {run_dir}", flush=True)
    gain = {"fedavg": 0.5, "fedsum": 1.0}.get(algo, 0.7)
    target = np.random.default_rng(seed).normal(size=d)
    up_total = down_total = 0
    if start and rank == 0 and rows:
        up_total, down_total = rows[-1]["uplink_floats_total"], rows[-1]["downlink_floats_total"]

    def checkpoint(r: int) -> None:
        if rank != 0:
            return
        tmp = run_dir / f"ckpt_{r}.h5.tmp"
        with h5py.File(tmp, "w") as f:
            f["server/x"] = x
            f["round"] = r
        os.replace(tmp, run_dir / f"ckpt_{r}.h5")

    t0 = time.time()
    for r in range(start + 1, rounds + 1):
        noise = np.random.default_rng([seed, r]).normal(scale=0.1, size=d)
        step = lr * gain * (target - x) + 0.01 * noise
        if comm is not None and size > 1:
            step = comm.allreduce(step) / size  # every rank computes the same step: a real collective
        x = x + step
        time.sleep(round_s)
        up_total += size * d
        down_total += size * d
        if rank == 0:
            loss = float(0.5 * np.sum((x - target) ** 2))
            row = {"round": r, "train_loss": loss, "wall_s": time.time() - t0,
                   "uplink_floats": size * d, "downlink_floats": size * d,
                   "uplink_floats_total": up_total, "downlink_floats_total": down_total}
            if r % 2 == 0 or r == rounds:
                row.update(test_accuracy=float(1 / (1 + loss)), test_loss=loss * 1.1)
            with (run_dir / "metrics.jsonl").open("a") as f:
                f.write(json.dumps(row) + "\n")
        stop = STOP["signal"]
        if comm is not None and size > 1:
            stop = comm.allreduce(stop, op=MPI.MAX)  # all ranks stop after the same round
        if stop:
            checkpoint(r)
            if rank == 0:
                print(f"fake_train: signal {stop} after round {r}: checkpointed, exit 75", flush=True)
            return 75
        if every and r % every == 0:
            checkpoint(r)
    checkpoint(rounds)
    if rank == 0:
        final = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
        (run_dir / "result.json").write_text(json.dumps(final, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
