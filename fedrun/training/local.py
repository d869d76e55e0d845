"""The local solver: K steps of a block of C clients over flat vectors (ALGORITHMS.md 0.3).

Each step k of client i, with g the raw minibatch gradient at the current local point:

    g   <- g * min(1, clip / ||g||)              (if local.grad_clip > 0; FedAdamom code)
    u   <- g + correction_i + weight_decay * x    (correction from the algorithm's plan)
    SGD:      buf <- momentum * buf + u ; x <- x - lr * lr_scale * buf   (buf = u without momentum)
    AMSGrad:  m <- b1 m + (1-b1) u ; v <- b2 v + (1-b2) u^2 ; vhat <- max(vhat, v)
              x <- x - lr * lr_scale * m / (sqrt(vhat) + eps)           (FAdamGC, section 5)

It returns the end points, the mean of the raw gradients (SCAFFOLD's c_i+, FedSUM's h_i) and the
mean loss. Clients with fewer local steps than others (epochs mode) are frozen once they finish.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedrun.algorithms.base import AMSGrad, LocalPlan, LocalResult
from fedrun.config import LocalConfig
from fedrun.training.gradients import Oracle


def run_local(plan: LocalPlan, oracle: Oracle, step_active: Tensor, lr: float, cfg: LocalConfig) -> LocalResult:
    """``step_active`` [C, K] bool: whether client c takes step k."""
    x = plan.start.clone()
    if plan.steps is not None:
        step_active = step_active[:, :plan.steps]
    num_steps = step_active.shape[1]
    ragged = not bool(step_active.all())
    grad_sum = torch.zeros_like(x)
    loss_sum = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)
    step = lr * plan.lr_scale
    if isinstance(step, Tensor):  # per-client scale [C]
        step = step.to(x.dtype).unsqueeze(1)
    amsgrad = plan.optimizer if isinstance(plan.optimizer, AMSGrad) else None
    rule = None if amsgrad is not None or plan.optimizer == "sgd" else plan.optimizer
    state = dict(plan.optimizer_state or {})
    if rule is not None:
        state = rule.init(x, plan.optimizer_state)
    elif amsgrad is not None:
        for key in ("m", "v", "vhat"):
            state.setdefault(key, torch.zeros_like(x))
    elif cfg.momentum > 0:
        state = {"momentum": torch.zeros_like(x)}
    for k in range(num_steps):
        g, loss = oracle(x, k)
        if cfg.grad_clip > 0:
            g = _clip(g, cfg.grad_clip)
        active = step_active[:, k].to(x.dtype).unsqueeze(1)
        grad_sum += g * active if ragged else g
        loss_sum += loss * active[:, 0] if ragged else loss
        if not plan.move:
            continue
        u = g if plan.correction is None else g + plan.correction
        if cfg.weight_decay > 0:
            u = u + cfg.weight_decay * x
        if rule is not None:
            def grad_at(point: Tensor, k: int = k) -> Tensor:
                h = oracle(point, k)[0]
                h = _clip(h, cfg.grad_clip) if cfg.grad_clip > 0 else h
                h = h if plan.correction is None else h + plan.correction
                return h + cfg.weight_decay * point if cfg.weight_decay > 0 else h

            direction, new = rule.step(k, x, u, state, grad_at)
            state = {key: state[key] + active * (value - state[key]) if ragged and key in state else value
                     for key, value in new.items()}
        elif amsgrad is not None:
            new = _amsgrad_step(state, u, amsgrad)
            direction = new["m"] / (new["vhat"].sqrt() + amsgrad.eps)
            for key, value in new.items():
                state[key] = state[key] + active * (value - state[key]) if ragged else value
        elif cfg.momentum > 0:
            buf = cfg.momentum * state["momentum"] + u
            state["momentum"] = state["momentum"] + active * (buf - state["momentum"]) if ragged else buf
            direction = buf
        else:
            direction = u
        x = x - step * (active * direction if ragged else direction)
    counts = step_active.sum(dim=1).clamp_min(1).to(x.dtype)
    return LocalResult(x_end=x, grad_mean=grad_sum / counts.unsqueeze(1), loss=loss_sum / counts,
                       optimizer_state=state if amsgrad is not None or rule is not None else {})


def _clip(g: Tensor, clip: float) -> Tensor:
    norms = g.norm(dim=1, keepdim=True)
    return g * torch.clamp(clip / norms.clamp_min(1e-30), max=1.0)


def _amsgrad_step(state: dict[str, Tensor], u: Tensor, opt: AMSGrad) -> dict[str, Tensor]:
    m = opt.beta1 * state["m"] + (1 - opt.beta1) * u
    v = opt.beta2 * state["v"] + (1 - opt.beta2) * u * u
    return {"m": m, "v": v, "vhat": torch.maximum(state["vhat"], v)}
