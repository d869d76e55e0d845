"""The one exchange of a step: one reduce of the summed uploads to rank 0, the server rule there, one
broadcast of the next downlink. Also the policy for non-finite uploads and models.

The summed entries and the training losses are summed exactly (:mod:`fedrun.runtime.exact_sum`): after
one all-reduce MAX of their exponents, each rank encodes its clients' uploads as integer limbs, which
the reduce adds exactly (int64), and rank 0 decodes them once; the sums are the same bits whatever the
number of ranks, the placement and the order of the clients.

Gathered upload entries (``Vector(name, gather=True)``) travel in the same reduce: the uplink buffer of
a step that consumes n uploads holds an ``[n, d]`` region per gathered entry, one row per consumed
client in client-id order; every rank writes its own clients' rows into their slots, leaves the others
zero, and the reduce's integer sum of their bits (x + 0 = x) assembles the ``[n, d]`` uploads on rank 0,
identical whatever the number of ranks. This costs a reduce
of n x d floats instead of d; a gather of only each
rank's rows would move less on many ranks, but needs equal-sized pieces (padding to the largest share)
and a second collective for the summed entries, while the zero-padded reduce keeps ONE collective and
the summed entries bit-identical to a declaration without gathered ones (bench/gathered.py measures
what the larger reduce costs). Every rank therefore holds n x d floats per gathered entry during the
step: :func:`check_gathered_memory` compares the worst case with free memory at start-up.

Both flat buffers carry runtime entries after the algorithm's own:

* uplink (int64: the limbs, then these counts, then the gathered rows' bytes): the training-loss sum
  (among the limbs), the number of non-finite uploads, the stop-signal flag, and one slot per rank holding
  (smallest client id with a non-finite upload) + 1, or 0;
* downlink: what every rank does after this step (continue, stop on a signal, stop on NaN/Inf), how many
  uploads were not finite and the smallest such client id.

A non-finite upload stops the run (exit status 3) unless ``run.skip_nonfinite_clients`` drops it from
the step; a server rule whose result is not finite is not applied and stops the run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from fedrun.data.sizes import available_bytes
from fedrun.errors import ConfigError, NumericalError
from fedrun.protocol import Declaration, Entry, RoundContext, Scalar, ServerRule
from fedrun.runtime import exact_sum
from fedrun.runtime.flat import GATHER_BYTES, FlatLayout, broadcast_from_root, reduce_to_root
from fedrun.runtime.world import World

# the runtime's entries at the end of the downlink: the stop code, the non-finite uploads and the smallest bad
# client id + 1 (each as a split() pair: exact in float32 beyond 2^24), and whether a checkpoint is due
_DOWN_EXTRAS = (("_stop", 1), ("_nonfinite", 2), ("_bad_client", 2), ("_save", 1))
CONTINUE, STOP_SIGNAL, STOP_NONFINITE = 0.0, 1.0, 2.0
# the gathered buffer and the server rule's working arrays (a sort's values and its int64 indices, the
# result): what the start-up check asks free memory for, per gathered entry, in units of [n, d]
GATHER_COPIES = 4


@dataclasses.dataclass
class Uplink:
    """What one rank brings to a step's reduce: its share of the consumed uploads and its flags."""

    uploads: dict[str, Tensor] | None = None  # the kept uploads, [C, ...] rows (summed exactly); None: none here
    losses: Tensor | None = None  # their training losses [C]
    slots: np.ndarray | None = None  # positions of the uploads' rows among the step's consumed clients
    nonfinite: int = 0  # consumed uploads of this rank that were not finite
    bad_client: int = -1  # the smallest global id among those (-1: none)
    stop_requested: bool = False  # this rank received a stop signal


@dataclasses.dataclass
class Totals:
    """The reduced uplink on rank 0: every rank's uploads summed (gathered entries ``[n, d]``) and flags."""

    up: dict[str, Tensor]
    loss: float  # sum of the training losses
    nonfinite: int  # uploads that were not finite, over all ranks
    bad_client: int  # the smallest client id with a non-finite upload (-1: none)
    signal: bool  # some rank received a stop signal


@dataclasses.dataclass
class Outcome:
    """What every rank learns from an exchange."""

    down_next: dict[str, Tensor]  # the next downlink (the algorithm's entries only)
    stop: float  # CONTINUE or STOP_SIGNAL (STOP_NONFINITE raises)
    nonfinite: int  # uploads that were not finite, over all ranks
    train_loss: float  # mean training loss of the kept uploads (rank 0; NaN elsewhere)
    server: dict[str, Tensor]  # the server state after the step (rank 0; empty elsewhere)


class Exchange:
    """The flat layouts of one algorithm's declaration, the downlink buffer every rank reads its round's
    downlink from, and the communication each direction costs per client (in floats)."""

    def __init__(self, decl: Declaration, dim: int, world: World, dtype: torch.dtype,
                 skip_nonfinite: bool = False) -> None:
        self.world, self.dtype = world, dtype
        self.skip_nonfinite = skip_nonfinite  # run.skip_nonfinite_clients: drop non-finite uploads
        def numel(entry: Entry) -> int:
            return 1 if isinstance(entry, Scalar) else dim

        down_entries = decl.down_entries()
        self.dim = dim
        self.gathered = [e.name for e in decl.up if e.name in decl.gathered()]
        self.down_layout = FlatLayout([(e.name, numel(e)) for e in down_entries] + list(_DOWN_EXTRAS))
        self.down_scalars = {e.name for e in down_entries if isinstance(e, Scalar)} | {"_stop", "_save"}
        summed = [(e.name, numel(e)) for e in decl.up if e.name not in self.gathered]
        self._summed_names = [name for name, _ in summed]
        self.exact_layout = FlatLayout([*summed, ("_loss", 1)])  # the exactly summed part of the uplink
        self.up_scalars = {e.name for e in decl.up if isinstance(e, Scalar)} | {"_loss"}
        self.up_floats = decl.floats(decl.up, dim)
        self.down_floats = decl.floats(tuple(down_entries), dim)
        self.down_buf = self.down_layout.empty(dtype, world.device)
        self._element_size = self.down_buf.element_size()  # bytes of the run's dtype
        self._down_extras = frozenset(name for name, _ in _DOWN_EXTRAS)
        self._extras_span = slice(self.down_layout.slices[_DOWN_EXTRAS[0][0]].start, self.down_layout.numel)
        self._down = self.down_layout.unpack(self.down_buf, self.down_scalars)  # views, valid as long as the buffer
        # rank 0's clock asked when it publishes a step: is a checkpoint due (checkpoint.every_s)? Its answer
        # travels in the step's broadcast, so every rank takes the same decision (fedrun.federation.cadence)
        self.save_due: Callable[[], bool] = lambda: False

    def publish(self, server: dict[str, Tensor], stop: float = CONTINUE, nonfinite: int = 0,
                bad_client: int = -1, save: bool = False) -> dict[str, Tensor]:
        """Rank 0 packs the server's downlink entries and the runtime entries (``save``: a checkpoint is due
        after this step); one broadcast; every rank returns the downlink (views into the buffer, runtime
        entries included)."""
        if self.world.is_root:  # the runtime entries, last in the layout, written as one slice
            self.down_layout.pack(server, self.down_buf, skip=self._down_extras)
            self.down_buf[self._extras_span] = torch.tensor([stop, *split(nonfinite), *split(bad_client + 1),
                                                             float(save)])
        broadcast_from_root(self.world, self.down_buf)
        return dict(self._down)

    def downlink(self) -> dict[str, Tensor]:
        """This round's downlink: the algorithm's entries, copied out of the buffer (they outlive the
        broadcast that ends the round)."""
        return {k: v.clone() for k, v in self._down.items() if not k.startswith("_")}

    def stop_code(self) -> float:
        """What every rank does after the round just exchanged: CONTINUE or STOP_SIGNAL."""
        return float(self._down["_stop"])

    def stop_after_step(self) -> None:
        """Stop after the step just exchanged (on every rank, which decided it together after the broadcast:
        a stop request during the evaluation)."""
        self._down["_stop"].fill_(STOP_SIGNAL)

    def save_requested(self) -> bool:
        """Whether rank 0's clock asked for a checkpoint after the step just exchanged (the same on every rank)."""
        return bool(self._down["_save"])

    def global_model(self) -> Tensor:
        """The current global model x (a view into the downlink buffer)."""
        return self._down["x"]

    def step(self, label: str, ctx: RoundContext, uplink: Uplink, server: dict[str, Tensor],
             server_rule: ServerRule) -> Outcome:
        """Steps 4 and 5 of a step (``label`` names it in messages) that consumes ``ctx.num_active``
        uploads: ONE reduce of every rank's :class:`Uplink` to rank 0 (its uploads summed exactly), the
        server rule there under the non-finite policy (:func:`guarded_rule`), ONE broadcast of the next
        downlink; then every rank stops on a non-finite step (:func:`raise_nonfinite`)."""
        totals = self._reduce(ctx.num_active, uplink)
        train_loss = float("nan")
        if self.world.is_root:
            kept = ctx.num_active - (totals.nonfinite if self.skip_nonfinite else 0)  # |S_t| the rule sees
            train_loss = totals.loss / kept if kept else float("nan")
            server, stop = guarded_rule(server_rule, server, totals, dataclasses.replace(ctx, num_active=kept),
                                        self.skip_nonfinite)
            down = self.publish(server, stop, totals.nonfinite, totals.bad_client, self.save_due())
        else:
            down = self.publish(server)
        raise_nonfinite(label, down, self.skip_nonfinite)
        down_next = {k: v for k, v in down.items() if not k.startswith("_")}
        return Outcome(down_next=down_next, stop=float(down["_stop"]), nonfinite=pair_value(down["_nonfinite"]),
                       train_loss=train_loss, server=server)

    def _reduce(self, n: int, uplink: Uplink) -> Totals | None:
        """Step 4 for a step that consumes ``n`` uploads: the exact sums (fedrun.runtime.exact_sum) of the
        summed entries and losses (integer limbs), the runtime counts and the gathered rows (their bits;
        each row from one rank, the others adding zeros) in ONE int64 reduce, after one MAX of the
        exponents; the :class:`Totals` on rank 0 (None elsewhere)."""
        world, device, terms = self.world, self.world.device, max(n, 1)
        uploads, losses = uplink.uploads, uplink.losses
        rows = [] if uploads is None else [uploads[name].reshape(len(losses), -1) for name in self._summed_names]
        rows = [*rows, losses.reshape(-1, 1)] if losses is not None else []
        numel = self.exact_layout.numel
        if not self.gathered and world.size * self._gathered_numel(n) * self._element_size <= GATHER_BYTES:
            return self._summed_on_root(n, torch.cat(rows, dim=1) if rows else None, uplink)
        spans = list(self.exact_layout.slices.values())
        if len(rows) == len(spans) and len(losses) * numel <= exact_sum.CHUNK:
            # one [C, numel] block (a temporary no larger than exact_sum's own): each exact_sum call costs tens of
            # small kernels, most of a small model's exchange on a CPU (0.57 ms a round for W2's two blocks,
            # 0.31 ms as one); column-wise, so the same bits
            rows, spans = [torch.cat(rows, dim=1)], [slice(0, numel)]
        empty = torch.zeros(0, numel, dtype=self.dtype, device=device)
        exps = exact_sum.agree(world, torch.cat([exact_sum.exponents(r) for r in rows or [empty]]), self.dtype)
        parts, gathered = exact_sum.limbs(self.dtype), len(self.gathered) * n * self.dim
        words = -(-gathered * torch.empty(0, dtype=self.dtype).element_size() // 8)  # the rows' bytes in int64s
        buf = torch.zeros(parts * numel + 2 + world.size + words, dtype=torch.int64, device=device)
        limbs = buf[:parts * numel].view(parts, numel)
        counts = buf[parts * numel:parts * numel + 2 + world.size]
        floats = buf[len(buf) - words:].view(self.dtype)[:gathered].view(len(self.gathered), n, self.dim)
        for sl, r in zip(spans, rows, strict=False):  # no rows: no uploads here
            limbs[:, sl] = exact_sum.encode_sum(r, exps[sl], terms).to(torch.int64)  # integers <= 2^53: exact
        counts[0], counts[1] = uplink.nonfinite, int(uplink.stop_requested)
        if uplink.nonfinite:
            counts[2 + world.rank] = uplink.bad_client + 1
        if uploads is not None and self.gathered:
            index = torch.as_tensor(uplink.slots, device=device)
            for g, name in enumerate(self.gathered):
                floats[g].index_copy_(0, index, uploads[name])
        reduce_to_root(world, buf)
        if not world.is_root:
            return None
        up = self.exact_layout.unpack(exact_sum.decode(limbs.to(torch.float64), exps, terms, self.dtype),
                                      self.up_scalars)
        up.update({name: floats[g] for g, name in enumerate(self.gathered)})
        return totals(up, counts)


    def _summed_on_root(self, n: int, block: Tensor | None, uplink: Uplink) -> Totals | None:
        """Step 4 when the step's rows are few enough to gather (a small model or cohort; W2): every rank's raw
        rows ``block`` ``[C, numel]`` (summed entries and loss), each in its slot among the step's ``n`` consumed
        clients, and the runtime counts, in ONE reduce to rank 0 in the run's dtype (a gather and a sum there;
        every entry has one non-zero term, so it is exact), after which rank 0 takes the exact sums of the ``n``
        rows itself. An exact sum is a function of its multiset of rows alone, so these are the bits of the
        two-collective path (the exponents' MAX, then the limbs' sum) with one collective less: 2 ranks of W2
        spent 0.68 ms a round in that MAX (bench/RESULTS.md, issue 47). The counts travel as :func:`split`
        pairs, exact in float32 (W2's float32 rows: half the bytes of float64, the gather 0.37 -> 0.27 ms). On
        one rank every row is already here: no buffer and no collective, the counts straight from ``uplink``
        (W2, loaded machine: 0.28 -> 0.20 ms)."""
        world, numel = self.world, self.exact_layout.numel
        if world.size == 1:
            empty = torch.zeros(0, numel, dtype=self.dtype, device=world.device)
            up = self._exact_sums(block if block is not None else empty, n)
            return Totals(up=up, loss=float(up.pop("_loss")), nonfinite=uplink.nonfinite,
                          bad_client=uplink.bad_client if uplink.nonfinite else -1, signal=uplink.stop_requested)
        buf = torch.zeros(self._gathered_numel(n), dtype=self.dtype, device=world.device)
        rows, counts = buf[:n * numel].view(n, numel), buf[n * numel:].view(2 + world.size, 2)
        if block is not None and len(block):
            rows.index_copy_(0, torch.as_tensor(uplink.slots, device=world.device), block)
        wide = [uplink.nonfinite, int(uplink.stop_requested)] + [0] * world.size
        if uplink.nonfinite:
            wide[2 + world.rank] = uplink.bad_client + 1
        counts.copy_(torch.tensor([split(v) for v in wide], dtype=self.dtype))
        reduce_to_root(world, buf)
        if not world.is_root:
            return None
        return totals(self._exact_sums(rows, n), joined(counts))

    def _gathered_numel(self, n: int) -> int:
        """The buffer of :meth:`_summed_on_root` for ``n`` consumed clients: their rows, then the runtime counts
        (the non-finite uploads, the stop requests, each rank's smallest bad client id + 1) as split pairs."""
        return n * self.exact_layout.numel + 2 * (2 + self.world.size)

    def _exact_sums(self, rows: Tensor, n: int) -> dict[str, Tensor]:
        """The summed entries (and ``_loss``) of a step of ``n`` uploads from all of its rows ``rows``
        ``[C, numel]`` in one place: the exponents, limbs and decoding of the two-collective path without its
        collectives, the limbs through int64 as the reduce's (no -0)."""
        terms = max(n, 1)
        exps = exact_sum.exponents(rows)
        limbs = exact_sum.encode_sum(rows, exps, terms).to(torch.int64)
        return self.exact_layout.unpack(exact_sum.decode(limbs.to(torch.float64), exps, terms, self.dtype),
                                        self.up_scalars)


SPLIT = 1 << 12  # an integer count or id in a float buffer: v = hi * SPLIT + lo, each part exact in float32 to 2^24


def split(value: int) -> tuple[int, int]:
    """``value`` (>= 0) as (hi, lo) with lo < SPLIT: every rank's parts summed stay exact in float32 while the
    sums stay below 2^24 (ids and counts below 2^36 from fewer than 4,096 ranks)."""
    return divmod(value, SPLIT)


def joined(pairs: Tensor) -> Tensor:
    """int64 ``[k]`` values of summed :func:`split` pairs ``[k, 2]``."""
    wide = pairs.to(torch.int64)
    return wide[:, 0] * SPLIT + wide[:, 1]


def pair_value(pair: Tensor) -> int:
    """The integer a :func:`split` pair ``[2]`` holds."""
    return int(joined(pair.view(1, 2))[0])


def totals(up: dict[str, Tensor], counts: Tensor) -> Totals:
    """Rank 0's :class:`Totals` from the summed entries ``up`` (the loss among them, ``_loss``) and the reduced
    runtime counts ``counts`` (int64: non-finite uploads, stop requests, then per rank its smallest bad client
    id + 1, or 0)."""
    loss = float(up.pop("_loss"))
    slots = counts[2:]
    bad_client = int(slots[slots > 0].min()) - 1 if bool((slots > 0).any()) else -1
    return Totals(up=up, loss=loss, nonfinite=int(counts[0]), bad_client=bad_client, signal=bool(counts[1] > 0))


# ------------------------------------------------------------------------------------ the non-finite policy


def guarded_rule(server_rule: ServerRule, server: dict[str, Tensor], totals: Totals, ctx: RoundContext,
                 skip: bool) -> tuple[dict[str, Tensor], float]:
    """The server rule under the non-finite policy (rank 0): the server state to keep and the stop code.

    A non-finite upload stops the run (STOP_NONFINITE, the rule is not called) unless ``skip``
    (``run.skip_nonfinite_clients``) left it out of the sums; a rule whose result is not finite is not
    applied (the last good state stays) and stops the run; otherwise the new state is kept and the run
    continues, or stops after this step when a rank received a signal (STOP_SIGNAL)."""
    if totals.nonfinite > 0 and not skip:
        return server, STOP_NONFINITE
    new_server = server_rule(server, totals.up, ctx)
    if not all(bool(torch.isfinite(v).all()) for v in new_server.values()):
        return server, STOP_NONFINITE
    return new_server, STOP_SIGNAL if totals.signal else CONTINUE


def raise_nonfinite(label: str, down: dict[str, Tensor], skip: bool) -> None:
    """On every rank after the broadcast: raise :class:`NumericalError` (exit status 3) naming the step
    ``label`` and the cause when rank 0 stopped the run on a non-finite upload or model."""
    if float(down["_stop"]) != STOP_NONFINITE:
        return
    nonfinite = pair_value(down["_nonfinite"])
    if nonfinite and not skip:
        others = f" (and {nonfinite - 1} other client(s))" if nonfinite > 1 else ""
        raise NumericalError(f"{label}: client {pair_value(down['_bad_client']) - 1} uploaded a non-finite update "
                             f"or training loss (NaN/Inf){others}; lower the learning rates or set "
                             "run.skip_nonfinite_clients=true")
    raise NumericalError(f"{label}: the global model became non-finite (NaN/Inf); lower the learning rates")


def finite_uploads(up: dict[str, Tensor], loss: Tensor, skip: bool) -> tuple[dict[str, Tensor], Tensor, np.ndarray]:
    """The per-client uploads ``[C, ...]`` and training losses ``[C]`` that go into the step's exact sums, and a
    bool ``[C]`` mask of the clients kept. A client whose upload or training loss is not finite (the loss
    overflows before the model does: ||A x - b||^2 at |x| ~ 1e154 in float64) makes a float sum non-finite:
    only then are single clients looked at; with ``skip`` those are left out, otherwise their rows are
    zeroed (the run stops after the exchange, which every rank still joins), so that the exact sum only
    ever sees finite values."""
    kept = np.ones(len(loss), dtype=bool)
    if all(bool(torch.isfinite(value.sum())) for value in (*up.values(), loss)):
        return up, loss, kept
    finite = torch.stack([torch.isfinite(v.reshape(len(loss), -1)).all(dim=1) for v in (*up.values(), loss)])
    finite = finite.all(dim=0)
    kept = finite.cpu().numpy()
    if skip:
        return {name: value[finite] for name, value in up.items()}, loss[finite], kept
    zero = lambda v: torch.where(finite.view(-1, *([1] * (v.dim() - 1))), v, 0)  # noqa: E731
    return {name: zero(value) for name, value in up.items()}, zero(loss), kept


def check_gathered_memory(gathered: int, worst: int, dim: int, dtype: torch.dtype, world: World, field: str) -> None:
    """Refuse at start-up, with one line, a run whose gathered uploads cannot fit: ``gathered`` entries of
    ``worst`` (the largest possible step) x ``dim`` floats, times GATHER_COPIES, against this rank's free
    memory (the device's on a GPU, MemAvailable on a CPU; no check when unknown); every rank decides on
    every rank's figures."""
    need = gathered * GATHER_COPIES * worst * dim * torch.empty(0, dtype=dtype).element_size()
    free = free_memory(world.device)
    verdicts = world.allgather_object(None if free is None or need <= free else (world.rank, free))
    refused = [v for v in verdicts if v is not None]
    if refused:
        rank, free = refused[0]
        raise ConfigError(f"{field}: gathered uploads hold up to {worst} x {dim} floats per entry on every rank "
                          f"({need / 2**30:.1f} GiB with the server rule's working copies), but rank {rank} has "
                          f"{free / 2**30:.1f} GiB free; expected fewer clients per step (participation or "
                          "asynchrony.buffer_size), a smaller model or more memory")


def free_memory(device: torch.device) -> int | None:
    """Bytes free on ``device``: ``torch.cuda.mem_get_info`` on a GPU, else the host's available memory
    (:func:`fedrun.data.sizes.available_bytes`); None when unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return available_bytes()
