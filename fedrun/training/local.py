"""The local solver: K steps of a block of C clients over flat vectors.

Each step k of client i, with g the raw minibatch gradient at the current local point:

    g   <- g * min(1, clip / ||g||)              (if local.grad_clip > 0; FedAdamom code)
    u   <- g + correction_i + weight_decay * x    (correction from the algorithm's plan)
    u   <- u + prox * (x - x_start)               (if the plan's prox > 0: FedProx's proximal term)
    direction, state <- optimizer.step(k, x, u, state, grad_at)
    x   <- x - lr * lr_scale * direction

The optimizer is the plan's :class:`fedrun.protocol.LocalOptimizer` (plain SGD with momentum by default,
``fedrun.training.sgd``; FAdamGC's AMSGrad, FedCAda's client Adam and FAFED's STORM come with their
algorithms); the solver names none of them.

It returns the end points, the mean of the raw gradients (SCAFFOLD's c_i+, FedSUM's h_i) and the
mean loss. Clients with fewer local steps than others (epochs mode) are frozen once they finish.

The clients are processed in groups of rows: one group of all C rows for the vectorized oracle, one
row at a time for the sequential one, so that a client's K steps run back to back on vectors that
stay in cache (the arithmetic per row is the same either way). Updates are in place on row views.
For the batched oracle (:class:`fedrun.training.gradients.Chunks`) the solver works on a padded copy
whose every group has the same number of rows, ends with padding rows, and takes the masked path with
exact selections, so that a client's arithmetic never depends on the clients grouped with it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from fedrun.config import LocalConfig
from fedrun.protocol import LocalOptimizer, LocalPlan, LocalResult
from fedrun.training.gradients import Chunks, Oracle, rows_of
from fedrun.training.sgd import SGD


@dataclass
class _Local:
    """What every group of rows of one solve shares: the plan, its gradient oracle and optimizer, the
    ``local`` section, and ``exact`` (every group takes the masked path with exact selections: batched)."""

    plan: LocalPlan
    oracle: Oracle
    cfg: LocalConfig
    optimizer: LocalOptimizer
    exact: bool


@dataclass
class _Work:
    """The solve's rows, updated in place group by group: the points, the sums of raw gradients and losses,
    the optimizer state, and which rows skip a step (read once, not per group)."""

    x: Tensor
    grad_sum: Tensor
    loss_sum: Tensor
    state: dict[str, Tensor]
    short: np.ndarray


def run_local(plan: LocalPlan, oracle: Oracle, step_active: np.ndarray, lr: float, cfg: LocalConfig,
              group_size: int | None = None) -> LocalResult:
    """``step_active`` [C, K] bool, on the host (the plan's ``sizes > 0``): whether client c takes step k;
    ``group_size`` rows per oracle call (None: all at once). A plan without an optimizer takes SGD with
    ``local.momentum``. Nothing here reads a tensor back to the host (no ``.item()``, ``float()``, ``bool()``,
    ``.cpu()``, boolean-mask indexing), so on a GPU the host queues every client's steps without waiting for the
    device (tests/test_no_sync.py counts such reads). :func:`run_chunked` is the batched oracle's solver."""
    count = plan.start.shape[0]
    group = group_size or count
    return _solve(_local(plan, oracle, cfg, False), step_active, lr,
                  [slice(start, min(count, start + group)) for start in range(0, count, group)])


def _local(plan: LocalPlan, oracle: Oracle, cfg: LocalConfig, exact: bool) -> _Local:
    return _Local(plan, oracle, cfg, plan.optimizer or SGD(cfg.momentum if plan.move else 0.0), exact)


def run_chunked(plan: LocalPlan, oracle: Oracle, step_active: np.ndarray, lr: float, cfg: LocalConfig,
                chunks: Chunks) -> LocalResult:
    """run_local on the padded rows of ``chunks.layout``; the padding rows take no step."""
    placed = chunks.placed(plan.start.shape[0], plan.start.device)
    source_host, live_host, source, live = placed.source_host, placed.live_host, placed.source, placed.live_rows
    scale = rows_of(plan.lr_scale, source) if isinstance(plan.lr_scale, Tensor) else plan.lr_scale
    state = None if plan.optimizer_state is None else {k: rows_of(v, source) for k, v in plan.optimizer_state.items()}
    correction = None if plan.correction is None else rows_of(plan.correction, source)
    start = rows_of(plan.start, source)  # this solve's own copy: the solver moves it in place (the proximal
    # term reads the start: a second copy then)
    padded = replace(plan, start=start, correction=correction, lr_scale=scale, optimizer_state=state)
    active = np.asarray(step_active)[source_host] & live_host[:, None]
    out = _solve(_local(padded, oracle, cfg, True), active, lr, placed.calls, None if plan.prox > 0 else start)
    return LocalResult(x_end=rows_of(out.x_end, live), grad_mean=rows_of(out.grad_mean, live),
                       loss=rows_of(out.loss, live),
                       optimizer_state={k: rows_of(v, live) for k, v in out.optimizer_state.items()})


def _solve(local: _Local, active_host: np.ndarray, lr: float, groups: list[slice],
           x: Tensor | None = None) -> LocalResult:
    """The solver on the groups of rows ``groups``, moving ``x`` in place (None: a copy of the plan's start)."""
    plan = local.plan
    x = plan.start.clone() if x is None else x
    active_host = np.asarray(active_host)
    if plan.steps is not None:
        active_host = active_host[:, :plan.steps]
    step_active = torch.from_numpy(np.ascontiguousarray(active_host)).to(x.device, non_blocking=True)
    num_clients = x.shape[0]
    step = lr * plan.lr_scale
    if isinstance(step, Tensor):  # per-client scale [C]
        step = step.to(x.dtype).unsqueeze(1)
    work = _Work(x=x, grad_sum=torch.zeros_like(x),
                 loss_sum=torch.zeros(num_clients, dtype=x.dtype, device=x.device),
                 state=local.optimizer.init(x, plan.optimizer_state),
                 short=~active_host.all(axis=1))
    for rows in groups:
        _run_rows(local, work, rows, step[rows] if isinstance(step, Tensor) else step, step_active[rows])
    counts = step_active.sum(dim=1).clamp_min(1).to(x.dtype)
    return LocalResult(x_end=x, grad_mean=work.grad_sum / counts.unsqueeze(1), loss=work.loss_sum / counts,
                       optimizer_state=work.state)


def _run_rows(local: _Local, work: _Work, rows: slice, step: float | Tensor, active_steps: Tensor) -> None:
    """The K steps of the clients ``rows``; a group where a row skips a step (or any group, ``exact``) takes
    the masked path."""
    plan, cfg, oracle = local.plan, local.cfg, local.oracle
    ragged = local.exact or bool(work.short[rows].any())
    state = {k: v[rows] for k, v in work.state.items()}
    xs, gs, ls = work.x[rows], work.grad_sum[rows], work.loss_sum[rows]
    correction = None if plan.correction is None else plan.correction[rows]
    anchor = plan.start[rows]

    def processed(g: Tensor, point: Tensor) -> Tensor:
        """u = clip(g) + correction + weight_decay * point + prox * (point - start)."""
        u = g if correction is None else g + correction
        u = u + cfg.weight_decay * point if cfg.weight_decay > 0 else u
        return u + plan.prox * (point - anchor) if plan.prox > 0 else u

    for k in range(active_steps.shape[1]):
        g, loss = oracle(xs, rows, k)
        if cfg.grad_clip > 0:
            g = _clip(g, cfg.grad_clip)
        mask = active_steps[:, k].to(xs.dtype).unsqueeze(1) if ragged else None
        gs.add_(g * mask if ragged else g)
        ls.add_(loss * mask[:, 0] if ragged else loss)
        if not plan.move:
            continue
        u = processed(g, xs)

        def grad_at(point: Tensor, k: int = k) -> Tensor:
            h = oracle(point, rows, k)[0]
            return processed(_clip(h, cfg.grad_clip) if cfg.grad_clip > 0 else h, point)

        direction, new = local.optimizer.step(k, xs, u, state, grad_at)
        for key, value in new.items():
            _assign(state[key], value, mask, local.exact)
        if ragged:
            direction = direction * mask
        if isinstance(step, Tensor):
            xs.sub_(step * direction)
        else:
            xs.sub_(direction, alpha=step)


def _clip(g: Tensor, clip: float) -> Tensor:
    norms = g.norm(dim=1, keepdim=True)
    return g * torch.clamp(clip / norms.clamp_min(1e-30), max=1.0)


def _assign(target: Tensor, value: Tensor, mask: Tensor | None, exact: bool) -> None:
    """``target <- value`` on the rows whose step is active (all rows when ``mask`` is None); ``exact``
    selects (the sequential strategy's ``target + mask (value - target)`` is kept for its recorded bits)."""
    if mask is None:
        target.copy_(value)
    elif exact:
        target.copy_(torch.where(mask.bool(), value, target))
    else:
        target.add_(mask * (value - target))
