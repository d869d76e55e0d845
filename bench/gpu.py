"""The GPU check (bench/README.md, "GPU run"): one prepared script, one call, under 8 minutes on one GPU.

    python3 bench/gpu.py [--out DIR] [--quick] [--device cuda|cpu]

On the lent GPU machine (its own python3 with a CUDA torch, fedrun from the working tree on PYTHONPATH)
it runs, each part timed and printed as soon as it ends:

1. NCCL: a one-rank NCCL process group and fedrun's own reduce and broadcast of a flat round buffer
   on the GPU (one GPU cannot host two NCCL ranks, so the group has one member).
2. Strategies: ``local.strategy=fastest``'s start-up timings of sequential, channels_last, vmap and batched for the
   FedSUM CNNs (MNIST, SVHN, CIFAR-10 shapes) and ResNet-18 (GroupNorm), 16 clients, batch 32.
3. W1 on ResNet-18: FedAvg, 1000 clients of 50 CIFAR-shaped synthetic examples, cohort 50, 5 steps of
   batch 10 (as W1), one rank, each strategy forced: median s/round over rounds 3..end.
4. Batched: the ``batched`` strategy's chunk-position invariance on the GPU (a client alone against the
   same client first, in the middle and last of a chunk, bit for bit) and its speed against
   ``sequential`` for cnn_femnist, lstm_shakespeare_unrolled, cnn_cifar10, cnn_svhn, cnn_mnist (dropout: each
   client's masks from CUDA's dropout kernel on its own stream) and resnet18 (GroupNorm, its block's
   convolutions as batched matrix products: its CUDA position-exactness is verified here): the models
   that ``auto`` batches on CUDA
   (tests/test_batched_exact.py checks the CNNs' positions on no GPU): one chunk of 64
   clients, 5 steps of batch 10, timed in turns (``bench/batched.py``), deterministic CUDA kernels on.

It prints a markdown table per part and writes ``DIR/gpu.json`` (every number) and ``DIR/gpu.md`` (the
tables, with the device and the date) for bench/RESULTS.md. ``--quick`` shrinks every size so that the
script can be checked on a CPU machine (``--device cpu --quick``, about a minute).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.batched import compare  # noqa: E402
from fedrun.api import run as fedrun_run  # noqa: E402
from fedrun.config import load_config  # noqa: E402
from fedrun.federation.build import build  # noqa: E402
from fedrun.runtime.flat import FlatLayout, broadcast_from_root, reduce_to_root  # noqa: E402
from fedrun.runtime.world import World, deterministic_cuda  # noqa: E402

MODELS = [("cnn_mnist", [1, 28, 28]), ("cnn_svhn", [3, 32, 32]), ("cnn_cifar10", [3, 32, 32]),
          ("resnet18", [3, 32, 32])]


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def check_nccl(device: torch.device) -> dict:
    """fedrun's reduce/broadcast on a one-rank NCCL group (gloo on CPU), on a d = 11.2M round buffer."""
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    store = dist.HashStore()
    dist.init_process_group(backend=backend, store=store, rank=0, world_size=1)
    try:
        # size 2 makes the runtime's helpers issue their collectives; the group itself has one rank
        world = World(rank=0, size=2, local_rank=0, device=device, backend=backend)
        layout = FlatLayout([("delta", 11_173_962), ("_loss", 1)])
        buf = layout.empty(torch.float32, device)
        buf.normal_()
        want = buf.clone()
        start = time.perf_counter()
        reduce_to_root(world, buf)
        broadcast_from_root(world, buf)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        return {"backend": backend, "floats": layout.numel, "seconds": round(seconds, 4),
                "unchanged": bool(torch.equal(buf, want))}
    finally:
        dist.destroy_process_group()


def strategy_timings(device: torch.device, quick: bool) -> list[dict]:
    out = []
    for name, shape in MODELS[:2] if quick else MODELS:
        cfg = load_config(None, [
            "data.name=synthetic", f"data.synthetic.shape={shape}", "data.synthetic.examples_per_client=64",
            f"data.num_clients={4 if quick else 16}", "data.partition=iid", f"model.name={name}",
            "local.batch_size=32", "local.steps=2", "participation.pattern=full", "eval.every=0",
            f"run.device={device.type}", "run.rounds=1", "local.strategy=fastest"])
        setup, state = build(cfg, World(rank=0, size=1, local_rank=0, device=device, backend="none"), None)
        timings = {k: round(v, 4) for k, v in setup.strategy_timings.items()}
        out.append({"model": name, "dim": setup.dim, "timings_s": timings, "chosen": state.strategy})
        print(f"strategies {name}: {timings} -> {state.strategy}", flush=True)
    return out


def w1_resnet(device: torch.device, quick: bool) -> list[dict]:
    rounds = 3 if quick else 8
    base = {"run": {"rounds": rounds, "device": device.type, "seed": 1},
            "data": {"name": "synthetic", "num_clients": 40 if quick else 1000, "partition": "iid",
                     "synthetic": {"shape": [3, 32, 32], "examples_per_client": 50}},
            "model": {"name": "cnn_cifar10" if quick else "resnet18"},
            "local": {"steps": 5, "batch_size": 10, "lr": 0.05},
            "participation": {"pattern": "uniform", "clients_per_round": 4 if quick else 50},
            "eval": {"every": rounds}}
    world = World(rank=0, size=1, local_rank=0, device=device, backend="none")
    out = []
    # batched pads a CPU chunk to 64 CNN clients: too slow for --quick's 4-client rounds (part 4 checks it)
    for strategy in ("sequential", "channels_last", "vmap", *(() if quick else ("batched",))):
        cfg = {**base, "local": {**base["local"], "strategy": strategy}}
        start = time.perf_counter()
        result = fedrun_run(cfg, world=world, write_files=False)
        walls = [r["wall_s"] for r in result.metrics][min(2, rounds - 1):]
        row = {"model": base["model"]["name"], "strategy": strategy,
               "s_per_round_median": round(statistics.median(walls), 4),
               "total_s": round(time.perf_counter() - start, 1),
               "test_accuracy": round(result.metrics[-1].get("test_accuracy", float("nan")), 4)}
        out.append(row)
        print(f"W1 {row}", flush=True)
    return out


def batched_blocks(device: torch.device, quick: bool) -> list[dict]:
    names = ["logistic"] if quick else \
        ["cnn_femnist", "lstm_shakespeare_unrolled", "cnn_cifar10", "cnn_svhn", "cnn_mnist", "resnet18"]
    out = []
    for name in names:
        row = compare(name, 20 if quick else 64, 2 if quick else 5, 10, 1 if quick else 3, device)
        row = {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}
        out.append(row)
        print(f"batched {row}", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/gpu")
    p.add_argument("--quick", action="store_true", help="tiny sizes, to check the script on a CPU")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("bench/gpu.py: --device cuda but torch sees no CUDA device")
    torch.set_num_threads(1 if device.type == "cpu" else torch.get_num_threads())
    if device.type == "cuda":
        deterministic_cuda()  # as a run on the GPU (fedrun.runtime.world)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    report: dict = {"date": datetime.date.today().isoformat(), "device": name, "torch": torch.__version__}
    print(f"bench/gpu.py on {name}, torch {torch.__version__}", flush=True)
    report["collectives"] = check_nccl(device)
    print(f"collectives: {report['collectives']}", flush=True)
    report["strategies"] = strategy_timings(device, args.quick)
    report["batched"] = batched_blocks(device, args.quick)
    report["w1_resnet18"] = w1_resnet(device, args.quick)
    md = [f"## {report['date']}, GPU check on {name} (torch {report['torch']}, `python3 bench/gpu.py`)", "",
          table(["backend", "floats", "reduce + broadcast s", "buffer unchanged"],
                [[c["backend"], c["floats"], c["seconds"], c["unchanged"]] for c in [report["collectives"]]]), "",
          table(["model", "d", "sequential s", "channels_last s", "vmap s", "batched s", "fastest picks"],
                [[s["model"], s["dim"], *(s["timings_s"].get(k, "n/a") for k in
                                          ("sequential", "channels_last", "vmap", "batched")), s["chosen"]]
                 for s in report["strategies"]]), "",
          table(["model", "d", "clients", "sequential s", "batched s", "sequential / batched", "position-exact"],
                [[r["model"], r["dim"], r["clients"], r["sequential_s"], r["batched_s"],
                  r["sequential_over_batched"], r["exact"]] for r in report["batched"]]), "",
          table(["W1 model", "strategy", "median s/round", "total s", "test accuracy"],
                [[r["model"], r["strategy"], r["s_per_round_median"], r["total_s"], r["test_accuracy"]]
                 for r in report["w1_resnet18"]])]
    print("\n" + "\n".join(md), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "gpu.md").write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
