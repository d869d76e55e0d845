"""The run's config sections, one dataclass each, but for ``data`` (:mod:`fedrun.config.data`) and
``privacy`` (:mod:`fedrun.privacy.config`); :class:`fedrun.config.tree.Config` puts them together.

Every field has a type and a default, and the comment next to it (or right above it) is its meaning in
``fedrun config --defaults`` (:mod:`fedrun.config.help`). Each section's ``check`` validates its own values
with one line naming the field (``local.lr: expected a number > 0, got -1``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from fedrun.errors import ConfigError, brief, require

# Bounds of the integer and time settings (docs/reliability.md lists them): beyond them a value is a typo,
# and would overflow an int64 array, a timedelta or the memory instead of running.
MAX_STEPS = 1_000_000  # local.steps, local.epochs: the per-round minibatch index arrays are [C, K, b]
MAX_BATCH = 2**31 - 1  # local.batch_size, eval.batch_size
MAX_THREADS = 4096  # run.threads (and at most the CPUs this process may use, checked where the run starts)
MIN_TIMEOUT_S, MAX_TIMEOUT_S = 1.0, 7 * 86400.0  # run.timeout_s: a rendezvous needs about a second; a week


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
    # sinks of your own, each package.module:Class, a subclass of fedrun.metrics.observer.Observer constructed as
    # Class(run_dir) on every rank (run_dir: rank 0's run directory, else None) (docs/extending.md, "A metrics sink")
    observers: list[str] = field(default_factory=list)

    def check(self) -> None:
        for value in self.observers:
            require(isinstance(value, str) and ":" in value, "metrics.observers",
                    "a list of package.module:Class entries", value)


@dataclass
class CheckpointConfig:
    every: int = 0  # write a checkpoint every this many rounds (0: only at the end and on signals)
    # and after the round in which this many seconds of rounds have passed since the last checkpoint (or the
    # start), whatever ``every`` says: a launcher that kills the ranks outright loses at most this much (0: off)
    every_s: float = 600.0
    keep: int = 3  # keep this many newest checkpoints to resume from (and the files they build on)
    # every K-th checkpoint is full, the others are increments holding the client rows changed since the one
    # before (docs/checkpoint.md); 1: always full; 0: auto = 1 on the memory store, 10 on the disk store
    full_every: int = 0

    def check(self) -> None:
        require(self.every >= 0, "checkpoint.every", "an integer >= 0", self.every)
        require(self.every_s >= 0, "checkpoint.every_s", "a number of seconds >= 0 (0: off)", self.every_s)
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
