"""Per-client evaluation (``data.client_test_fraction`` > 0, or an on-demand dataset; docs/evaluation.md).

Every client i has m_i test examples of its own (:func:`fedrun.data.partition.split_client_tests`, or the
dataset's). The evaluated clients S are every client, or with ``eval.clients`` = s a seeded sample of s
of them (:func:`~fedrun.data.client_source.sample_clients`, keyed by the run seed alone: the same clients
at every evaluation and on any number of ranks). On evaluation rounds the global model x is evaluated on
all their test examples:

* The test examples of the clients of S, concatenated in client order, are cut into fixed batches of
  ``eval.batch_size``; rank r evaluates an equal contiguous share of the batches (the clients of about
  its own block). A batch is the same whatever the number of ranks, so each example's loss and
  correctness are too (a convolution's output can depend on its batch).
* With ``eval.finetune_steps`` = K' > 0, each client's owner rank also runs K' local steps of the run's
  local solver (plain local SGD with ``local.momentum``, ``local.lr`` of the round, batches of
  ``local.batch_size`` from the client's training examples, drawn from their own random stream keyed by
  (seed, round, client)) from x, and evaluates the resulting x_i on the client's test examples in batches
  of that client alone: personalized accuracy, a function of (seed, round, client) only.
* The examples are walked in windows of whole batches (bounded in bytes and examples, whatever N is;
  an on-demand dataset loads a window's clients when it comes); ONE reduce per window brings rank 0 its
  per-example results (the last also the personalized per-client sums; each entry comes from one rank,
  the others add exact zeros), and rank 0 sums the examples of each client in float64, in order, once
  all are in: the per-client results are bit-identical on any number of ranks and window sizes.
* Between windows the ranks agree (one MAX of a flag) whether any of them has a stop request: then the
  evaluation ends there (:class:`EvaluationStopped`), so that a stop signal during the evaluation of a
  million clients is acted on within a window, with the checkpoint of the finished rounds
  (fedrun.federation.cadence). Rank 0 reports how far a long evaluation has come (:class:`Watch`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from fedrun.config import Config
from fedrun.data.client_block import ClientBlock
from fedrun.data.client_source import ClientSource, sample_clients
from fedrun.errors import EvaluationStopped
from fedrun.federation.client_trainer import Learner
from fedrun.protocol import LocalPlan
from fedrun.runtime.flat import all_reduce, reduce_to_root
from fedrun.runtime.world import World
from fedrun.training.dropout import DropoutSeeds
from fedrun.training.evaluate import evaluate_examples
from fedrun.training.local_strategy import LocalStrategy
from fedrun.training.schedule import local_lr

FINETUNE_ROUNDS = 1 << 40  # fine-tuning after round t draws its batches as "round" FINETUNE_ROUNDS + t
FINETUNE_GROUP = 64  # clients fine-tuned together (bounds the [C, d] local models)
# a window of the evaluated examples (all ranks' shares together) is loaded, evaluated and reduced at once
WINDOW_BYTES = 64 << 20  # its examples' inputs, float32 on the host
WINDOW_EXAMPLES = 1 << 20  # and at most this many examples (the reduced per-example results: 16 bytes each)


class Watch:
    """What an evaluation asks and tells between its windows: ``stop_requested()`` (this rank's stop flag)
    and ``say(line)`` (rank 0's progress line, None elsewhere or without progress lines). A line says how
    far the evaluation has come once it has run :data:`AFTER_S` seconds, then every :data:`EVERY_S`."""

    AFTER_S = EVERY_S = 10.0

    def __init__(self, stop_requested: Callable[[], bool] = lambda: False,
                 say: Callable[[str], None] | None = None) -> None:
        self.stop_requested, self.say = stop_requested, say
        self.started = self.told = time.monotonic()

    def progress(self, what: str, done: int, total: int) -> None:
        """``evaluating after round 2: 310,000/1,000,000 clients (31%), 62 s so far, about 138 s left``, at
        most every :data:`EVERY_S` seconds once :data:`AFTER_S` have passed."""
        now = time.monotonic()
        if self.say is None or now - self.started < self.AFTER_S or now - self.told < self.EVERY_S or not done:
            return
        self.told = now
        spent = now - self.started
        self.say(f"evaluating {what}: {done:,}/{total:,} clients ({100 * done / total:.0f}%), {spent:.0f} s so far, "
                 f"about {spent * (total - done) / done:.0f} s left")


def _to_device(array: np.ndarray, device: torch.device, dtype: torch.dtype) -> Tensor:
    t = torch.from_numpy(np.ascontiguousarray(array))
    return (t.to(dtype) if t.is_floating_point() else t).to(device)


EVAL_STREAM = 0x4556434C  # "EVCL": h(seed, EVAL_STREAM, i) picks the eval.clients sample


def window_examples(input_shape: tuple[int, ...], batch: int) -> int:
    """Examples in one evaluation window: whole batches of ``batch``, at most :data:`WINDOW_BYTES` of float32
    inputs and :data:`WINDOW_EXAMPLES` examples, at least one batch."""
    per_example = 4 * max(1, int(np.prod(input_shape)))
    return batch * max(1, min(WINDOW_BYTES // per_example, WINDOW_EXAMPLES) // batch)


class ClientEval:
    """One rank's share of the per-client evaluation, built once with the run.

    What it holds between evaluations grows with the evaluated clients only (their ids and counts, 16 bytes
    a client), never with their examples: an evaluation walks the examples in windows of
    :func:`window_examples`, each loaded (an on-demand dataset reads or generates its clients then),
    evaluated and reduced before the next. A resident dataset whose evaluated examples fit one window keeps
    its share on the device, as it always has. A window is whole batches of the example sequence, so the
    batches, and each example's result, are those of evaluating all examples at once; rank 0 sums a client's
    examples once all are in (carried across windows), so the per-client sums are bit for bit the same."""

    def __init__(self, cfg: Config, world: World, source: ClientSource, blocks: list[tuple[int, int]],
                 learner: Learner, block: ClientBlock) -> None:
        self.cfg, self.world, self.source, self.dtype = cfg, world, source, block.dtype
        self.learner, self.block = learner, block  # the model, and the clients this rank trains (fine-tuning)
        self.classification = learner.classification
        self.ids = sample_clients(source.num_clients, cfg.eval.clients, cfg.run.seed, EVAL_STREAM)
        self.counts = source.test_examples[self.ids]
        self.num_clients = len(self.ids)
        self.ends = np.cumsum(self.counts)
        self.total = int(self.ends[-1]) if len(self.ends) else 0
        step = window_examples(tuple(source.task.input_shape), cfg.eval.batch_size)
        self.windows = [(lo, min(self.total, lo + step)) for lo in range(0, self.total, step)] or [(0, 0)]
        self.kept = self._share(*self.windows[0]) if source.resident and len(self.windows) == 1 else None
        first, stop = blocks[world.rank]  # the evaluated clients this rank owns fine-tune
        own = (self.ids >= first) & (self.ids < stop)
        self.owned = np.flatnonzero(own)  # positions in ids
        self.owned_ids = self.ids[own]

    def _share(self, lo: int, hi: int) -> tuple[int, int, Tensor, Tensor]:
        """This rank's share of the window of examples [lo, hi): an equal contiguous share of its batches,
        as (first, end, x, y), loaded from the clients whose examples overlap it."""
        batch = self.cfg.eval.batch_size
        share = np.array_split(np.arange(-(-(hi - lo) // batch)), self.world.size)[self.world.rank]
        a_lo = lo + int(share[0]) * batch if len(share) else lo
        a_hi = min(hi, lo + (int(share[-1]) + 1) * batch) if len(share) else lo
        a, b = np.searchsorted(self.ends, a_lo, side="right"), np.searchsorted(self.ends, a_hi, side="left") + 1
        x, y = self.source.load_test(self.ids[a:b] if a_hi > a_lo else self.ids[:0])
        skip = a_lo - (int(self.ends[a - 1]) if a > 0 else 0)
        return (a_lo, a_hi, _to_device(x[skip:skip + a_hi - a_lo], self.world.device, self.dtype),
                _to_device(y[skip:skip + a_hi - a_lo], self.world.device, self.dtype))

    def evaluate(self, x: Tensor, t: int, strategy: LocalStrategy, finetune_steps: int | None = None,
                 watch: Watch | None = None) -> dict[str, np.ndarray]:
        """Collective: the per-client ``accuracy``/``loss`` of the global model ``x`` after round t (and
        ``finetuned_*`` with ``finetune_steps`` > 0, default ``eval.finetune_steps``; 0 takes the
        personalization path without steps), float64 ``[|S|]`` in the order of ``ids``, NaN where m_i = 0, on rank 0
        ({} elsewhere). One reduce per window; the personalized sums travel with the last. ``watch``: asked
        for a stop request between windows (:class:`EvaluationStopped`), told the progress."""
        watch = watch or Watch()
        steps = self.cfg.eval.finetune_steps if finetune_steps is None else finetune_steps
        personal = finetune_steps is not None or steps > 0
        n = self.num_clients
        model, loss_fn = self.learner.model, self.learner.loss_fn
        tuned = self._finetuned(x, t, strategy, steps) if personal else None
        sums = Sums(self.counts) if self.world.is_root else None
        for w, (lo, hi) in enumerate(self.windows):
            last = w + 1 == len(self.windows)
            if w and self._any_rank(watch.stop_requested()):
                raise EvaluationStopped
            buf = torch.zeros(2 * (hi - lo) + (2 * n if personal and last else 0), dtype=torch.float64,
                              device=x.device)
            a_lo, a_hi, xs, ys = self.kept or self._share(lo, hi)
            examples = evaluate_examples(model, loss_fn, x, xs, ys, self.cfg.eval.batch_size)
            buf[:2 * (hi - lo)].view(hi - lo, 2)[a_lo - lo:a_hi - lo] = examples.to(torch.float64)
            if tuned is not None and last:
                buf[2 * (hi - lo):].view(n, 2)[self.owned] = tuned
            reduce_to_root(self.world, buf)
            if sums is not None:
                host = buf.cpu().numpy()
                sums.add(host[:2 * (hi - lo)].reshape(hi - lo, 2), hi)
                if tuned is not None and last:
                    tuned_sums = host[2 * (hi - lo):].reshape(n, 2)
            watch.progress(f"after round {t + 1}", int(np.searchsorted(self.ends, hi, side="right")), n)
        if sums is None:
            return {}
        with np.errstate(invalid="ignore", divide="ignore"):
            out = {"loss": sums.sums[:, 0] / self.counts}
            if self.classification:
                out["accuracy"] = sums.sums[:, 1] / self.counts
            if personal:
                out["finetuned_loss"] = tuned_sums[:, 0] / self.counts
                if self.classification:
                    out["finetuned_accuracy"] = tuned_sums[:, 1] / self.counts
        return out

    def _any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any rank (one MAX over the ranks)."""
        box = torch.tensor([int(flag)], dtype=torch.int64, device=self.world.device)
        return bool(all_reduce(self.world, box, "max")[0])

    def _finetuned(self, x: Tensor, t: int, strategy: LocalStrategy, steps: int) -> Tensor:
        """``[owned clients, 2]``: loss and correct sums of each owned client's fine-tuned model on its own
        test examples (float64)."""
        cfg, block = self.cfg, self.block
        model, loss_fn, random_model = self.learner.model, self.learner.loss_fn, self.learner.random_model
        out = torch.zeros(len(self.owned), 2, dtype=torch.float64, device=x.device)
        rows_all = self.owned_ids - block.first  # block rows of the owned clients
        for group in range(0, len(rows_all), FINETUNE_GROUP):
            rows = rows_all[group:group + FINETUNE_GROUP]
            counts = self.counts[self.owned[group:group + FINETUNE_GROUP]]
            offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
            own_x, own_y = self.source.load_test(self.owned_ids[group:group + FINETUNE_GROUP])
            own_x, own_y = _to_device(own_x, x.device, self.dtype), _to_device(own_y, x.device, self.dtype)
            local = x.expand(len(rows), -1)
            if steps > 0:
                batches = block.batches(rows, cfg.run.seed, FINETUNE_ROUNDS + t, cfg.local.batch_size, steps, None,
                                        cfg.local.shuffle)
                seeds = DropoutSeeds(rows + block.first, cfg.run.seed, FINETUNE_ROUNDS + t) if random_model else None
                local = strategy.train(LocalPlan(start=local), batches, local_lr(cfg.local, t), cfg.local, seeds).x_end
            for j in range(len(rows)):
                a, b = offsets[j], offsets[j + 1]
                if a < b:
                    res = evaluate_examples(model, loss_fn, local[j], own_x[a:b], own_y[a:b], cfg.eval.batch_size)
                    out[group + j] = res.to(torch.float64).sum(dim=0)
        return out


class Sums:
    """Rank 0's per-client sums of the per-example (loss, correct) results, fed a window at a time.

    A client's sum is taken once all its examples are in, over its examples in order as one contiguous
    ``[m_i, 2]`` block (``numpy.add.reduceat``, as over the whole sequence at once): the examples of a client
    cut by a window's end wait for the next window."""

    def __init__(self, counts: np.ndarray) -> None:
        self.counts, self.ends = counts, np.cumsum(counts)
        self.sums = np.zeros((len(counts), 2))
        self.pending = np.zeros((0, 2))  # the examples of the clients not yet complete
        self.start = 0  # the example index of pending[0]
        self.done = 0  # clients summed so far

    def add(self, window: np.ndarray, end: int) -> None:
        """The per-example results of the examples up to ``end`` (after those fed before)."""
        rows = np.concatenate([self.pending, window]) if len(self.pending) else window
        upto = int(np.searchsorted(self.ends, end, side="right"))  # clients [done, upto) are complete now
        if upto > self.done:
            stop = int(self.ends[upto - 1]) - self.start
            clients = np.arange(self.done, upto)
            tested = clients[self.counts[clients] > 0]
            if len(tested):  # the tested clients' segments tile rows[:stop]
                starts = self.ends[tested] - self.counts[tested] - self.start
                self.sums[tested] = np.add.reduceat(rows[:stop], starts, axis=0)
            rows, self.start, self.done = rows[stop:], self.start + stop, upto
        self.pending = rows.copy()
