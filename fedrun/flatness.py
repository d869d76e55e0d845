"""``fedrun flatness RUN``: how flat the training loss is around a checkpoint's global model.

Two measures of the minimum x a run ended at, on a seeded sample of n training examples
{(a_j, y_j)}, with the model in evaluation mode (no dropout) and the run's own loss l (cross-entropy, or
1/2 squared error for regression):

    L(x) = (1/n) sum_j l(f(x; a_j), y_j),        H = nabla^2 L(x)  (d x d, never formed)

* **Top Hessian eigenvalue** lambda_max (the sharpness): power iteration on Hessian-vector products,

      v_0 = g / ||g||,  g ~ N(0, I_d) seeded;   w_k = H v_{k-1},   lambda_k = v_{k-1}^T w_k,   v_k = w_k / ||w_k||,

  stopping at the first k with |lambda_k - lambda_{k-1}| <= tol |lambda_k| or after K iterations. H v is
  forward-over-reverse differentiation, ``torch.func.jvp`` of ``torch.func.grad`` of L (one gradient's cost
  about twice, never H itself), over chunks of the sample whose results are summed in float64; the vectors,
  norms and Rayleigh quotients are float64. Power iteration finds the eigenvalue of largest magnitude:
  at a minimum (H positive semi-definite) that is the largest one.
* **Loss increase under random perturbations** of relative radius rho (the "flatness" of the minimum in
  all directions, not only the sharpest one): for M seeded directions u_m uniform on the unit sphere of
  R^d (Gaussian vectors normalised),

      Delta(rho) = (1/M) sum_m [L(x + rho ||x|| u_m) - L(x)],   std(rho) = sqrt((1/M) sum_m (Delta_m - Delta)^2).

  The same directions serve every rho. Near a minimum Delta(rho) ~ (rho ||x||)^2 tr(H) / (2 d).

Beside them: L(x) and the accuracy on the sample, and the accuracy on the run's pooled test set.

The sample: n examples drawn uniformly without replacement from the union of every client's training
examples (the run's own data config and partition), so L estimates the loss over all training data, each
example once; a cap per client instead would weight small clients more than the data does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.func import grad, jvp

from fedrun.data.client_source import ClientSource
from fedrun.errors import CheckpointError
from fedrun.export import read_global_model, rebuild_module
from fedrun.federation.build import client_data
from fedrun.training.evaluate import evaluate_examples
from fedrun.training.flat_model import FlatModel
from fedrun.training.losses import LossFn, loss_for

HVP_CHUNK = 500  # examples per Hessian-vector product pass (bounds the memory of forward-over-reverse)
TOL = 1e-3  # relative change of the eigenvalue estimate that stops the power iteration


@dataclass
class Flatness:
    """What ``fedrun flatness`` reports for one checkpoint (``as_dict`` is its JSON object)."""

    checkpoint: str
    round: int
    examples: int  # n
    seed: int
    top_eigenvalue: float  # lambda_max of H
    iterations: int  # power iterations used
    rho: list[float]
    directions: int  # M
    loss_increase: list[float]  # Delta(rho) per rho
    loss_increase_std: list[float]  # std(rho) per rho
    train_loss: float  # L(x) on the sample
    train_accuracy: float | None  # on the sample (None for regression)
    test_accuracy: float | None  # on the run's pooled test set (None for regression)

    def as_dict(self) -> dict:
        return asdict(self)


class SampleLoss:
    """L(x) over fixed examples and its Hessian-vector products (the model is kept in evaluation mode)."""

    def __init__(self, model: FlatModel, loss_fn: LossFn, inputs: Tensor, targets: Tensor,
                 batch_size: int = HVP_CHUNK) -> None:
        self.model, self.loss_fn, self.inputs, self.targets = model, loss_fn, inputs, targets
        self.batch_size = batch_size
        model.module.eval()

    def per_example(self, x: Tensor, classification: bool) -> Tensor:
        """[n, 2]: each example's loss and whether it is classified correctly, in fixed batches."""
        out = evaluate_examples(self.model, self.loss_fn, x, self.inputs, self.targets, self.batch_size,
                                classification)
        self.model.module.eval()  # evaluate_examples leaves the module in training mode
        return out

    def value(self, x: Tensor) -> float:
        """L(x), the per-example losses summed in float64."""
        return float(self.per_example(x, False)[:, 0].double().sum()) / len(self.targets)

    def hvp(self, x: Tensor, v: Tensor) -> Tensor:
        """H v in float64: jvp of grad of each chunk's summed loss, the chunks' products summed in float64."""
        out = torch.zeros(len(x), dtype=torch.float64)
        tangent = v.to(x.dtype)
        for start in range(0, len(self.targets), self.batch_size):
            a, y = self.inputs[start:start + self.batch_size], self.targets[start:start + self.batch_size]

            def chunk_loss(z: Tensor, a: Tensor = a, y: Tensor = y) -> Tensor:
                return self.loss_fn(self.model.forward(z, a), y).sum()

            out += jvp(grad(chunk_loss), (x,), (tangent,))[1].double()
        return out / len(self.targets)


def top_eigenvalue(hvp: Callable[[Tensor], Tensor], dim: int, iterations: int, seed: int,
                   tol: float = TOL) -> tuple[float, int]:
    """(lambda, iterations used) of power iteration on ``hvp`` (v -> H v, float64) from a seeded start."""
    v = torch.from_numpy(np.random.default_rng((seed, 1)).standard_normal(dim))
    v /= v.norm()
    estimate = float("nan")
    for k in range(1, iterations + 1):
        w = hvp(v)
        previous, estimate = estimate, float(v @ w)
        norm = w.norm()
        if abs(estimate - previous) <= tol * abs(estimate) or norm == 0:
            return estimate, k
        v = w / norm
    return estimate, iterations


def random_directions(dim: int, count: int, seed: int) -> Tensor:
    """[count, dim] float64: ``count`` seeded directions uniform on the unit sphere of R^dim."""
    g = torch.from_numpy(np.random.default_rng((seed, 2)).standard_normal((count, dim)))
    return g / g.norm(dim=1, keepdim=True)


def loss_increase(loss: Callable[[Tensor], float], x: Tensor, rhos: Sequence[float], count: int,
                  seed: int) -> tuple[list[float], list[float]]:
    """(Delta(rho), std(rho)) for every rho: the mean and std over ``count`` seeded directions u of
    L(x + rho ||x|| u) - L(x)."""
    base, radius = loss(x), float(x.double().norm())
    us = random_directions(len(x), count, seed)
    means, stds = [], []
    for rho in rhos:
        rises = np.array([loss((x.double() + rho * radius * u).to(x.dtype)) - base for u in us])
        means.append(float(rises.mean()))
        stds.append(float(rises.std()))
    return means, stds


def sample_examples(source: ClientSource, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` training examples (all when fewer) drawn uniformly without replacement from the union of
    every client's, in client order; each client's examples are loaded only when one of them is drawn."""
    sizes = source.num_examples
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    picks = np.sort(np.random.default_rng((seed, 0)).choice(int(offsets[-1]), size=min(count, int(offsets[-1])),
                                                            replace=False))
    owner = np.searchsorted(offsets, picks, side="right") - 1
    xs, ys = [], []
    for client in np.unique(owner):
        x, y = source.load(np.array([client]))
        local = picks[owner == client] - offsets[client]
        xs.append(x[local])
        ys.append(y[local])
    return np.concatenate(xs), np.concatenate(ys)


def measure_flatness(source: str | Path, examples: int = 2000, rho: Sequence[float] = (0.01, 0.05, 0.1),
                     directions: int = 10, iterations: int = 20, seed: int = 0) -> Flatness:
    """The flatness measures of the global model of ``source`` (a run directory: its newest valid
    checkpoint; or a checkpoint file), on the CPU."""
    saved = read_global_model(source)
    cfg = saved.cfg
    data = client_data(cfg, cfg.run.seed)  # the run's own clients; checks that the model fits the data
    module = rebuild_module(saved, data.task.input_shape, data.task.num_classes)
    dtype = next(module.parameters()).dtype
    classification = data.task.task == "classification"
    model, loss_fn = FlatModel(module), loss_for(data.task.task)
    x = saved.x.to(dtype)
    if not bool(torch.isfinite(x).all()):
        raise CheckpointError(f"{saved.checkpoint}: server/x has non-finite values; expected a trained model")

    def tensors(a: np.ndarray, y: np.ndarray) -> tuple[Tensor, Tensor]:
        a, y = torch.as_tensor(a), torch.as_tensor(y)
        return (a.to(dtype) if a.is_floating_point() else a), (y if classification else y.to(dtype))

    train = SampleLoss(model, loss_fn, *tensors(*sample_examples(data, examples, seed)))
    test = SampleLoss(model, loss_fn, *tensors(data.task.x_test, data.task.y_test), cfg.eval.batch_size)
    fit = train.per_example(x, classification).double().mean(dim=0)
    eigenvalue, used = top_eigenvalue(lambda v: train.hvp(x, v), len(x), iterations, seed)
    means, stds = loss_increase(train.value, x, rho, directions, seed)
    return Flatness(
        checkpoint=str(saved.checkpoint), round=saved.rounds, examples=len(train.targets), seed=seed,
        top_eigenvalue=eigenvalue, iterations=used, rho=[float(r) for r in rho], directions=directions,
        loss_increase=means, loss_increase_std=stds, train_loss=float(fit[0]),
        train_accuracy=float(fit[1]) if classification else None,
        test_accuracy=float(test.per_example(x, True)[:, 1].double().mean()) if classification else None)


def format_flatness(f: Flatness) -> str:
    """The short table ``fedrun flatness`` prints."""
    def pct(a: float | None) -> str:
        return "-" if a is None else f"{100 * a:.2f}%"

    lines = [f"flatness of {f.checkpoint} (after round {f.round}; {f.examples} training examples drawn across "
             f"all clients, seed {f.seed}; model in eval mode)",
             f"  top Hessian eigenvalue   {f.top_eigenvalue:.6g}   (power iteration: {f.iterations} iterations)",
             f"  train loss               {f.train_loss:.6g}   accuracy {pct(f.train_accuracy)} (the sample)",
             f"  test accuracy            {pct(f.test_accuracy)}",
             f"  loss increase L(x + rho ||x|| u) - L(x), mean and std over {f.directions} random directions u:",
             f"  {'rho':>8}  {'mean':>12}  {'std':>12}"]
    lines += [f"  {r:>8g}  {m:>12.6g}  {s:>12.6g}" for r, m, s in zip(f.rho, f.loss_increase, f.loss_increase_std,
                                                                       strict=True)]
    return "\n".join(lines)
