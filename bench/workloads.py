"""The benchmark workloads W1 and W2 (bench/README.md, "Workloads"): data, hyperparameters, cohort schedule.

Every system in the comparison (bare loop, fedrun, Flower, pfl) reads its data from here, so all of
them train on the same arrays, the same model and the same clients in each round.

Data. Class-conditional Gaussians from a fixed numpy seed: each class ``c`` has a mean ``mu_c`` and an
example of class ``c`` is ``mu_c + noise_std * N(0, I)``. For W1 the means are smooth images (a 3x8x8
Gaussian pattern upsampled to 3x32x32) so that a CNN has spatial structure to learn; for W2 they are
32-dimensional vectors. Clients: 1000 x 50 examples. Under the ``dirichlet`` partition client ``k`` draws
its label proportions ``p_k ~ Dir(alpha=0.3)`` and its 50 labels from ``p_k``; under ``iid`` the labels are
uniform. Examples are then generated for those labels, so every client holds exactly 50 examples.
The held-out test set is 1000 examples with uniform labels (from the same class means).

Local training order: a client's batches are its examples in stored order (no shuffling), so that every
system does the same arithmetic: W1 is 5 batches of 10, W2 is one batch of 50.

This module imports numpy only (plus ``fedrun.models`` lazily in :func:`make_model`), so a peer's
virtual environment can import it by putting the repository root on ``sys.path``.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

CACHE_DIR = Path(os.environ.get("FEDRUN_BENCH_CACHE", Path(__file__).resolve().parent / ".cache"))
DATA_SEED = 20261130  # the fixed numpy seed of the data generator
SCHEDULE_SEED = 12345  # the fixed seed of the cohort schedule
PARTITIONS = ("dirichlet", "iid")
CACHE_VERSION = 1  # bump when the generator changes, so stale caches are not read


@dataclass(frozen=True)
class Workload:
    """Hyperparameters of one workload (identical for every system)."""

    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    model: str  # "cifar10_cnn" or "logistic"
    num_clients: int = 1000
    examples_per_client: int = 50
    test_size: int = 1000
    cohort: int = 50
    local_epochs: int = 1
    local_batch: int = 10
    local_lr: float = 0.1
    server_lr: float = 1.0
    rounds: int = 30
    eval_every: int = 10
    dirichlet_alpha: float = 0.3
    mean_scale: float = 1.0  # std of the class means' entries
    noise_std: float = 1.0  # std of the per-example noise

    @property
    def local_steps(self) -> int:
        """SGD steps per client per round (1 epoch of ``examples_per_client`` in batches)."""
        per_epoch = -(-self.examples_per_client // self.local_batch)
        return self.local_epochs * per_epoch

    def as_dict(self) -> dict:
        d = asdict(self)
        d["local_steps"] = self.local_steps
        return d


WORKLOADS: dict[str, Workload] = {
    # W1: cross-device CNN, pfl-research Table 1 protocol scaled to 2 cores.
    "W1": Workload(
        name="W1", input_shape=(3, 32, 32), num_classes=10, model="cifar10_cnn",
        cohort=50, local_batch=10, local_lr=0.1, server_lr=1.0, rounds=30, eval_every=10,
        mean_scale=0.35, noise_std=1.0,
    ),
    # W2: overhead-bound logistic regression; 1 local step of batch 50.
    "W2": Workload(
        name="W2", input_shape=(32,), num_classes=10, model="logistic",
        cohort=100, local_batch=50, local_lr=0.1, server_lr=1.0, rounds=50, eval_every=10,
        mean_scale=0.5, noise_std=1.0,
    ),
}


def get_workload(name: str, **overrides) -> Workload:
    """The named workload, with optional overrides (e.g. ``rounds=3`` for a smoke run)."""
    try:
        wl = WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; expected one of {sorted(WORKLOADS)}") from None
    if overrides:
        wl = Workload(**{**asdict(wl), **overrides})
    return wl


# ------------------------------------------------------------------------------------------- generator


def _class_means(wl: Workload, rng: np.random.Generator) -> np.ndarray:
    if len(wl.input_shape) == 3:
        c, h, w = wl.input_shape
        low = rng.standard_normal((wl.num_classes, c, h // 4, w // 4))
        means = low.repeat(4, axis=2).repeat(4, axis=3)  # smooth 4x4 blocks
    else:
        means = rng.standard_normal((wl.num_classes, *wl.input_shape))
    return (wl.mean_scale * means).astype(np.float32)


def _examples(wl: Workload, means: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal((len(y), *wl.input_shape), dtype=np.float32)
    x *= np.float32(wl.noise_std)
    x += means[y]
    return x


def generate(wl: Workload, partition: str = "dirichlet", seed: int = DATA_SEED) -> dict[str, np.ndarray]:
    """Generate the workload's arrays (no caching). Deterministic in (workload, partition, seed).

    Returns ``x_train`` [num_clients * examples_per_client, *input_shape] float32 (client ``k`` owns rows
    ``k*E:(k+1)*E``), ``y_train`` int64, ``x_test``, ``y_test``.
    """
    if partition not in PARTITIONS:
        raise ValueError(f"unknown partition {partition!r}; expected one of {PARTITIONS}")
    rng = np.random.default_rng(seed)
    means = _class_means(wl, rng)  # shared by both partitions and by the test set
    rng_test = np.random.default_rng([seed, 1])
    y_test = rng_test.integers(0, wl.num_classes, size=wl.test_size)
    x_test = _examples(wl, means, y_test, rng_test)

    rng_part = np.random.default_rng([seed, 2 if partition == "dirichlet" else 3])
    n, e = wl.num_clients, wl.examples_per_client
    if partition == "dirichlet":
        props = rng_part.dirichlet(np.full(wl.num_classes, wl.dirichlet_alpha), size=n)
        # inverse-CDF sampling of e labels per client from its own proportions
        cdf = np.cumsum(props, axis=1)
        cdf[:, -1] = 1.0
        u = rng_part.random((n, e))
        y_train = np.stack([np.searchsorted(cdf[k], u[k], side="right") for k in range(n)])
    else:
        y_train = rng_part.integers(0, wl.num_classes, size=(n, e))
    y_train = y_train.reshape(-1).astype(np.int64)
    x_train = _examples(wl, means, y_train, rng_part)
    return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test.astype(np.int64)}


def _cache_paths(wl: Workload, partition: str, seed: int, cache_dir: Path) -> dict[str, Path]:
    # every field the generator reads is in the name, so a changed workload never reads a stale cache
    data_fields = (wl.input_shape, wl.num_classes, wl.dirichlet_alpha, wl.mean_scale, wl.noise_std)
    digest = hashlib.sha1(repr(data_fields).encode()).hexdigest()[:8]
    tag = (f"{wl.name}_{partition}_s{seed}_n{wl.num_clients}x{wl.examples_per_client}"
           f"_t{wl.test_size}_{digest}_v{CACHE_VERSION}")
    return {k: cache_dir / f"{tag}_{k}.npy" for k in ("x_train", "y_train", "x_test", "y_test")}


def load_arrays(
    wl: Workload | str,
    partition: str = "dirichlet",
    seed: int = DATA_SEED,
    cache_dir: Path | str | None = None,
    mmap: bool = True,
) -> dict[str, np.ndarray]:
    """The workload's arrays, generated once and cached as .npy under ``bench/.cache/``.

    Several processes may call this at once (Ray actors, MPI ranks): each file is written to a
    process-unique temporary name and renamed into place, so a reader never sees a partial file.
    """
    wl = get_workload(wl) if isinstance(wl, str) else wl
    cache = Path(cache_dir) if cache_dir is not None else CACHE_DIR
    paths = _cache_paths(wl, partition, seed, cache)
    if not all(p.exists() for p in paths.values()):
        cache.mkdir(parents=True, exist_ok=True)
        arrays = generate(wl, partition, seed)
        for key, path in paths.items():
            tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npy")
            np.save(tmp, arrays[key])
            os.replace(tmp, path)
    return {k: np.load(p, mmap_mode="r" if mmap else None) for k, p in paths.items()}


def client_data(
    wl: Workload | str, partition: str = "dirichlet", seed: int = DATA_SEED, cache_dir=None
) -> tuple[list[tuple[np.ndarray, np.ndarray]], tuple[np.ndarray, np.ndarray]]:
    """Per-client ``[(x_k, y_k)]`` (views into the cached arrays) and the test set ``(x, y)``."""
    wl = get_workload(wl) if isinstance(wl, str) else wl
    a = load_arrays(wl, partition, seed, cache_dir)
    e = wl.examples_per_client
    clients = [(a["x_train"][k * e:(k + 1) * e], a["y_train"][k * e:(k + 1) * e])
               for k in range(wl.num_clients)]
    return clients, (a["x_test"], a["y_test"])


# ------------------------------------------------------------------------------------ cohort schedule


def cohort_schedule(wl: Workload | str, seed: int = SCHEDULE_SEED, rounds: int | None = None) -> np.ndarray:
    """Client ids per round, [rounds, cohort] int64: uniform sampling without replacement per round.

    Row ``r`` (0-based) is the cohort of round ``r + 1``; ids are sorted within a round so that every
    system sums the client deltas in the same order. Row ``r`` does not depend on ``rounds``.
    """
    wl = get_workload(wl) if isinstance(wl, str) else wl
    rounds = wl.rounds if rounds is None else rounds
    rng = np.random.default_rng([seed, wl.num_clients, wl.cohort])
    rows = [np.sort(rng.choice(wl.num_clients, size=wl.cohort, replace=False)) for _ in range(rounds)]
    return np.asarray(rows, dtype=np.int64).reshape(rounds, wl.cohort)


# ------------------------------------------------------------------------------------------------ model


def make_model(wl: Workload | str):
    """The workload's torch model (fedrun.models; imports torch only). Seed torch before calling."""
    import sys

    root = str(Path(__file__).resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    from fedrun.models.cnn import cifar10_cnn
    from fedrun.models.linear import Logistic

    wl = get_workload(wl) if isinstance(wl, str) else wl
    if wl.model == "cifar10_cnn":
        return cifar10_cnn(in_channels=wl.input_shape[0], num_classes=wl.num_classes)
    if wl.model == "logistic":
        return Logistic(int(np.prod(wl.input_shape)), wl.num_classes)
    raise ValueError(f"unknown model {wl.model!r}")


MODEL_SEED = 0  # torch.manual_seed before make_model: every system starts from the same weights
