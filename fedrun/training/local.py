"""The local solver: K steps of a block of C clients over flat vectors (ALGORITHMS.md 0.3).

Each step k of client i, with g the raw minibatch gradient at the current local point:

    g   <- g * min(1, clip / ||g||)              (if local.grad_clip > 0; FedAdamom code)
    u   <- g + correction_i + weight_decay * x    (correction from the algorithm's plan)
    SGD:      buf <- momentum * buf + u ; x <- x - lr * lr_scale * buf   (buf = u without momentum)
    AMSGrad:  m <- b1 m + (1-b1) u ; v <- b2 v + (1-b2) u^2 ; vhat <- max(vhat, v)
              x <- x - lr * lr_scale * m / (sqrt(vhat) + eps)           (FAdamGC, section 5)
    LocalRule: direction, state <- rule.step(k, x, u, state, grad_at) ; x <- x - lr * lr_scale * direction
              (FedCAda's client Adam, FAFED's STORM; see fedrun.algorithms.base.LocalRule)

It returns the end points, the mean of the raw gradients (SCAFFOLD's c_i+, FedSUM's h_i) and the
mean loss. Clients with fewer local steps than others (epochs mode) are frozen once they finish.

The clients are processed in groups of rows: one group of all C rows for the vectorized oracle, one
row at a time for the sequential one, so that a client's K steps run back to back on vectors that
stay in cache (the arithmetic per row is the same either way). Updates are in place on row views.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fedrun.algorithms.base import AMSGrad, LocalPlan, LocalResult, LocalRule
from fedrun.config import LocalConfig
from fedrun.training.gradients import Oracle


@dataclass
class _Optimizer:
    """The local optimizer of one round: at most one of ``amsgrad`` and ``rule``; SGD otherwise."""

    amsgrad: AMSGrad | None
    rule: LocalRule | None
    momentum: float


def run_local(plan: LocalPlan, oracle: Oracle, step_active: Tensor, lr: float, cfg: LocalConfig,
              group_size: int | None = None) -> LocalResult:
    """``step_active`` [C, K] bool: whether client c takes step k; ``group_size`` rows per oracle call."""
    x = plan.start.clone()
    if plan.steps is not None:
        step_active = step_active[:, :plan.steps]
    num_clients = x.shape[0]
    grad_sum = torch.zeros_like(x)
    loss_sum = torch.zeros(num_clients, dtype=x.dtype, device=x.device)
    step = lr * plan.lr_scale
    if isinstance(step, Tensor):  # per-client scale [C]
        step = step.to(x.dtype).unsqueeze(1)
    amsgrad = plan.optimizer if isinstance(plan.optimizer, AMSGrad) else None
    rule = None if amsgrad is not None or plan.optimizer == "sgd" else plan.optimizer
    state: dict[str, Tensor] = {}
    if rule is not None:
        state = rule.init(x, plan.optimizer_state)
    elif amsgrad is not None:
        state = {key: value.clone() for key, value in (plan.optimizer_state or {}).items()}
        for key in ("m", "v", "vhat"):
            state.setdefault(key, torch.zeros_like(x))
    elif cfg.momentum > 0 and plan.move:
        state = {"momentum": torch.zeros_like(x)}
    opt = _Optimizer(amsgrad, rule, cfg.momentum)
    group = group_size or num_clients
    for start in range(0, num_clients, group):
        rows = slice(start, min(num_clients, start + group))
        _run_rows(rows, x, grad_sum, loss_sum, {k: v[rows] for k, v in state.items()}, plan,
                  step[rows] if isinstance(step, Tensor) else step, step_active[rows], oracle, opt, cfg)
    counts = step_active.sum(dim=1).clamp_min(1).to(x.dtype)
    return LocalResult(x_end=x, grad_mean=grad_sum / counts.unsqueeze(1), loss=loss_sum / counts,
                       optimizer_state=state if amsgrad is not None or rule is not None else {})


def _run_rows(rows: slice, x: Tensor, grad_sum: Tensor, loss_sum: Tensor, state: dict[str, Tensor],
              plan: LocalPlan, step: float | Tensor, active_steps: Tensor, oracle: Oracle,
              opt: _Optimizer, cfg: LocalConfig) -> None:
    xs, gs, ls = x[rows], grad_sum[rows], loss_sum[rows]
    correction = None if plan.correction is None else plan.correction[rows]
    ragged = not bool(active_steps.all())

    def processed(g: Tensor, point: Tensor) -> Tensor:
        """u = clip(g) + correction + weight_decay * point."""
        u = g if correction is None else g + correction
        return u + cfg.weight_decay * point if cfg.weight_decay > 0 else u

    for k in range(active_steps.shape[1]):
        g, loss = oracle(xs, rows, k)
        if cfg.grad_clip > 0:
            g = _clip(g, cfg.grad_clip)
        mask = active_steps[:, k].to(x.dtype).unsqueeze(1) if ragged else None
        gs.add_(g * mask if ragged else g)
        ls.add_(loss * mask[:, 0] if ragged else loss)
        if not plan.move:
            continue
        u = processed(g, xs)
        if opt.rule is not None:
            def grad_at(point: Tensor, k: int = k) -> Tensor:
                h = oracle(point, rows, k)[0]
                return processed(_clip(h, cfg.grad_clip) if cfg.grad_clip > 0 else h, point)

            direction, new = opt.rule.step(k, xs, u, state, grad_at)
            for key, value in new.items():
                _assign(state[key], value, mask)
        elif opt.amsgrad is not None:
            direction = _amsgrad_step(state, u, opt.amsgrad, mask)
        elif "momentum" in state:
            buf = opt.momentum * state["momentum"] + u
            _assign(state["momentum"], buf, mask)
            direction = buf
        else:
            direction = u
        if ragged:
            direction = direction * mask
        if isinstance(step, Tensor):
            xs.sub_(step * direction)
        else:
            xs.sub_(direction, alpha=step)


def _clip(g: Tensor, clip: float) -> Tensor:
    norms = g.norm(dim=1, keepdim=True)
    return g * torch.clamp(clip / norms.clamp_min(1e-30), max=1.0)


def _assign(target: Tensor, value: Tensor, mask: Tensor | None) -> None:
    """``target <- value`` on the rows whose step is active (all rows when ``mask`` is None)."""
    if mask is None:
        target.copy_(value)
    else:
        target.add_(mask * (value - target))


def _amsgrad_step(state: dict[str, Tensor], u: Tensor, opt: AMSGrad, mask: Tensor | None) -> Tensor:
    m = opt.beta1 * state["m"] + (1 - opt.beta1) * u
    v = opt.beta2 * state["v"] + (1 - opt.beta2) * u * u
    vhat = torch.maximum(state["vhat"], v)
    for key, value in (("m", m), ("v", v), ("vhat", vhat)):
        _assign(state[key], value, mask)
    return m / (vhat.sqrt() + opt.eps)
