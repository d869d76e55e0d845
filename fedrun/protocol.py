"""The vocabulary shared by the runtime and the algorithms: declared entries, local plans and results,
what the rules know about clients and the round. It sits below training/, state/ and algorithms/, and
imports nothing of fedrun.

An algorithm (``fedrun.algorithms.base.Algorithm``) declares its state with :class:`Vector` and
:class:`Scalar` entries in a :class:`Declaration`; the runtime derives allocation, the flat reduce and
broadcast layouts, checkpoint contents and communication accounting from it. A round hands the rules a
:class:`RoundContext` and a :class:`Clients` view; local training follows a :class:`LocalPlan` and returns
a :class:`LocalResult`; the local optimizer is a :class:`LocalOptimizer`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from torch import Tensor

Init = Literal["zeros", "model"] | float


@dataclass(frozen=True)
class Vector:
    """A model-sized entry ``[d]`` (server) or ``[C, d]`` (client, upload).

    An upload entry is summed over the step's consumed clients by default; with ``gather=True`` the
    server rule receives the individual uploads instead, as ``[|S_t|, d]`` in client-id order."""

    name: str
    init: Init = "zeros"  # "model": the initial global model x^(0)
    gather: bool = False  # upload entries only: deliver every client's row instead of their sum


@dataclass(frozen=True)
class Scalar:
    """One number (server) or one number per client ``[C]`` (client, upload)."""

    name: str
    init: float = 0.0


Entry = Vector | Scalar


@dataclass(frozen=True)
class Declaration:
    server: tuple[Entry, ...]
    client: tuple[Entry, ...] = ()
    down: tuple[str, ...] = ("x",)
    up: tuple[Entry, ...] = ()
    # the upload entry that carries the client's model delta (or a multiple of it), if any: the runtime's
    # ``corruption`` option corrupts this entry of the chosen clients, without the algorithm knowing
    model_delta: str | None = None
    # the client entries whose sum over all N clients the server keeps (MIFA's G_i, FedVARP's y_i, FedSUM's h_i,
    # SCAFFOLD's c_i): a participant uploads the change of its row (new minus old), so the server reuses every
    # client's last contribution in every later round; central differential privacy refuses such an algorithm
    memory: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        server_names = [e.name for e in self.server]
        if "x" not in server_names:
            raise ValueError("an algorithm's server state must contain the global model 'x'")
        for name in self.down:
            if name not in server_names:
                raise ValueError(f"downlink entry {name!r} is not a server entry")
        if self.model_delta is not None and self.model_delta not in [e.name for e in self.up]:
            raise ValueError(f"model_delta {self.model_delta!r} is not an upload entry")
        for name in self.memory:
            if name not in [e.name for e in self.client]:
                raise ValueError(f"memory entry {name!r} is not a client entry")
        for group in (self.server, self.client, self.up):
            names = [e.name for e in group]
            if len(set(names)) != len(names):
                raise ValueError(f"duplicate entry names in {names}")

    def floats(self, entries: tuple[Entry, ...] | list[Entry], dim: int) -> int:
        """Number of floats in one copy of ``entries`` for a model of dimension ``dim``."""
        return sum(dim if isinstance(e, Vector) else 1 for e in entries)

    def gathered(self) -> set[str]:
        """Names of the upload entries the server rule receives per client (``Vector(..., gather=True)``)."""
        return {e.name for e in self.up if isinstance(e, Vector) and e.gather}

    def down_entries(self) -> list[Entry]:
        by_name = {e.name: e for e in self.server}
        return [by_name[n] for n in self.down]


class LocalOptimizer(Protocol):
    """A local optimizer: plain SGD (the default), FAdamGC's AMSGrad, FedCAda's client Adam, FAFED's STORM.

    The step contract of the local solver (``fedrun.training.local.run_local``):

    * ``init(x, state)``: ``x`` [C, d] the starting points, ``state`` the plan's ``optimizer_state``
      (or None: start from zeros); returns the optimizer's state, a dict of ``[C, ...]`` tensors;
    * for every local step ``k``: ``u`` is the processed gradient at the current point ``x`` (clipped,
      plus the plan's correction and weight decay), ``grad_at(point)`` returns the processed gradient at
      another ``[C, d]`` point ON THE SAME MINIBATCH k (one more oracle call each time it is called);
      ``step(k, x, u, state, grad_at)`` returns ``(direction, new_state)`` and the solver moves
      ``x <- x - lr * lr_scale * direction``. Clients without step k (epochs mode) keep x and state.
    * the final state is returned in ``LocalResult.optimizer_state``.
    """

    def init(self, x: Tensor, state: dict[str, Tensor] | None) -> dict[str, Tensor]: ...

    def step(self, k: int, x: Tensor, u: Tensor, state: dict[str, Tensor],
             grad_at: Callable[[Tensor], Tensor]) -> tuple[Tensor, dict[str, Tensor]]: ...


@dataclass
class LocalPlan:
    """What a block of C participating clients does locally this round (docs/algorithms.md).

    Each step k: ``g`` raw minibatch gradient (clipped if configured), direction
    ``g + correction`` (+ weight decay, + ``prox * (x - start)``), optimizer step scaled by ``lr * lr_scale``.
    """

    start: Tensor  # [C, d] starting points (may be a broadcast view: the solver works on a copy)
    correction: Tensor | None = None  # [C, d] added to every raw gradient
    lr_scale: float | Tensor = 1.0  # FedSUM's 1/N; a [C] tensor scales each client's steps separately
    move: bool = True  # False: K gradients at the starting point (FedSUM-B)
    optimizer: LocalOptimizer | None = None  # None: the run's SGD (local.momentum), reset every round
    optimizer_state: dict[str, Tensor] | None = None  # persisted local optimizer state, [C, d] each
    steps: int | None = None  # run only the first ``steps`` local steps this round (None: all K)
    prox: float = 0.0  # FedProx's mu: every processed gradient gains prox * (x - start), 0 adds nothing


@dataclass
class LocalResult:
    x_end: Tensor  # [C, d]
    grad_mean: Tensor  # [C, d] mean of the RAW minibatch gradients over the local steps
    loss: Tensor  # [C] mean minibatch loss over the local steps
    optimizer_state: dict[str, Tensor] = field(default_factory=dict)  # final state of the local optimizer


@dataclass
class Clients:
    """What the rules may know about the clients they act on (all tensors ``[C]``)."""

    ids: Tensor  # global client ids
    num_examples: Tensor  # n_i (float, run dtype)
    participations: Tensor  # rounds in which the client took part before this one
    last_active: Tensor  # last round it took part in before this one, -1 if never
    probability: Tensor | None = None  # known participation probability p_i^t, when the pattern has one
    staleness: Tensor | None = None  # asynchronous mode: server steps since the client's start model


@dataclass
class RoundContext:
    round: int  # t, 0-based
    lr: float  # eta_l(t)
    num_clients: int  # N
    num_active: int  # |S_t| (all ranks)
    local_steps: int  # K (nominal)
    dim: int  # d
    total_examples: float = 0.0  # sum_j n_j over all N clients (data-size weights p_i = n_i / total)
    total_rounds: int = 0  # T (run.rounds): for schedules defined relative to the run length
    # asynchronous schedule (fedrun.federation.schedule): staleness tau_i = t - t_i^start of each update
    # the server rule receives this step, in client-id order; None (and 0) in synchronous rounds
    staleness: Tensor | None = None
    max_staleness: int = 0


# a server rule as the runtime applies it on rank 0: (server state, the step's summed uploads, context) -> new
# server state (an algorithm's ``server_update``, or an upload transform's rule around it)
ServerRule = Callable[[dict[str, Tensor], dict[str, Tensor], RoundContext], dict[str, Tensor]]
