"""What a private run's epsilon is about (docs/privacy.md, "The guarantee"): the privacy unit, the
neighbouring relation of its accounting class, where the noise comes from, the metrics the guarantee does not
cover (``runtime.json``'s ``privacy`` section and the start-up lines), and the start-up warning when the noise
drowns the update. Reads a built :class:`fedrun.privacy.mechanism.Privacy`; changes nothing.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from fedrun.privacy.mechanism import Privacy

# the neighbouring relation each accounting class protects
RELATIONS = {
    "poisson": "add/remove one client: the run with and without all of that client's data",
    "without_replacement": "replace-one: one client's data replaced by another's (the cohort size is public)",
    "none": "zero-out: one client's uploads replaced by zero in the rounds the schedule gives it (the schedule "
            "is public)",
    "local": "replace-one: one client's data replaced by other data (its reports, and so its presence, are public)",
}
NOISE_WARNING = 10.0  # the start-up warning's bound on the noise's norm over the mean update's (noise_warning)


def guarantee(privacy: Privacy) -> dict[str, Any]:
    """``runtime.json``'s ``privacy``: unit, mode, accounting class and its neighbouring relation, the sigma in
    use, C, delta, accountant, the noise's source, whether the run is reproducible, and the metrics record's
    fields that the guarantee does not cover (``train_loss`` is the unnoised mean of the participants' losses;
    under poisson sampling ``active_clients`` and the delay metrics tell who took part)."""
    cfg = privacy.cfg
    not_private = ["train_loss"]
    if privacy.sampling == "poisson":
        not_private += ["active_clients", "tau_t", "tau_max", "tau_avg", "tau_avg_client"]
    return {
        "unit": "client: everything one client contributes to the run (every upload of every round it joins)",
        "mode": cfg.mode, "sampling": privacy.sampling, "neighbouring": RELATIONS[privacy.sampling],
        "noise_multiplier": privacy.state.accountant.sigma, "calibrated": privacy.calibrated, "clip": cfg.clip,
        "adaptive_quantile": cfg.adaptive_quantile, "delta": cfg.delta, "accountant": cfg.accountant,
        "noise": noise_source(privacy), "reproducible": not cfg.secure_noise, "not_private_metrics": not_private,
    }


def noise_source(privacy: Privacy) -> str:
    """Where the noise comes from, and what that makes the run (one line, also printed at start-up)."""
    if privacy.cfg.secure_noise:
        return ("noise from the operating system's entropy (privacy.secure_noise=true): it cannot be regenerated, "
                "and this run is not reproducible")
    return ("noise seeded by run.seed: a reproducible simulation, not a deployment (anyone with config.yaml can "
            "regenerate and subtract it; privacy.secure_noise=true draws it from the operating system)")


def noise_warning(privacy: Privacy, dim: int) -> str | None:
    """The start-up warning when the noise drowns the update: the mean update of m clipped uploads has norm at
    most C, and the noise in it has expected norm about

        sigma C sqrt(d) / m     (central: one draw on the sum)   or   sigma C sqrt(d / m)   (local: m draws),

    m the expected cohort of round 1. None when that ratio is at most :data:`NOISE_WARNING`."""
    probabilities = privacy.participation.probabilities(0) if privacy.sampling == "poisson" else None
    m = float(np.sum(probabilities)) if probabilities is not None else float(len(privacy.participants(0)))
    sigma = privacy.state.accountant.sigma
    if m <= 0 or sigma == 0:
        return None
    ratio = sigma * math.sqrt(dim) / (m if privacy.central else math.sqrt(m))
    if ratio <= NOISE_WARNING:
        return None
    return (f"privacy: warning: the noise's expected norm is {ratio:.0f} times the largest mean update's "
            f"(sigma {sigma:.4g} x sqrt(d = {dim}) / {'' if privacy.central else 'sqrt '}m = {m:g} clients a "
            f"round); above {NOISE_WARNING:g} a model rarely learns: more clients a round, fewer parameters or a "
            "larger epsilon")
