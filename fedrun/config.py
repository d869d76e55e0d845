"""Typed run configuration: a dataclass tree loaded from YAML plus dotted overrides.

Every field has a type and a default; loading checks types, rejects unknown keys and runs each
section's ``check`` so that a bad value fails before any rank starts training, with one line that
names the field (``local.lr: expected a number > 0, got -1``).

The ``algorithm`` section is open-ended: ``name`` selects an algorithm (a registered name or a plugin's
``package.module:Class``) and the remaining keys are validated against that algorithm's own ``Hparams``
dataclass (see ``fedrun.algorithms``). The algorithm is resolved only then, inside
:func:`config_from_dict`: importing this module imports neither torch nor any algorithm.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from fedrun.config_yaml import MAX_BYTES, YAMLError, parse_yaml
from fedrun.errors import ConfigError, brief, require, require_path
from fedrun.plugins import digests, is_import_path, load
from fedrun.privacy.config import PrivacyConfig

__all__ = ["Config", "apply_override", "apply_overrides", "build_dataclass", "config_from_dict", "load_config",
           "repeated_settings"]

# Bounds of the integer and time settings (docs/reliability.md lists them): beyond them a value is a typo,
# and would overflow an int64 array, a timedelta or the memory instead of running.
MAX_INT = 2**63 - 1  # every integer setting: it must fit the int64 arrays it ends up in
MAX_STEPS = 1_000_000  # local.steps, local.epochs: the per-round minibatch index arrays are [C, K, b]
MAX_BATCH = 2**31 - 1  # local.batch_size, eval.batch_size
MAX_THREADS = 4096  # run.threads (and at most the CPUs this process may use, checked where the run starts)
MIN_TIMEOUT_S, MAX_TIMEOUT_S = 1.0, 7 * 86400.0  # run.timeout_s: a rendezvous needs about a second; a week


# --------------------------------------------------------------------------------------------- sections


@dataclass
class RunConfig:
    name: str = "run"  # the run's name: fills "{name}" in run.dir, names the MLflow run
    dir: str = "runs/{name}"  # run directory; "{name}" and "{seed}" are filled in
    seed: int = 0  # every random stream (data, partition, model init, participation) derives from it
    rounds: int = 100  # T, the rounds to run (asynchrony: server steps)
    dtype: Literal["float32", "float64"] = "float32"  # of the model, client state and communication
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: one GPU per rank when there are GPUs, else CPU
    threads: int = 1  # torch intra-op threads per rank
    timeout_s: float = 120.0  # collective / rendezvous timeout: a missing peer is an error after this
    log_every: int = 1  # progress line every this many rounds (rank 0)
    # drop a client's non-finite (NaN/Inf) upload from its round instead of stopping the run
    skip_nonfinite_clients: bool = False
    # which rank trains which client: "blocks" (each rank its contiguous block, the owner of its state),
    # "work" (each round's participants split by work; algorithms without per-client state only, every
    # rank holds all clients' data), "auto" (work when that applies on CPU with > 1 rank, else blocks)
    placement: Literal["auto", "blocks", "work"] = "auto"

    def check(self) -> None:
        require(self.rounds >= 1, "run.rounds", "an integer >= 1", self.rounds)
        require(1 <= self.threads <= MAX_THREADS, "run.threads", f"an integer in [1, {MAX_THREADS}]", self.threads)
        require(MIN_TIMEOUT_S <= self.timeout_s <= MAX_TIMEOUT_S, "run.timeout_s",
                f"a number of seconds in [{MIN_TIMEOUT_S:g}, {MAX_TIMEOUT_S:g}]", self.timeout_s)
        require(self.log_every >= 1, "run.log_every", "an integer >= 1", self.log_every)
        require(self.seed >= 0, "run.seed", "an integer >= 0", self.seed)
        require(self.dir.strip() != "", "run.dir", "a directory path (empty would write into the current "
                "directory)", self.dir)
        try:
            self.dir.format(name=self.name, seed=self.seed)
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(f"run.dir: expected a path with only {{name}} and {{seed}} filled in, got "
                              f"{brief(self.dir)} ({type(exc).__name__}: {brief(str(exc))})") from None


@dataclass
class SyntheticConfig:
    """Class-conditional Gaussian images or features (bench/README.md, W1/W2), generated from the run seed."""

    shape: list[int] = field(default_factory=lambda: [3, 32, 32])  # [C, H, W] or [features]
    num_classes: int = 10  # classes of the generated labels
    examples_per_client: int = 50  # training examples of every client
    test_examples: int = 1000  # examples of the global test set
    noise: float = 1.0  # std of the Gaussian around each class mean

    def check(self) -> None:
        require(len(self.shape) in (1, 3) and all(s >= 1 for s in self.shape), "data.synthetic.shape",
                 "[features] or [channels, height, width] of positive integers", self.shape)
        require(self.num_classes >= 2, "data.synthetic.num_classes", "an integer >= 2", self.num_classes)
        require(self.examples_per_client >= 1, "data.synthetic.examples_per_client", "an integer >= 1",
                 self.examples_per_client)
        require(self.test_examples >= 1, "data.synthetic.test_examples", "an integer >= 1",
                 self.test_examples)
        require(self.noise > 0, "data.synthetic.noise", "a number > 0", self.noise)


@dataclass
class LeastSquaresConfig:
    """f_i(x) = 1/(2 m) ||A_i x - b_i||^2, generated from the seed or loaded from a .npz (A, b, x0)."""

    file: str | None = None  # .npz with A [N, m, d], b [N, m], optional x0 [d]
    rows_per_client: int = 8  # m
    dim: int = 5  # d
    heterogeneity: float = 1.0  # scale of the per-client shift of b_i (0: every client has the same x*)
    noise: float = 0.1  # std of the Gaussian noise added to b_i

    def check(self) -> None:
        require(self.rows_per_client >= 1, "data.least_squares.rows_per_client", "an integer >= 1",
                 self.rows_per_client)
        require(self.dim >= 1, "data.least_squares.dim", "an integer >= 1", self.dim)
        require(self.heterogeneity >= 0, "data.least_squares.heterogeneity", "a number >= 0",
                 self.heterogeneity)
        require(self.noise >= 0, "data.least_squares.noise", "a number >= 0", self.noise)


@dataclass
class SyntheticFedproxConfig:
    """Synthetic(alpha, beta) of the FedProx paper, generated per client on demand (docs/datasets.md)."""

    alpha: float = 1.0  # std of u_k, the mean of client k's model W_k, b_k
    beta: float = 1.0  # std of B_k, the mean of client k's input mean v_k
    dim: int = 60  # input dimension of x (the paper's 60)
    classes: int = 10  # number of classes of y = argmax softmax(W_k x + b_k)
    max_examples: int = 5000  # client sizes 50 + floor(LogNormal(4, 2)) are clipped at this many
    test_fraction: float = 0.2  # client k also has max(1, round(test_fraction * n_k)) test examples
    test_clients: int = 1000  # the pooled test set: the test examples of a seeded sample of this many clients

    def check(self) -> None:
        require(self.alpha >= 0, "data.synthetic_fedprox.alpha", "a number >= 0", self.alpha)
        require(self.beta >= 0, "data.synthetic_fedprox.beta", "a number >= 0", self.beta)
        require(self.dim >= 1, "data.synthetic_fedprox.dim", "an integer >= 1", self.dim)
        require(self.classes >= 2, "data.synthetic_fedprox.classes", "an integer >= 2", self.classes)
        require(self.max_examples >= 50, "data.synthetic_fedprox.max_examples", "an integer >= 50",
                self.max_examples)
        require(0 < self.test_fraction < 1, "data.synthetic_fedprox.test_fraction", "a number in (0, 1)",
                self.test_fraction)
        require(self.test_clients >= 1, "data.synthetic_fedprox.test_clients", "an integer >= 1", self.test_clients)


@dataclass
class FederatedH5Config:
    """TensorFlow Federated's simulation HDF5 layout: ``examples/<client_id>/<feature>`` (docs/datasets.md)."""

    train: str | None = None  # the train file
    test: str | None = None  # the test file (same client ids)
    feature: str = "pixels"  # the input dataset of every client group
    label: str = "label"  # the label dataset of every client group
    test_clients: int = 1000  # the pooled test set: the test examples of a seeded sample of this many clients

    def check(self) -> None:
        require(self.test_clients >= 1, "data.federated_h5.test_clients", "an integer >= 1", self.test_clients)


@dataclass
class DataConfig:
    name: str = "mnist5k"  # the dataset: a name of `fedrun list` or package.module:loader
    root: str | None = None  # local data root for on-disk datasets
    num_clients: int = 100  # N, the simulated clients
    partition: str = "dirichlet"  # how examples become clients: iid, dirichlet, natural, shards, size_skew
    alpha: float = 0.3  # Dirichlet concentration over labels
    shards_per_client: int = 2  # shards: label-sorted shards per client (McMahan et al. 2017 use 2)
    size_sigma: float = 1.0  # size_skew: std of the log of the client sizes (lognormal); 0: equal sizes
    test_fraction: float = 0.2  # held-out share for datasets without a test split
    # per-client test data (docs/evaluation.md): each client's held-out share of its examples, split
    # before training (seeded by seed and client id); LEAF data with its own per-user test split uses
    # that split instead. 0 (default): no per-client test data, no per-client evaluation
    client_test_fraction: float = 0.0
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    least_squares: LeastSquaresConfig = field(default_factory=LeastSquaresConfig)
    synthetic_fedprox: SyntheticFedproxConfig = field(default_factory=SyntheticFedproxConfig)
    federated_h5: FederatedH5Config = field(default_factory=FederatedH5Config)

    def check(self) -> None:
        require(self.num_clients >= 1, "data.num_clients", "an integer >= 1", self.num_clients)
        require(self.alpha > 0, "data.alpha", "a number > 0", self.alpha)
        require(self.shards_per_client >= 1, "data.shards_per_client", "an integer >= 1",
                self.shards_per_client)
        require(self.size_sigma >= 0, "data.size_sigma", "a number >= 0", self.size_sigma)
        require(0 < self.test_fraction < 1, "data.test_fraction", "a number in (0, 1)", self.test_fraction)
        require(0 <= self.client_test_fraction < 1, "data.client_test_fraction",
                "a number in [0, 1) (0: no per-client evaluation)", self.client_test_fraction)


@dataclass
class ModelConfig:
    name: str = "cnn_mnist"  # the model: a name of `fedrun list` or package.module:factory
    # a plugin's own settings: its ``Settings`` dataclass, built from the section's other keys
    settings: Any = field(default=None, init=False)


@dataclass
class LocalConfig:
    """The local solver every client runs (docs/algorithms.md) and its optimizer extras."""

    steps: int = 10  # K local steps per round
    epochs: int | None = None  # if set, K_i = epochs * ceil(n_i / batch_size) (FedAdamom's local_ep)
    batch_size: int = 32  # minibatch size of a local step
    lr: float = 0.05  # eta_l, or eta_0 of a schedule
    # eta_l over the rounds: constant, inv_sqrt eta_0 / sqrt(t + 1), exponential eta_0 lr_decay^t
    lr_schedule: Literal["constant", "inv_sqrt", "exponential"] = "constant"
    lr_decay: float = 0.998  # per-round factor of the exponential schedule
    weight_decay: float = 0.0  # L2 penalty added to every local gradient
    grad_clip: float = 0.0  # clip each raw gradient to this L2 norm; 0 disables
    momentum: float = 0.0  # local heavy-ball momentum, reset every round
    # how a rank trains its clients: auto (the fastest exact strategy of the model on the device: batched or
    # channels_last or sequential; the same bits on any number of ranks), fastest (time the applicable ones at
    # start-up, keep the fastest), sequential, channels_last (CNNs), vmap (the cohort as one batched call),
    # batched (fixed-size padded chunks of clients, one vmapped call each: exact)
    strategy: Literal["auto", "fastest", "sequential", "channels_last", "vmap", "batched"] = "auto"
    shuffle: bool = True  # False: every epoch visits a client's examples in stored order (benchmarks)

    def check(self) -> None:
        require(1 <= self.steps <= MAX_STEPS, "local.steps", f"an integer in [1, {MAX_STEPS}]", self.steps)
        require(self.epochs is None or 1 <= self.epochs <= MAX_STEPS, "local.epochs",
                f"null or an integer in [1, {MAX_STEPS}]", self.epochs)
        require(1 <= self.batch_size <= MAX_BATCH, "local.batch_size", f"an integer in [1, {MAX_BATCH}]",
                self.batch_size)
        require(self.lr >= 0, "local.lr", "a number >= 0", self.lr)
        require(0 < self.lr_decay <= 1, "local.lr_decay", "a number in (0, 1]", self.lr_decay)
        require(self.weight_decay >= 0, "local.weight_decay", "a number >= 0", self.weight_decay)
        require(self.grad_clip >= 0, "local.grad_clip", "a number >= 0 (0 disables)", self.grad_clip)
        require(0 <= self.momentum < 1, "local.momentum", "a number in [0, 1)", self.momentum)


@dataclass
class ParticipationConfig:
    """Which clients take part in each round (docs/participation.md)."""

    pattern: str = "uniform"  # who takes part when: a name of `fedrun list` or package.module:Class
    clients_per_round: int = 10  # S
    probability: float | None = None  # Bernoulli p for every client (default S / N)
    trace: str | None = None  # boolean [T, N] array (.npy or .csv) for pattern "trace"
    # per-client probabilities [N] (.npy or .csv): bernoulli p_i, sine base_i, markov stationary rate
    probability_file: str | None = None
    sine_amplitude: float = 0.3  # sine: p_i^t = base_i * (amplitude * sin(2 pi t / period) + offset)
    sine_offset: float = 0.7  # sine: see sine_amplitude
    sine_period: float = 10.0  # rounds
    cyclic_shuffle: bool = False  # cyclic: a fixed seeded permutation instead of the identity order
    markov_p_on: float | None = None  # markov off->on; default: stationary rate = probability or S/N
    markov_p_off: float = 0.5  # markov on->off
    markov_file: str | None = None  # markov: per-client [2, N] array (.npy): rows p_on, p_off
    # a plugin's own settings: its ``Settings`` dataclass, built from the section's other keys
    settings: Any = field(default=None, init=False)

    def check(self) -> None:
        require(self.clients_per_round >= 1, "participation.clients_per_round", "an integer >= 1",
                 self.clients_per_round)
        require(self.probability is None or 0 < self.probability <= 1, "participation.probability",
                 "null or a number in (0, 1]", self.probability)
        require(self.sine_offset >= abs(self.sine_amplitude), "participation.sine_offset",
                "a number >= |sine_amplitude| (probabilities must stay >= 0)", self.sine_offset)
        require(self.sine_period > 0, "participation.sine_period", "a number > 0", self.sine_period)
        require(self.markov_p_on is None or 0 < self.markov_p_on <= 1, "participation.markov_p_on",
                "null or a number in (0, 1]", self.markov_p_on)
        require(0 < self.markov_p_off <= 1, "participation.markov_p_off", "a number in (0, 1]",
                self.markov_p_off)


@dataclass
class EvalConfig:
    every: int = 10  # evaluate the global model on the test set every this many rounds (and at the end)
    batch_size: int = 1000  # test examples per forward pass
    # personalization (needs data.client_test_fraction > 0): also evaluate each client's model after this
    # many local steps from the global model on its own training data (0: global model only)
    finetune_steps: int = 0
    # per-client evaluation over a seeded sample of this many clients, the same at every evaluation
    # (null: every client)
    clients: int | None = None

    def check(self) -> None:
        require(self.clients is None or self.clients >= 1, "eval.clients", "null (every client) or an integer >= 1",
                self.clients)
        require(self.every >= 0, "eval.every", "an integer >= 0 (0: only at the end)", self.every)
        require(1 <= self.batch_size <= MAX_BATCH, "eval.batch_size", f"an integer in [1, {MAX_BATCH}]",
                self.batch_size)
        require(self.finetune_steps >= 0, "eval.finetune_steps", "an integer >= 0", self.finetune_steps)


@dataclass
class MetricsConfig:
    tensorboard: bool = False  # also write TensorBoard event files under <run.dir>/tensorboard
    # also log parameters, per-round metrics, per-client arrays and provenance to MLflow: true (MLFLOW_TRACKING_URI,
    # else sqlite under run.dir), a tracking URI, or a directory (sqlite in it); null/false: off (docs/evaluation.md)
    mlflow: bool | str | None = None
    mlflow_experiment: str = "fedrun"  # the MLflow experiment of the run (created when missing)


@dataclass
class CheckpointConfig:
    every: int = 0  # write a checkpoint every this many rounds (0: only at the end and on signals)
    keep: int = 3  # keep this many newest checkpoints to resume from (and the files they build on)
    # every K-th checkpoint is full, the others are increments holding the client rows changed since the one
    # before (docs/checkpoint.md); 1: always full; 0: auto = 1 on the memory store, 10 on the disk store
    full_every: int = 0

    def check(self) -> None:
        require(self.every >= 0, "checkpoint.every", "an integer >= 0", self.every)
        require(self.keep >= 1, "checkpoint.keep", "an integer >= 1", self.keep)
        require(self.full_every >= 0, "checkpoint.full_every", "an integer >= 0", self.full_every)


@dataclass
class StateConfig:
    """Where the per-client state lives (docs/scale.md): ``memory`` (tensors), ``disk`` (vector entries in
    sparse files under ``dir``: node-local scratch on a cluster; default the run directory) or ``auto``
    (memory while the state fits, else disk)."""

    store: Literal["auto", "memory", "disk"] = "auto"  # auto: memory while the state fits, else disk
    dir: str | None = None  # where the disk store's sparse files go (null: the run directory)


@dataclass
class AsyncConfig:
    """Buffered asynchronous server steps (FADAS/FedBuff; docs/algorithms/fadas_fedcada_fafed_async.md).
    When enabled, ``participation`` is not used: ``concurrency`` clients train at once, each with a
    simulated duration, and the server steps whenever ``buffer_size`` updates have arrived; ``run.rounds``
    counts server steps."""

    enabled: bool = False  # buffered asynchronous server steps instead of synchronous rounds
    buffer_size: int = 5  # M (FADAS update_freq)
    concurrency: int = 10  # C: clients in flight (FADAS: max(floor(frac N), 1))
    durations: Literal["classes", "constant"] = "classes"  # how long a client trains: speed classes, or constant
    # speed classes: class c takes U(lo_c, hi_c) time units (FADAS code; [50, 80] for its large_delay)
    class_ranges: list[list[float]] = field(default_factory=lambda: [[1.0, 2.0], [3.0, 5.0], [5.0, 8.0]])
    class_scale: float = 1.0  # s: class shares drawn from Dirichlet(3s, 2s, s), then one class per client
    constant_duration: float = 1.0  # durations: constant
    # the official FADAS code's dispatch quirk, off by default: from step 1 on, every newly dispatched
    # client but the last drawn trains from x_{t-1}, its delta taken against x_t
    replicate_dispatch_quirk: bool = False

    def check(self) -> None:
        require(self.buffer_size >= 1, "asynchrony.buffer_size", "an integer >= 1", self.buffer_size)
        require(self.concurrency >= self.buffer_size, "asynchrony.concurrency", "an integer >= buffer_size",
                self.concurrency)
        require(len(self.class_ranges) >= 1 and all(len(r) == 2 and 0 <= r[0] <= r[1] for r in self.class_ranges),
                "asynchrony.class_ranges", "a list of [lo, hi] with 0 <= lo <= hi", self.class_ranges)
        require(self.class_scale > 0, "asynchrony.class_scale", "a number > 0", self.class_scale)
        require(self.constant_duration > 0, "asynchrony.constant_duration", "a number > 0",
                self.constant_duration)


@dataclass
class CorruptionConfig:
    """Clients that upload corrupted model deltas, to show an aggregator failing or holding
    (fedrun/federation/corruption.py, docs/algorithms.md). Off by default."""

    kind: Literal["none", "sign_flip", "gaussian"] = "none"  # how corrupted clients corrupt their upload
    clients: list[int] | None = None  # the corrupted clients' ids ...
    fraction: float = 0.0  # ... or this share of the N clients, drawn once from the run seed
    scale: float = 1.0  # sign_flip: upload -scale * Delta_i; gaussian: upload scale * N(0, I)

    def check(self) -> None:
        require(0 <= self.fraction <= 1, "corruption.fraction", "a number in [0, 1]", self.fraction)
        require(self.scale > 0, "corruption.scale", "a number > 0", self.scale)
        require(self.clients is None or all(i >= 0 for i in self.clients), "corruption.clients",
                "null or a list of client ids >= 0", self.clients)
        require(self.clients is None or self.fraction == 0, "corruption.fraction",
                "0 when corruption.clients lists the clients", self.fraction)
        require(self.kind == "none" or bool(self.clients) or self.fraction > 0, "corruption.kind",
                "none, or corruption.clients / corruption.fraction naming the corrupted clients", self.kind)


@dataclass
class AlgorithmConfig:
    """``name`` plus the algorithm's own hyperparameters (a dataclass instance, validated on load)."""

    name: str = "fedavg"
    hparams: Any = None


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    local: LocalConfig = field(default_factory=LocalConfig)
    participation: ParticipationConfig = field(default_factory=ParticipationConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    state: StateConfig = field(default_factory=StateConfig)
    asynchrony: AsyncConfig = field(default_factory=AsyncConfig)
    corruption: CorruptionConfig = field(default_factory=CorruptionConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)  # differential privacy (fedrun/privacy/)

    def check(self) -> None:
        """Checks across sections (each section has checked its own fields first)."""
        require(self.eval.finetune_steps == 0 or self.data.client_test_fraction > 0, "eval.finetune_steps",
                "0 unless data.client_test_fraction > 0 (personalized models are evaluated on per-client "
                "test data)", self.eval.finetune_steps)
        require(self.eval.clients is None or self.eval.clients <= self.data.num_clients, "eval.clients",
                f"null or an integer in [1, data.num_clients={self.data.num_clients}]", self.eval.clients)
        require(self.state.dir is None or self.state.dir.strip() != "", "state.dir", "a directory path or null "
                "(the run directory)", self.state.dir)
        for name, path in (("run.dir", self.run.dir), ("state.dir", self.state.dir)):
            if path is not None:
                require_path(name, path)
        require(not (self.asynchrony.enabled and self.run.skip_nonfinite_clients), "run.skip_nonfinite_clients",
                "false with asynchrony.enabled (an upload is consumed steps after its client's new state was "
                "stored, so it cannot be dropped)", self.run.skip_nonfinite_clients)

    def run_dir(self) -> Path:
        """``run.dir`` with ``{name}``, ``{seed}`` filled in and a leading ``~`` expanded to the home directory."""
        return Path(self.run.dir.format(name=self.run.name, seed=self.run.seed)).expanduser()

    def to_dict(self) -> dict[str, Any]:
        """The resolved config; with plugins, a derived ``plugins`` section ``{field: "module:Attr@sha256"}``
        (:meth:`plugin_digests`), so that the checkpoint's ``meta/config`` records the plugins' code and
        the resume policy (fedrun.federation.resume) sees a changed plugin as a changed setting."""
        out = dataclasses.asdict(self)
        algo = out.pop("algorithm")
        out["algorithm"] = {"name": algo["name"], **(algo["hparams"] or {})}
        for section in PLUGIN_SETTINGS:  # a plugin's settings are keys of its section, as hparams are
            out[section].update(out[section].pop("settings") or {})
        if self.privacy == PrivacyConfig():  # off: left out, so that checkpoints of older versions still resume
            out.pop("privacy")
        plugins = self.plugin_digests()
        if plugins:
            out["plugins"] = plugins
        return out

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def plugin_digests(self) -> dict[str, str]:
        """``{field: "package.module:Attr@<sha256 of the module's source>"}`` for every registry field that
        names a plugin (fedrun.plugins); a checkpoint records it, a resume compares it."""
        return digests({"algorithm.name": self.algorithm.name, "model.name": self.model.name,
                        "data.name": self.data.name, "participation.pattern": self.participation.pattern})


_SECTIONS = frozenset(f.name for f in dataclasses.fields(Config))
PLUGIN_SETTINGS = {"model": "name", "participation": "pattern"}  # sections whose plugin may have ``Settings``


# --------------------------------------------------------------------------------------------- loading


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML file (or start from defaults), apply ``section.key=value`` overrides, validate."""
    data: dict[str, Any] = {}
    if path is not None:
        data = read_config_file(Path(path))
    apply_overrides(data, overrides)
    return config_from_dict(data)


def read_config_file(path: Path) -> dict[str, Any]:
    """The sections of config file ``path`` (YAML 1.2, fedrun.config_yaml); ConfigError naming the file."""
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory, expected a YAML config file")
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        if path.stat().st_size > 4 * MAX_BYTES:  # before reading: at most 4 bytes per character
            raise ConfigError(f"{path.stat().st_size} bytes, more than a config may have ({MAX_BYTES} characters)")
        loaded = parse_yaml(path.read_text())
    except YAMLError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{path}: not valid YAML ({brief(first)[1:-1]})") from None
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the config file ({brief(str(exc))[1:-1]})") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    return loaded or {}


def apply_overrides(data: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> None:
    """Apply ``overrides`` in order (:func:`apply_override`): a setting given twice takes the last value,
    as in a shell's repeated assignments (:func:`repeated_settings` lists them for the command line to
    print)."""
    for item in overrides:
        apply_override(data, item)


def repeated_settings(overrides: list[str] | tuple[str, ...]) -> list[str]:
    """One note per setting that ``overrides`` give more than once, also when one of them sets its whole
    section (``local={steps: 5}`` and ``local.steps=3``): ``local.steps: 'local.steps=3' then
    'local={steps: 5}', the last one counts``."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, item in enumerate(overrides):
        for key in _leaf_keys(item):
            first.setdefault(key, i)
            last[key] = i
    return [f"{key}: {brief(overrides[first[key]])} then {brief(overrides[last[key]])}, the last one counts"
            for key in first if first[key] != last[key]]


def _leaf_keys(item: str) -> list[str]:
    """The dotted settings override ``item`` sets: its key, or every key below it for a mapping value."""
    if "=" not in item:
        return []
    key, raw = item.split("=", 1)
    try:
        value = parse_yaml(raw) if raw.strip() else None
    except (YAMLError, ConfigError):
        value = None
    out, stack = [], [(key.strip(), value)]
    while stack:
        prefix, node = stack.pop()
        if isinstance(node, dict) and node:
            stack.extend((f"{prefix}.{k}", v) for k, v in node.items())
        else:
            out.append(prefix)
    return out


def apply_override(data: dict[str, Any], item: str) -> None:
    """Set ``a.b.c=value`` in a nested dict; the value is parsed as YAML (numbers, lists, null). A mapping
    given to a section (``local={steps: 5}``) is merged into it: the section's other keys stay."""
    if "=" not in item:
        raise ConfigError(f"override {brief(item)}: expected section.key=value")
    key, raw = item.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"override {brief(item)}: expected section.key=value")
    if not raw.strip():  # `state.dir=` is a path left out, not a request for the default
        raise ConfigError(f"override {brief(item)}: no value; expected {key.strip()}=VALUE ({key.strip()}=null "
                          "for none)")
    try:
        value = parse_yaml(raw)
    except YAMLError:
        value = raw
    except ConfigError as exc:
        raise ConfigError(f"override {brief(item)}: {exc}") from None
    if len(parts) == 1 and parts[0] in _SECTIONS and not isinstance(value, dict):
        raise ConfigError(f"override {brief(item)}: {parts[0]} is a section; expected {parts[0]}.KEY=VALUE")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {brief(item)}: {part} is not a section")
        node = child
    old = node.get(parts[-1])
    node[parts[-1]] = _merged(old, value) if isinstance(old, dict) and isinstance(value, dict) else value


def _merged(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``old`` with ``new``'s keys set, mappings merged key by key."""
    out = dict(old)
    for k, v in new.items():
        out[k] = _merged(out[k], v) if isinstance(out.get(k), dict) and isinstance(v, dict) else v
    return out


def config_from_dict(data: dict[str, Any]) -> Config:
    """Build and validate a :class:`Config`; raises :class:`ConfigError` naming the first bad field.

    Types, ranges and the algorithm's hyperparameters are checked here; the names of the model, dataset,
    partitioner and participation pattern are checked by their registries when the run is built."""
    data = dict(data)
    data.pop("plugins", None)  # derived from the code on the Python path (Config.to_dict), never a setting
    extras = {}
    for section in PLUGIN_SETTINGS:
        if isinstance(data.get(section), dict):
            data[section], extras[section] = _split_settings(section, data[section])
    from fedrun.config_h5 import with_client_count  # h5py only: reading a config needs no torch

    data.update({"data": with_client_count(data["data"])} if "data" in data else {})
    algo_raw = data.pop("algorithm", None) or {}
    if not isinstance(algo_raw, dict):
        raise ConfigError(f"algorithm: expected a mapping, got {brief(algo_raw)}")
    cfg = build_dataclass(Config, data, "")
    algo_raw = dict(algo_raw)
    name = algo_raw.pop("name", "fedavg")
    if not isinstance(name, str) or "\x00" in name:
        raise ConfigError(f"algorithm.name: expected a string, got {brief(name)}")
    from fedrun.algorithms import get_algorithm  # here, not at import: reading a config needs no torch

    try:
        algorithm = get_algorithm(name)
    except KeyError as exc:
        raise ConfigError(f"algorithm.name: {exc.args[0]}") from None
    hparams = build_dataclass(algorithm.Hparams, algo_raw, "algorithm")
    cfg.algorithm = AlgorithmConfig(name=name, hparams=hparams)
    for section, key in PLUGIN_SETTINGS.items():
        settings_cls = plugin_settings(getattr(getattr(cfg, section), key), f"{section}.{key}")
        if settings_cls is not None:
            getattr(cfg, section).settings = build_dataclass(settings_cls, extras.get(section, {}), section)
        elif extras.get(section):
            allowed = ", ".join(sorted(f.name for f in dataclasses.fields(getattr(cfg, section)) if f.init))
            raise ConfigError(f"{section}.{sorted(extras[section])[0]}: unknown key (allowed: {allowed})")
    check_all(cfg)
    return cfg


def _split_settings(section: str, raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A model/participation section's own keys, and the others (a plugin's settings, or unknown keys)."""
    own = {f.name for f in dataclasses.fields(typing.get_type_hints(Config)[section]) if f.init}
    return {k: v for k, v in raw.items() if k in own}, {k: v for k, v in raw.items() if k not in own}


def plugin_settings(value: str, field_name: str) -> type | None:
    """The ``Settings`` dataclass of the plugin that config field ``field_name`` names, or None (a built-in
    name, or a plugin without settings)."""
    if not is_import_path(value):
        return None
    settings = getattr(load(value, field_name, "an importable plugin", lambda obj: True), "Settings", None)
    if settings is not None and not (isinstance(settings, type) and dataclasses.is_dataclass(settings)):
        raise ConfigError(f"{field_name}: {value}.Settings is {settings!r}; expected a dataclass of settings")
    return settings


def check_all(obj: Any) -> None:
    """Run ``check()`` of every section, depth first."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            check_all(value)
        elif isinstance(value, AlgorithmConfig) and dataclasses.is_dataclass(value.hparams):
            check_all(value.hparams)
    if hasattr(obj, "check"):
        obj.check()


def build_dataclass(cls: type, data: Any, where: str) -> Any:
    """Recursively build dataclass ``cls`` from a dict, checking keys and value types."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {brief(data)}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    for key in data:
        if not isinstance(key, str):
            raise ConfigError(f"{where or 'config'}: key {brief(key)} is not a name; expected one of "
                              f"{', '.join(sorted(names))}")
    unknown = sorted(set(data) - names)
    if unknown:
        allowed = ", ".join(sorted(names))
        raise ConfigError(f"{_join(where, brief(unknown[0])[1:-1])}: unknown key (allowed: {allowed})")
    kwargs = {}
    for name in names:
        if name in data:
            kwargs[name] = _coerce(hints[name], data[name], _join(where, name))
    obj = cls(**kwargs)
    return obj


def _coerce(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return build_dataclass(tp, value, where)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, where)
            except ConfigError as exc:
                errors.append(exc)
        expected = " or ".join(_describe(a) for a in args)
        raise ConfigError(f"{where}: expected {expected}, got {brief(value)}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{where}: expected one of {', '.join(map(str, args))}, got {brief(value)}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {brief(value)}")
        return [_coerce(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {brief(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {brief(value)}")
        if not -MAX_INT - 1 <= value <= MAX_INT:  # beyond int64: every array it reaches would overflow
            raise ConfigError(f"{where}: expected an integer in [-2^63, 2^63), got {brief(value)}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-2" as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {brief(value)}")
        if not math.isfinite(value):  # .inf / .nan / 1e999 would pass every range check below
            raise ConfigError(f"{where}: expected a finite number, got {brief(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {brief(value)}")
        if "\x00" in value:  # no file name, format or registry name holds one; os calls refuse it
            raise ConfigError(f"{where}: expected a string without NUL characters, got {brief(value)}")
        return value
    raise TypeError(f"{where}: unsupported config type {tp!r}")


def _describe(tp: Any) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false",
            type(None): "null"}.get(tp, getattr(tp, "__name__", str(tp)))


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name
