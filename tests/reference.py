"""Plain numpy transcriptions of the FedSUM, SCAFFOLD and FAdamGC round rules (docs/algorithms/), for tests.

Deterministic full-batch gradients grad f_i(x) = A_i^T (A_i x - b_i) / m; ``trace`` is a boolean
[T, N] participation array; ``lrs`` the local lr of each round. Each function returns the global
model after every round. They are written from the documented equations, independently of fedrun's rules.
"""

from __future__ import annotations

import numpy as np


def _grad(a: np.ndarray, b: np.ndarray, i: int, x: np.ndarray) -> np.ndarray:
    return a[i].T @ (a[i] @ x - b[i]) / a.shape[1]


def fedsum(a, b, trace, lrs, k, eta_g, variant="fedsum", cr_form="cumulative"):
    """FedSUM-B / FedSUM / FedSUM-CR with the scalings fedrun chooses (docs/algorithms/fedsum_scaffold_fadamgc.md)."""
    n, d = a.shape[0], a.shape[2]
    x, y = np.zeros(d), np.zeros(d)
    h, z = np.zeros((n, d)), np.zeros((n, d))
    last, c_seen, cum = np.full(n, -1), np.zeros(n), 0.0
    out = []
    for t, active in enumerate(trace):
        lr = lrs[t]
        c_t = eta_g * lr * k / n
        dsum = np.zeros(d)
        for i in np.flatnonzero(active):
            if variant == "fedsum_b":
                gbar = _grad(a, b, i, x)  # K identical deterministic gradients at x
            else:
                if variant == "fedsum":
                    y_i = y - h[i]
                else:
                    denom = cum - c_seen[i] if cr_form == "cumulative" else c_t * (t - last[i])
                    y_i = ((z[i] - x) / denom if denom > 0 else 0.0) - h[i]
                xl, gsum = x.copy(), np.zeros(d)
                for _ in range(k):
                    g = _grad(a, b, i, xl)
                    gsum += g
                    xl = xl - lr / n * (g + y_i)
                gbar = gsum / k
            dsum += gbar - h[i]
            h[i], z[i], last[i], c_seen[i] = gbar, x, t, cum
        y = y + dsum
        x = x - c_t * y
        cum += c_t
        out.append(x.copy())
    return out


def scaffold(a, b, trace, lrs, k, eta_g):
    """SCAFFOLD Option II (3.6), original two-vector uplink."""
    n, d = a.shape[0], a.shape[2]
    x, c, ci = np.zeros(d), np.zeros(d), np.zeros((n, d))
    out = []
    for t, active in enumerate(trace):
        lr, dx, dc = lrs[t], np.zeros(d), np.zeros(d)
        for i in np.flatnonzero(active):
            xl = x.copy()
            for _ in range(k):
                xl = xl - lr * (_grad(a, b, i, xl) - ci[i] + c)
            cplus = ci[i] - c + (x - xl) / (k * lr)
            dx += xl - x
            dc += cplus - ci[i]
            ci[i] = cplus
        if active.any():
            x = x + eta_g * dx / active.sum()
            c = c + dc / n
        out.append(x.copy())
    return out


def fadamgc(a, b, trace, lrs, k, eta_g, beta1=0.9, beta2=0.999, eps=1e-8, persist=False, correct=True):
    """FAdamGC (5): local AMSGrad on g + y - y_i, SCAFFOLD-style tracking of y (``correct=False``: on g)."""
    n, d = a.shape[0], a.shape[2]
    x, y, yi = np.zeros(d), np.zeros(d), np.zeros((n, d))
    mom = np.zeros((3, n, d))  # m, v, vhat per client (used when persist)
    out = []
    for t, active in enumerate(trace):
        lr, dx, dy = lrs[t], np.zeros(d), np.zeros(d)
        for i in np.flatnonzero(active):
            m, v, vh = (mom[0, i], mom[1, i], mom[2, i]) if persist else (np.zeros(d),) * 3
            xl, gsum = x.copy(), np.zeros(d)
            for _ in range(k):
                g = _grad(a, b, i, xl)
                gsum += g
                gh = g + y - yi[i] if correct else g
                m = beta1 * m + (1 - beta1) * gh
                v = beta2 * v + (1 - beta2) * gh**2
                vh = np.maximum(vh, v)
                xl = xl - lr * m / (np.sqrt(vh) + eps)
            if persist:
                mom[:, i] = m, v, vh
            ynew = gsum / k
            dx += xl - x
            dy += ynew - yi[i]
            yi[i] = ynew
        if active.any():
            x = x + eta_g * dx / active.sum()
            y = y + dy / n
        out.append(x.copy())
    return out
