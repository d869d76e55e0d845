"""The GPU check (bench/README.md, "GPU run"): one prepared script, one call, under 8 minutes on one GPU.

    python3 bench/gpu.py [--out DIR] [--tiny] [--device cuda|cpu] [--parts NAME ...]

On the lent GPU machine (its own python3 with a CUDA torch, fedrun from the working tree on PYTHONPATH)
it runs every part below, each timed and printed as soon as it ends, every ratio measured in this run:

* ``collectives``: a one-rank process group (NCCL on a GPU, gloo on a CPU) and fedrun's reduce and
  broadcast of a ResNet-18-sized flat round buffer.
* ``local``: one cohort's local training (:data:`COHORT` clients, 5 steps of batch 10, as W1) for
  :data:`LOCAL_MODELS` (W1's ResNet-18, the FedSUM CNNs, the LEAF models), by each fedrun strategy that
  applies, beside the bare GPU loop (clients one at a time, data resident on the device,
  torch.optim.SGD: ``bench/bare_loop.py``'s :func:`resident_round`) and the stacked ``torch.func.vmap``
  floor (:func:`stacked_round`); every time over the bare loop's.
* ``batched``: the ``batched`` strategy's chunk-position invariance (a client alone against the same client
  first, in the middle and last of a chunk, bit for bit) and its speed against ``sequential`` for
  :data:`BATCHED_MODELS`: 64 clients, 5 steps of batch 10, timed in turns (``bench/batched.py``).
* ``written_out``: the linear models' written-out gradient (``batched_backward`` with the loss's own
  gradient, fedrun.training.gradients.written_out_gradient) against autograd through their ``batched_forward``
  on a W2-shaped chunk (64 clients x 50 examples, some short or empty) on the device: the same bits asked
  (on a CPU the test suite checks it; on a GPU this is the only check).
* ``w1``: W1 on ResNet-18 (``--tiny``: the CIFAR-10 CNN; FedAvg, 1000 clients of 50 CIFAR-shaped synthetic
  examples, cohort 50, 5 steps of batch 10), one rank, each strategy forced and ``auto``, beside the bare
  loop and the stacked floor over the same cohort sizes: median s/round over rounds 3..end (but the last,
  which evaluates), each over the bare loop's.
* ``ranks``: the README's quickstart (configs/quickstart.yaml) through torchrun on the device with 1 and 2
  ranks (2 ranks on one GPU share it: gloo on host buffers), the same bits asked of both, and on 2 CPU
  ranks for reference: median s/round.

It prints a markdown table per part and writes ``DIR/gpu.json`` (every number) and ``DIR/gpu.md`` (the
tables, with the device and the date) for bench/RESULTS.md. ``--tiny`` shrinks every size but keeps every
part and every model, so that ``--device cpu --tiny`` checks the whole script on a CPU machine
(tests/test_bench_workloads.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bare_loop import resident_round, stacked_round  # noqa: E402
from bench.batched import SHAPES, SyntheticBlock, compare  # noqa: E402
from fedrun.api import run as fedrun_run  # noqa: E402
from fedrun.models import build_model  # noqa: E402
from fedrun.runtime.flat import FlatLayout, broadcast_from_root, reduce_to_root  # noqa: E402
from fedrun.runtime.world import World, deterministic_cuda  # noqa: E402
from fedrun.training.flat_model import FlatModel  # noqa: E402
from fedrun.training.gradients import batched_loss_fn, written_out_gradient  # noqa: E402
from fedrun.training.losses import cross_entropy, half_squared_error  # noqa: E402

# the models of the ``local`` part: W1's ResNet-18, the FedSUM paper's CNNs, the LEAF models
LOCAL_MODELS = (
    "resnet18",
    "cnn_mnist",
    "cnn_svhn",
    "cnn_cifar10",
    "cnn_femnist",
    "lstm_shakespeare_unrolled",
)
# the models of the ``batched`` part (part 4): one a line, add a model once its batched block is exact
BATCHED_MODELS = (
    "cnn_femnist",
    "lstm_shakespeare_unrolled",
    "cnn_cifar10",
    "cnn_svhn",
    "cnn_mnist",  # dropout: each client's masks from CUDA's dropout kernel on its own stream
    "resnet18",  # GroupNorm; the block's convolutions as batched matrix products: its CUDA exactness is checked here
)
STRATEGIES = ("sequential", "channels_last", "vmap", "batched")
COHORT, STEPS, BATCH = 50, 5, 10  # W1's cohort and local steps


@dataclass(frozen=True)
class Sizes:
    """How much every part does: the full check on a GPU, or ``--tiny`` on a CPU."""

    cohort: int  # clients of the ``local`` part's cohort
    steps: int
    batch: int
    reps: int  # timed turns (after a warm-up when more than one)
    strategies: tuple[str, ...]  # the fedrun strategies the ``local`` and ``w1`` parts time
    chunk_clients: int  # the ``batched`` part's clients
    w1_model: str
    w1_clients: int
    w1_cohort: int
    w1_rounds: int
    quickstart_rounds: int
    quickstart: tuple[str, ...]  # overrides of the quickstart's config


# sized for under 8 minutes on one H200 from the figures (W1-ResNet-18 sequential 4.3 s a round, the
# bare loop 3.0): the ``batched`` part takes 64 clients as the hand-run did
FULL = Sizes(cohort=COHORT, steps=STEPS, batch=BATCH, reps=2, strategies=STRATEGIES, chunk_clients=64,
             w1_model="resnet18", w1_clients=1000, w1_cohort=COHORT, w1_rounds=5, quickstart_rounds=10,
             quickstart=())
# a CPU pads every batched call to 16-64 clients of up to 11M parameters: minutes for --tiny's 2 clients, so
# there only the ``batched`` part runs that strategy (on every model of its list); and a CPU round of an 11M
# parameter model costs seconds outside local training, so --tiny's W1 takes the FedSUM CIFAR-10 CNN
TINY = Sizes(cohort=2, steps=1, batch=2, reps=1, strategies=tuple(s for s in STRATEGIES if s != "batched"),
             chunk_clients=3, w1_model="cnn_cifar10", w1_clients=6, w1_cohort=2, w1_rounds=4, quickstart_rounds=4,
             quickstart=("local.steps=1", "participation.clients_per_round=4"))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def table(rows: list[dict]) -> str:
    """The rows as a markdown table, one column per key of the first row."""
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(row.get(k, "")) for k in header) + " |" for row in rows]
    return "\n".join(lines)


def steady_s_per_round(records: list[dict]) -> float:
    """Median wall seconds of rounds 3..end without an evaluation (a run evaluates after its last round), or of
    every round when that leaves none (``--tiny``)."""
    walls = [r["wall_s"] for r in records[2:] if not any(k.startswith("test_") for k in r)]
    return statistics.median(walls or [r["wall_s"] for r in records])


def rounded(row: dict) -> dict:
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}


def collectives(device: torch.device, sizes: Sizes) -> list[dict]:
    """fedrun's reduce/broadcast on a one-rank group (NCCL on a GPU, gloo on a CPU), d = ResNet-18's."""
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
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
        synchronize(device)
        return [{"backend": backend, "floats": layout.numel, "reduce + broadcast s": time.perf_counter() - start,
                 "unchanged": bool(torch.equal(buf, want))}]
    finally:
        dist.destroy_process_group()


def timed(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    """Median seconds of ``fn`` over ``reps`` calls, after a warm-up when ``reps`` > 1."""
    if reps > 1:
        fn()
        synchronize(device)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def local_training(device: torch.device, sizes: Sizes) -> list[dict]:
    """One cohort's local training per model: each fedrun strategy, the bare loop and the stacked floor."""
    out = []
    for name in LOCAL_MODELS:
        out.append(rounded(local_row(name, device, sizes)))
        print(f"local {out[-1]}", flush=True)
    return out


def local_row(name: str, device: torch.device, sizes: Sizes) -> dict:
    """Model ``name``'s row of the ``local`` part (a strategy that does not apply to it says why)."""
    block = SyntheticBlock(name, sizes.cohort, sizes.steps * sizes.batch, sizes.steps, sizes.batch, torch.float32,
                           device)
    shape, classes = SHAPES[name]
    torch.manual_seed(0)
    module = build_model(name, shape, classes).to(device)
    rows = list(range(sizes.cohort))
    bare = timed(lambda: resident_round(module, block.x, block.y, block.index, 0.05), device, sizes.reps)
    row: dict = {"model": name, "d": block.model.dim, "clients": sizes.cohort, "bare loop s": bare}
    try:
        stacked = timed(lambda: stacked_round(module, block.x, block.y, block.index, 0.05), device, sizes.reps)
        row["stacked / bare"] = stacked / bare
    except (RuntimeError, NotImplementedError) as exc:  # a model torch.func cannot stack
        row["stacked / bare"] = f"n/a ({str(exc).splitlines()[0][:60]})"
    for strategy in sizes.strategies:
        try:
            row[f"{strategy} / bare"] = timed(lambda s=strategy: block.train(s, rows), device, sizes.reps) / bare
        except (RuntimeError, NotImplementedError, ValueError) as exc:  # not for this model
            row[f"{strategy} / bare"] = f"n/a ({str(exc).splitlines()[0][:60]})"
    return row


def batched_blocks(device: torch.device, sizes: Sizes) -> list[dict]:
    """Part 4: the batched block's speed over sequential and its chunk-position invariance."""
    out = []
    for name in BATCHED_MODELS:
        row = compare(name, sizes.chunk_clients, sizes.steps, sizes.batch, sizes.reps, device)
        out.append(rounded({k: row[k] for k in ("model", "dim", "clients", "sequential_s", "batched_s",
                                                "sequential_over_batched", "auto", "exact")}))
        print(f"batched {out[-1]}", flush=True)
    return out


def written_out(device: torch.device, sizes: Sizes) -> list[dict]:
    """Part 5: the linear models' written-out gradient against autograd's on this device, bit for bit."""
    out = []
    clients, slots, features = 64, 50, 32
    for name, loss in (("logistic", cross_entropy), ("linear", half_squared_error)):
        torch.manual_seed(0)
        model = FlatModel(build_model(name, (features,), 10).to(device))
        data = torch.randn(clients * slots, features, device=device)
        targets = (torch.randint(0, 10, (clients * slots,), device=device) if name == "logistic"
                   else torch.randn(clients * slots, device=device))
        index = torch.randperm(clients * slots, device=device).view(clients, slots)
        mask = torch.ones(clients, slots, dtype=torch.bool, device=device)
        mask[3, 17:], mask[5] = False, False
        x = model.initial_vector(torch.float32, device) + 0.3 * torch.randn(clients, model.dim, device=device)
        params = model.batched_params(x)
        grads, losses = written_out_gradient(model, loss)(params, data[index], targets[index], mask)
        with torch.enable_grad():
            leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
            reference = batched_loss_fn(model, loss, model.module)(leaves, data[index], targets[index], mask, [])
            expected = torch.autograd.grad(reference.sum(), list(leaves.values()))
        same = torch.equal(losses, reference.detach()) and all(
            torch.equal(grads[k], g) for k, g in zip(leaves, expected, strict=True))
        worst = max(float((grads[k] - g).abs().max()) for k, g in zip(leaves, expected, strict=True))
        out.append({"model": name, "clients x examples": f"{clients} x {slots}", "same bits as autograd": same,
                    "max abs difference": worst})
        print(f"written_out {out[-1]}", flush=True)
    return out


def w1(device: torch.device, sizes: Sizes) -> list[dict]:
    """W1 on ResNet-18, one rank: each strategy and auto, beside the bare loop and the stacked floor."""
    base = {"run": {"rounds": sizes.w1_rounds, "device": device.type, "seed": 1},
            "data": {"name": "synthetic", "num_clients": sizes.w1_clients, "partition": "iid",
                     "synthetic": {"shape": [3, 32, 32], "examples_per_client": sizes.steps * sizes.batch}},
            "model": {"name": sizes.w1_model},
            "local": {"steps": sizes.steps, "batch_size": sizes.batch, "lr": 0.05},
            "participation": {"pattern": "uniform", "clients_per_round": sizes.w1_cohort},
            "eval": {"every": 0}}
    world = World(rank=0, size=1, local_rank=0, device=device, backend="none")
    floors = w1_floors(device, sizes)
    out = []
    for strategy in (*sizes.strategies, "auto"):
        cfg = {**base, "local": {**base["local"], "strategy": strategy}}
        result = fedrun_run(cfg, world=world, write_files=False)
        median = steady_s_per_round(result.metrics)
        out.append(rounded({"model": sizes.w1_model, "strategy": strategy, "median s/round": median,
                            "/ bare": median / floors["bare loop"], "/ stacked": median / floors["stacked vmap"]}))
        print(f"W1 {out[-1]}", flush=True)
    out += [rounded({"model": sizes.w1_model, "strategy": name, "median s/round": s, "/ bare": s / floors["bare loop"],
                     "/ stacked": s / floors["stacked vmap"]}) for name, s in floors.items()]
    return out


def w1_floors(device: torch.device, sizes: Sizes) -> dict[str, float]:
    """The bare loop's and the stacked floor's median s/round on W1's sizes: a new random cohort every round,
    each client's examples in stored order, all resident on the device."""
    examples = sizes.steps * sizes.batch
    count = sizes.w1_clients * examples
    x = torch.randn(count, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (count,), device=device)
    offsets = torch.arange(examples, device=device).view(sizes.steps, sizes.batch)
    out = {}
    for name, round_fn in (("bare loop", resident_round), ("stacked vmap", stacked_round)):
        torch.manual_seed(1)
        module = build_model(sizes.w1_model, (3, 32, 32), 10).to(device)
        walls = []
        for _ in range(sizes.w1_rounds):
            cohort = torch.randperm(sizes.w1_clients)[:sizes.w1_cohort].sort().values.to(device)
            start = time.perf_counter()
            round_fn(module, x, y, cohort[:, None, None] * examples + offsets, 0.05)
            synchronize(device)
            walls.append(time.perf_counter() - start)
        out[name] = statistics.median(walls[min(2, sizes.w1_rounds - 1):])
    return out


def quickstart(out_dir: Path, device: str, ranks: int, rounds: int, extra: list[str]) -> dict:
    """The README's quickstart through torchrun on ``ranks`` ranks of ``device``: its median s/round (rounds
    3..end but the last, which evaluates), the strategy it ran and its final model."""
    import h5py

    run_dir = Path(tempfile.mkdtemp(prefix=f"quickstart_{device}_{ranks}_", dir=out_dir))
    run_dir.rmdir()  # fedrun makes it: a fresh run
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", "-m",
           "fedrun", "train", "--quiet", "--config", str(REPO / "configs" / "quickstart.yaml"),
           f"run.device={device}", f"run.rounds={rounds}", f"checkpoint.every={rounds}", "eval.every=0",
           f"run.dir={run_dir}", *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        said = [line for line in (proc.stderr + proc.stdout).splitlines() if line.startswith("fedrun")]
        raise RuntimeError(f"quickstart on {ranks} {device} rank(s) failed ({proc.returncode}): "
                           f"{' / '.join(said) or proc.stderr[-2000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    runtime = json.loads((run_dir / "runtime.json").read_text())
    with h5py.File(max(run_dir.glob("ckpt_*.h5"), key=lambda p: int(p.stem.split("_")[1])), "r") as f:
        x = f["server/x"][...]
    return {"s_per_round": steady_s_per_round(records), "strategy": runtime["local_strategy"],
            "collectives": (runtime.get("network") or {}).get("collectives", "one rank"), "x": x}


def ranks_on_one_device(device: torch.device, sizes: Sizes) -> list[dict]:
    """The quickstart on 1 and 2 ranks of the device (the same strategy; the same bits asked) and on 2 CPU
    ranks."""
    rounds = sizes.quickstart_rounds
    with tempfile.TemporaryDirectory() as tmp:
        one = quickstart(Path(tmp), device.type, 1, rounds, [*sizes.quickstart])
        forced = [*sizes.quickstart, f"local.strategy={one['strategy']}"]  # auto may time strategies: take one's
        two = quickstart(Path(tmp), device.type, 2, rounds, forced)
        cpu = quickstart(Path(tmp), "cpu", 2, rounds, [*sizes.quickstart])
    rows = [{"run": f"quickstart, 1 rank on {device.type}", **one},
            {"run": f"quickstart, 2 ranks on one {device.type}", **two},
            {"run": "quickstart, 2 CPU ranks", **cpu}]
    same = bool((one["x"] == two["x"]).all())
    out = [rounded({"run": r["run"], "strategy": r["strategy"], "collectives": r["collectives"],
                    "median s/round": r["s_per_round"], "2 CPU ranks / this": cpu["s_per_round"] / r["s_per_round"],
                    "same bits as 1 rank": same if "2 ranks on one" in r["run"] else ""}) for r in rows]
    for row in out:
        print(f"ranks {row}", flush=True)
    return out


PARTS: dict[str, Callable[[torch.device, Sizes], list[dict]]] = {
    "collectives": collectives, "local": local_training, "batched": batched_blocks, "written_out": written_out,
    "w1": w1, "ranks": ranks_on_one_device}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/gpu")
    p.add_argument("--tiny", action="store_true", help="tiny sizes, every part and model: to check on a CPU")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS), help="a rerun of some parts")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("bench/gpu.py: --device cuda but torch sees no CUDA device")
    if device.type == "cpu":
        torch.set_num_threads(1)
    else:
        deterministic_cuda()  # as a run on the GPU (fedrun.runtime.world)
    sizes = TINY if args.tiny else FULL
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    report: dict = {"date": datetime.date.today().isoformat(), "device": name, "torch": torch.__version__,
                    "sizes": "tiny" if args.tiny else "full", "seconds": {}}
    print(f"bench/gpu.py on {name}, torch {torch.__version__}", flush=True)
    command = " ".join(["python3 bench/gpu.py", *sys.argv[1:]])
    md = [f"## {report['date']}, GPU check on {name} (torch {report['torch']}, `{command}`)"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for part in args.parts:
        start = time.perf_counter()
        report[part] = PARTS[part](device, sizes)
        report["seconds"][part] = round(time.perf_counter() - start, 1)
        md += ["", f"{part} ({report['seconds'][part]} s):", "", table(report[part])]
        print("\n" + "\n".join(md[-3:]), flush=True)
        (out / "gpu.json").write_text(json.dumps(report, indent=1) + "\n")  # what a part that fails later leaves
        (out / "gpu.md").write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
