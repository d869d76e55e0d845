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
* ONE reduce brings rank 0 the per-example results and the personalized per-client sums (each entry
  comes from one rank, the others add exact zeros), and rank 0 sums the examples of each client in
  float64: the per-client results are bit-identical on any number of ranks.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedrun.config import Config
from fedrun.data.client_block import ClientBlock
from fedrun.data.client_source import ClientSource, sample_clients
from fedrun.protocol import LocalPlan
from fedrun.runtime.flat import reduce_to_root
from fedrun.runtime.world import World
from fedrun.training.evaluate import evaluate_examples
from fedrun.training.flat_model import FlatModel
from fedrun.training.gradients import local_oracle
from fedrun.training.local import run_local
from fedrun.training.losses import LossFn
from fedrun.training.schedule import local_lr

FINETUNE_ROUNDS = 1 << 40  # fine-tuning after round t draws its batches as "round" FINETUNE_ROUNDS + t
FINETUNE_GROUP = 64  # clients fine-tuned together (bounds the [C, d] local models)


def _to_device(array: np.ndarray, device: torch.device, dtype: torch.dtype) -> Tensor:
    t = torch.from_numpy(np.ascontiguousarray(array))
    return (t.to(dtype) if t.is_floating_point() else t).to(device)


EVAL_STREAM = 0x4556434C  # "EVCL": h(seed, EVAL_STREAM, i) picks the eval.clients sample


class ClientEval:
    """One rank's share of the per-client evaluation, built once with the run."""

    def __init__(self, cfg: Config, world: World, source: ClientSource, blocks: list[tuple[int, int]],
                 dtype: torch.dtype, classification: bool) -> None:
        self.cfg, self.world, self.dtype, self.classification = cfg, world, dtype, classification
        self.ids = sample_clients(source.num_clients, cfg.eval.clients, cfg.run.seed, EVAL_STREAM)
        self.counts = source.test_examples[self.ids]
        self.num_clients = len(self.ids)
        ends = np.cumsum(self.counts)
        self.total = int(ends[-1]) if len(ends) else 0
        batch = cfg.eval.batch_size
        share = np.array_split(np.arange(-(-self.total // batch)), world.size)[world.rank]
        self.lo = int(share[0]) * batch if len(share) else 0
        self.hi = min(self.total, (int(share[-1]) + 1) * batch) if len(share) else 0
        # the clients whose examples overlap [lo, hi), loaded and cut to the share
        a, b = np.searchsorted(ends, self.lo, side="right"), np.searchsorted(ends, self.hi, side="left") + 1
        x, y = source.load_test(self.ids[a:b]) if self.hi > self.lo else source.load_test(self.ids[:0])
        skip = self.lo - (int(ends[a - 1]) if a > 0 else 0)
        self.x = _to_device(x[skip:skip + self.hi - self.lo], world.device, dtype)
        self.y = _to_device(y[skip:skip + self.hi - self.lo], world.device, dtype)
        first, stop = blocks[world.rank]  # the evaluated clients this rank owns fine-tune
        own = (self.ids >= first) & (self.ids < stop)
        self.owned = np.flatnonzero(own)  # positions in ids
        self.owned_ids = self.ids[own]
        self.own_offsets = np.concatenate([[0], np.cumsum(self.counts[own])]).astype(np.int64)
        own_x, own_y = source.load_test(self.owned_ids)
        self.own_x = _to_device(own_x, world.device, dtype)
        self.own_y = _to_device(own_y, world.device, dtype)

    def evaluate(self, model: FlatModel, loss_fn: LossFn, x: Tensor, t: int, block: ClientBlock, strategy: str,
                 random_model: bool, finetune_steps: int | None = None) -> dict[str, np.ndarray]:
        """Collective: the per-client ``accuracy``/``loss`` of the global model ``x`` after round t (and
        ``finetuned_*`` with ``finetune_steps`` > 0, default ``eval.finetune_steps``; 0 takes the
        personalization path without steps), float64 ``[|S|]`` in the order of ``ids``, NaN where m_i = 0, on rank 0
        ({} elsewhere)."""
        steps = self.cfg.eval.finetune_steps if finetune_steps is None else finetune_steps
        personal = finetune_steps is not None or steps > 0
        n = self.num_clients
        buf = torch.zeros(2 * self.total + (2 * n if personal else 0), dtype=torch.float64, device=x.device)
        examples = evaluate_examples(model, loss_fn, x, self.x, self.y, self.cfg.eval.batch_size,
                                     self.classification)
        buf[:2 * self.total].view(self.total, 2)[self.lo:self.hi] = examples.to(torch.float64)
        if personal:
            sums = self._finetuned(model, loss_fn, x, t, block, strategy, random_model, steps)
            buf[2 * self.total:].view(n, 2)[self.owned] = sums
        reduce_to_root(self.world, buf)
        if not self.world.is_root:
            return {}
        host = buf.cpu().numpy()
        per_example = host[:2 * self.total].reshape(self.total, 2)
        starts, tested = np.concatenate([[0], np.cumsum(self.counts)[:-1]]), self.counts > 0
        sums = np.zeros((n, 2))
        if self.total:  # the tested clients' segments tile the examples
            sums[tested] = np.add.reduceat(per_example, starts[tested], axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            out = {"loss": sums[:, 0] / self.counts}
            if self.classification:
                out["accuracy"] = sums[:, 1] / self.counts
            if personal:
                tuned = host[2 * self.total:].reshape(n, 2)
                out["finetuned_loss"] = tuned[:, 0] / self.counts
                if self.classification:
                    out["finetuned_accuracy"] = tuned[:, 1] / self.counts
        return out

    def _finetuned(self, model: FlatModel, loss_fn: LossFn, x: Tensor, t: int, block: ClientBlock, strategy: str,
                   random_model: bool, steps: int) -> Tensor:
        """``[owned clients, 2]``: loss and correct sums of each owned client's fine-tuned model on its own
        test examples (float64)."""
        cfg = self.cfg
        out = torch.zeros(len(self.owned), 2, dtype=torch.float64, device=x.device)
        rows_all = self.owned_ids - block.first  # block rows of the owned clients
        for group in range(0, len(rows_all), FINETUNE_GROUP):
            rows = rows_all[group:group + FINETUNE_GROUP]
            local = x.expand(len(rows), -1)
            if steps > 0:
                batches = block.batches(rows, cfg.run.seed, FINETUNE_ROUNDS + t, cfg.local.batch_size, steps, None,
                                        cfg.local.shuffle)
                oracle, group_size = local_oracle(strategy, model, loss_fn, batches, rows + block.first,
                                                  cfg.run.seed, FINETUNE_ROUNDS + t, reseed=random_model)
                local = run_local(LocalPlan(start=local), oracle, batches.sizes > 0, local_lr(cfg.local, t), cfg.local,
                                  group_size=group_size).x_end
            for j in range(len(rows)):
                c = group + j
                a, b = self.own_offsets[c], self.own_offsets[c + 1]
                if a < b:
                    res = evaluate_examples(model, loss_fn, local[j], self.own_x[a:b], self.own_y[a:b],
                                            cfg.eval.batch_size, self.classification)
                    out[c] = res.to(torch.float64).sum(dim=0)
        return out
