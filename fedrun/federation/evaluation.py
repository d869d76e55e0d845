"""Evaluation of the global model after a round: on the pooled test set, and per client.

After round t when t + 1 = T (``run.rounds``) or ``eval.every`` > 0 divides t + 1, the new global model x is
evaluated on the pooled test set, each rank on its shard of whole batches of ``eval.batch_size``; the
per-example losses l_j and hits c_j are summed exactly over the ranks, so

    test_loss = (1/n) sum_j l_j,    test_accuracy = (1/n) sum_j c_j

are the same bits on any number of ranks. With per-client test data the distribution over clients of their
own figures is added (:class:`~fedrun.federation.client_eval.ClientEval`, docs/evaluation.md). A stop request
during the per-client evaluation ends it between two windows of clients, on every rank: the round's record
then holds the pooled figures only, and the run stops after that round with its checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from fedrun.config import EvalConfig
from fedrun.errors import EvaluationStopped
from fedrun.federation.client_eval import ClientEval, Watch
from fedrun.federation.client_trainer import Learner
from fedrun.metrics.per_client import summary
from fedrun.runtime.exact_sum import all_reduce_exact_sum
from fedrun.runtime.world import World
from fedrun.training.evaluate import evaluate_examples
from fedrun.training.local_strategy import LocalStrategy

CLIENT_ARRAYS = "_client_arrays"  # entry key of the per-client arrays of an evaluation (the loop takes them out)


@dataclass
class Evaluation:
    """What a round's evaluation reads: the model and this rank's test shard, ``eval``, T, and the per-client
    evaluation (None without per-client test data)."""

    learner: Learner
    world: World
    eval: EvalConfig
    rounds: int  # T
    clients: ClientEval | None = None
    say: Callable[[str], None] | None = None  # rank 0's progress lines (None: silent)
    stopped: bool = False  # a stop request ended the newest per-client evaluation early

    def due(self, t: int) -> bool:
        """Evaluate after round t: every ``eval.every`` rounds and after the last one."""
        every = self.eval.every
        return t + 1 == self.rounds or (every > 0 and (t + 1) % every == 0)

    def after_round(self, x: Tensor, t: int, strategy: LocalStrategy,
                    stop_requested: Callable[[], bool] = lambda: False) -> dict[str, Any]:
        """The figures of model ``x`` after round t (collective), the per-client arrays under
        :data:`CLIENT_ARRAYS` (rank 0); without the per-client figures, and with :attr:`stopped` set, when
        ``stop_requested()`` held on some rank between two windows of clients."""
        out: dict[str, Any] = self.pooled(x)
        self.stopped = False
        if self.clients is not None:
            try:
                out.update(self.per_client(x, t, strategy, Watch(stop_requested, self.say)))
            except EvaluationStopped:
                self.stopped = True
        return out

    def pooled(self, x: Tensor) -> dict[str, float]:
        """Test loss (and accuracy) of model ``x`` on the pooled test set (see the module docstring)."""
        learner = self.learner
        examples = evaluate_examples(learner.model, learner.loss_fn, x, learner.test_x, learner.test_y,
                                     self.eval.batch_size)
        count = learner.num_test
        loss, correct = (float(v) for v in all_reduce_exact_sum(self.world, examples, max(count, 1)))
        out = {"test_loss": loss / count}
        if learner.classification:
            out["test_accuracy"] = correct / count
        return out

    def per_client(self, x: Tensor, t: int, strategy: LocalStrategy, watch: Watch | None = None) -> dict[str, Any]:
        """The distribution over clients of their own test figures after round t (fedrun.metrics.per_client),
        with the per-client arrays under :data:`CLIENT_ARRAYS` (rank 0; collective)."""
        arrays = self.clients.evaluate(x, t, strategy, watch=watch)
        if not arrays:
            return {}
        return {**summary(arrays, self.clients.counts), CLIENT_ARRAYS: arrays}
