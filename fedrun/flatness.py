"""``fedrun flatness RUN``: how flat the training loss is around a checkpoint's global model.

Two measures of the model x a run ended at, on a seeded sample of n training examples
{(a_j, y_j)}, with the model in evaluation mode (no dropout) and the run's own loss l (cross-entropy, or
1/2 squared error for regression):

    L(x) = (1/n) sum_j l(f(x; a_j), y_j),        H = nabla^2 L(x)  (d x d, never formed)

* **Top Hessian eigenvalue** lambda_max (the sharpness): Lanczos, ``scipy.sparse.linalg.eigsh`` (ARPACK,
  implicitly restarted, ``which="LA"``: the largest algebraic eigenvalue, the sharpest direction also away
  from a minimum) on a ``LinearOperator`` whose matvec is the Hessian-vector product, from a seeded start,
  with ARPACK's tolerance EIG_TOL and at most ``max_hvps`` products. The answer is then checked on its
  own: one more product gives the residual

      r = ||H v - lambda v|| / |lambda|     (v the unit Ritz vector),

  and since H is symmetric some eigenvalue of H lies within ||H v - lambda v|| of lambda: a residual at
  most RESIDUAL_TOL = 1e-3 means lambda is an eigenvalue to 0.1%. ``converged`` says whether it is
  (ARPACK stopping short of the cap gives the partial Ritz value, flagged, not an error). H v is
  forward-over-reverse differentiation, ``torch.func.jvp`` of ``torch.func.grad`` of L (one gradient's
  cost about twice), over chunks of the sample whose products are summed in float64.
* **Loss increase under filter-normalized antithetic perturbations** (the flatness in all directions, not
  only the sharpest one): for M seeded Gaussian directions u_m, each filter-normalized (Li et al. 2018,
  "Visualizing the loss landscape of neural nets"): for every parameter tensor with two or more axes, each
  filter (a slice along its first, output axis) of u_m is rescaled to the norm of the same filter of x,

      d_m[f] = u_m[f] / ||u_m[f]|| * ||x[f]||,     d_m = 0 on one-axis tensors (biases, norm scales),

  so that a layer whose weights a ReLU network's rescaling symmetry multiplies by alpha (and the next
  divides) gets a direction multiplied by alpha too, and the measure does not change; and antithetic
  (+d, -d), so that every odd-order term of the Taylor series, the gradient term first, cancels:

      Delta_m(rho) = [L(x + rho d_m) + L(x - rho d_m)] / 2 - L(x) = (rho^2 / 2) d_m^T H d_m + O(rho^4),
      Delta(rho) = (1/M) sum_m Delta_m(rho),   std(rho) = sqrt((1/M) sum_m (Delta_m - Delta)^2).

  The same directions serve every rho. For a quadratic L the first equation is exact at every x.

Beside them: L(x) and the accuracy on the sample, and the accuracy on the run's pooled test set. The top
eigenvalue is *not* invariant to the rescaling symmetry (H changes with it); the loss increase is.

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
from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, eigsh
from torch import Tensor
from torch.func import grad, jvp

from fedrun.data.client_source import ClientSource
from fedrun.errors import CheckpointError
from fedrun.export import SavedModel, read_global_model, rebuild_module
from fedrun.federation.build import client_data
from fedrun.training.evaluate import evaluate_examples
from fedrun.training.flat_model import FlatModel
from fedrun.training.losses import LossFn, loss_for

HVP_CHUNK = 500  # examples per Hessian-vector product pass (bounds the memory of forward-over-reverse)
EIG_TOL = 1e-4  # ARPACK's relative tolerance on the Ritz value
RESIDUAL_TOL = 1e-3  # the checked residual ||H v - lambda v|| / |lambda| that counts as converged
LANCZOS_BASIS = 20  # ARPACK's ncv: Lanczos vectors kept between restarts


@dataclass
class Flatness:
    """What ``fedrun flatness`` reports for one checkpoint (``as_dict`` is its JSON object)."""

    checkpoint: str
    round: int
    examples: int  # n
    seed: int
    top_eigenvalue: float  # lambda_max of H (the largest algebraic eigenvalue)
    hvps: int  # Hessian-vector products Lanczos used (the residual check's one not counted)
    residual: float  # ||H v - lambda v|| / |lambda|, measured with one more product
    converged: bool  # residual <= RESIDUAL_TOL
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

    @property
    def dtype(self) -> torch.dtype:
        """The model's parameter dtype (the sample's inputs are in it)."""
        return next(self.model.module.parameters()).dtype

    def per_example(self, x: Tensor) -> Tensor:
        """[n, 2]: each example's loss and whether it is classified correctly, in fixed batches."""
        out = evaluate_examples(self.model, self.loss_fn, x, self.inputs, self.targets, self.batch_size)
        self.model.module.eval()  # evaluate_examples leaves the module in training mode
        return out

    def fit(self, x: Tensor) -> Tensor:
        """[L(x), accuracy] in float64: the per-example means."""
        return self.per_example(x).double().mean(dim=0)

    def value(self, x: Tensor) -> float:
        """L(x), the per-example losses summed in float64."""
        return float(self.per_example(x)[:, 0].double().sum()) / len(self.targets)

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


@dataclass(frozen=True)
class Eigen:
    """The top eigenvalue Lanczos found, its unit vector, the products it used and the checked residual."""

    value: float
    vector: np.ndarray
    hvps: int
    residual: float

    @property
    def converged(self) -> bool:
        return bool(self.residual <= RESIDUAL_TOL)


def top_eigenvalue(hvp: Callable[[Tensor], Tensor], dim: int, max_hvps: int, seed: int,
                   tol: float = EIG_TOL) -> Eigen:
    """The largest algebraic eigenvalue of the symmetric operator ``hvp`` (v -> H v, float64, ``dim`` >= 2)
    by ``scipy.sparse.linalg.eigsh`` from a seeded start, and its residual checked with one product more
    (module docstring). ARPACK counts restarts, not products: it gets max(1, max_hvps // (ncv - 1))
    restarts of at most ncv - 1 products each, so it uses about ``max_hvps`` products at most (the count
    used is returned). Running out of restarts gives ARPACK's partial Ritz pair (or the start vector's
    Rayleigh quotient if it has none), flagged by its residual, not an error."""
    count = 0

    def matvec(v: np.ndarray) -> np.ndarray:
        nonlocal count
        count += 1
        return hvp(torch.from_numpy(np.ascontiguousarray(v, dtype=np.float64).reshape(-1))).numpy()

    operator = LinearOperator((dim, dim), matvec=matvec, dtype=np.float64)
    start = np.random.default_rng((seed, 1)).standard_normal(dim)
    ncv = min(dim, LANCZOS_BASIS)
    try:
        values, vectors = eigsh(operator, k=1, which="LA", v0=start, ncv=ncv, tol=tol,
                                maxiter=max(1, max_hvps // max(1, ncv - 1)))
        value, vector = float(values[0]), vectors[:, 0]
    except ArpackNoConvergence as exc:
        value, vector = ((float(exc.eigenvalues[-1]), exc.eigenvectors[:, -1]) if len(exc.eigenvalues)
                         else (float("nan"), start))
    used = count
    vector = vector / np.linalg.norm(vector)
    hv = hvp(torch.from_numpy(vector.copy())).numpy()
    if not np.isfinite(value):
        value = float(vector @ hv)
    residual = float(np.linalg.norm(hv - value * vector) / abs(value)) if value else float("inf")
    return Eigen(value=value, vector=vector, hvps=used, residual=residual)


def random_directions(dim: int, count: int, seed: int) -> Tensor:
    """[count, dim] float64: ``count`` seeded standard Gaussian vectors (before filter normalization)."""
    return torch.from_numpy(np.random.default_rng((seed, 2)).standard_normal((count, dim)))


def filter_normalize(u: Tensor, x: Tensor, shapes: Sequence[tuple[int, ...]]) -> Tensor:
    """Li et al.'s filter normalization of the flat direction ``u`` against the flat model ``x`` (parameter
    tensors of ``shapes`` in order): each filter (first-axis slice) of a tensor with two or more axes gets
    the norm of x's same filter; one-axis tensors get 0. A zero filter of x gives a zero filter of d."""
    out = torch.zeros_like(u, dtype=torch.float64)
    start = 0
    for shape in shapes:
        size = int(np.prod(shape))
        if len(shape) >= 2:
            d = u[start:start + size].double().reshape(shape[0], -1)
            w = x[start:start + size].double().reshape(shape[0], -1)
            scale = w.norm(dim=1, keepdim=True) / d.norm(dim=1, keepdim=True).clamp_min(1e-300)
            out[start:start + size] = (d * scale).reshape(-1)
        start += size
    return out


def loss_increase(loss: Callable[[Tensor], float], x: Tensor, shapes: Sequence[tuple[int, ...]],
                  rhos: Sequence[float], count: int, seed: int) -> tuple[list[float], list[float]]:
    """(Delta(rho), std(rho)) for every rho: the mean and std over ``count`` seeded filter-normalized
    directions d of the antithetic rise [L(x + rho d) + L(x - rho d)] / 2 - L(x)."""
    base = loss(x)
    ds = [filter_normalize(u, x, shapes) for u in random_directions(len(x), count, seed)]
    means, stds = [], []
    for rho in rhos:
        rises = np.array([(loss((x.double() + rho * d).to(x.dtype)) + loss((x.double() - rho * d).to(x.dtype))) / 2
                          - base for d in ds])
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


def _sample_and_test_losses(saved: SavedModel, examples: int, seed: int) -> tuple[SampleLoss, SampleLoss, bool]:
    """L on the seeded sample of ``examples`` training examples and on the pooled test set, for the run
    ``saved`` comes from (its data config and partition, its model), and whether the task classifies."""
    cfg = saved.cfg
    data = client_data(cfg, cfg.run.seed)  # the run's own clients; checks that the model fits the data
    module = rebuild_module(saved, data.task.input_shape, data.task.num_classes)
    dtype = next(module.parameters()).dtype
    classification = data.task.task == "classification"
    model, loss_fn = FlatModel(module), loss_for(data.task.task)

    def tensors(a: np.ndarray, y: np.ndarray) -> tuple[Tensor, Tensor]:
        a, y = torch.as_tensor(a), torch.as_tensor(y)
        return (a.to(dtype) if a.is_floating_point() else a), (y if classification else y.to(dtype))

    train = SampleLoss(model, loss_fn, *tensors(*sample_examples(data, examples, seed)))
    test = SampleLoss(model, loss_fn, *tensors(data.task.x_test, data.task.y_test), cfg.eval.batch_size)
    return train, test, classification


def measure_flatness(source: str | Path, examples: int = 2000, rho: Sequence[float] = (0.01, 0.05, 0.1),
                     directions: int = 10, max_hvps: int = 200, seed: int = 0) -> Flatness:
    """The flatness measures of the global model of ``source`` (a run directory: its newest valid
    checkpoint; or a checkpoint file), on the CPU."""
    saved = read_global_model(source)
    train, test, classification = _sample_and_test_losses(saved, examples, seed)
    x = saved.x.to(train.dtype)
    if not bool(torch.isfinite(x).all()):
        raise CheckpointError(f"{saved.checkpoint}: server/x has non-finite values; expected a trained model")
    fit = train.fit(x)
    eig = top_eigenvalue(lambda v: train.hvp(x, v), len(x), max_hvps, seed)
    means, stds = loss_increase(train.value, x, train.model.shapes, rho, directions, seed)
    return Flatness(
        checkpoint=str(saved.checkpoint), round=saved.rounds, examples=len(train.targets), seed=seed,
        top_eigenvalue=eig.value, hvps=eig.hvps, residual=eig.residual, converged=eig.converged,
        rho=[float(r) for r in rho], directions=directions,
        loss_increase=means, loss_increase_std=stds, train_loss=float(fit[0]),
        train_accuracy=float(fit[1]) if classification else None,
        test_accuracy=float(test.per_example(x)[:, 1].double().mean()) if classification else None)


def sample_losses(checkpoints: Sequence[str | Path], examples: int = 2000, seed: int = 0) -> list[float]:
    """L(x) at each of ``checkpoints`` (checkpoint files of one run) on the sample ``measure_flatness`` draws
    with the same ``examples`` and ``seed``, each value the bits of its ``train_loss``; the data are built
    once. It places a run's checkpoints on one training-loss scale, so that flatness can be compared
    between models that reached the same training loss, not only the same round."""
    saved = [read_global_model(c) for c in checkpoints]
    if not saved:
        return []
    first = saved[0]

    def run_of(s: SavedModel) -> tuple:
        return s.cfg.data, s.cfg.model, s.cfg.run.seed, s.cfg.run.dtype

    for s in saved[1:]:
        if run_of(s) != run_of(first):
            raise CheckpointError(f"{s.checkpoint}: not a checkpoint of the run of {first.checkpoint} "
                                  "(its data, model, seed or dtype differ); expected checkpoints of one run")
    train = _sample_and_test_losses(first, examples, seed)[0]
    return [float(train.fit(s.x.to(train.dtype))[0]) for s in saved]


def format_flatness(f: Flatness) -> str:
    """The short table ``fedrun flatness`` prints."""
    def pct(a: float | None) -> str:
        return "-" if a is None else f"{100 * a:.2f}%"

    lines = [f"flatness of {f.checkpoint} (after round {f.round}; {f.examples} training examples drawn across "
             f"all clients, seed {f.seed}; model in eval mode)",
             f"  top Hessian eigenvalue   {f.top_eigenvalue:.6g}   (Lanczos: {f.hvps} Hessian-vector products, "
             f"residual {f.residual:.2g}, {'converged' if f.converged else 'NOT converged'} at {RESIDUAL_TOL:g})",
             f"  train loss               {f.train_loss:.6g}   accuracy {pct(f.train_accuracy)} (the sample)",
             f"  test accuracy            {pct(f.test_accuracy)}",
             f"  loss increase [L(x + rho d) + L(x - rho d)]/2 - L(x), mean and std over {f.directions} "
             "filter-normalized random directions d:",
             f"  {'rho':>8}  {'mean':>12}  {'std':>12}"]
    lines += [f"  {r:>8g}  {m:>12.6g}  {s:>12.6g}" for r, m, s in zip(f.rho, f.loss_increase, f.loss_increase_std,
                                                                       strict=True)]
    return "\n".join(lines)
