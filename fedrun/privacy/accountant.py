"""The privacy accountant of a run: epsilon at ``privacy.delta`` after every round, under the run's
participation pattern, with Google's ``dp-accounting`` (docs/privacy.md).

One round of central DP is the Gaussian mechanism on the sum of the participants' clipped uploads: one
client's whole upload moves the sum by at most C (add or remove the client), the noise is N(0, sigma^2 C^2),
so one round is ``GaussianDpEvent(sigma)``. What amplifies it depends on how the round's clients are chosen
(the pattern's ``sampling``, fedrun.federation.participation.base):

* ``poisson`` (bernoulli, p2, p3, sine, biased): every client joins round t independently with its p_i^t,
  so round t is ``PoissonSampledDpEvent(q_t, GaussianDpEvent(sigma))`` and the run is their composition
  over ALL rounds (a client's absence is as secret as its presence). q_t = max_i p_i^t, the worst client's
  probability: epsilon is monotone in q, so this is every client's bound, and exactly the worst client's
  when one client has the largest probability every round (bernoulli, sine, p2, p3, biased);
* ``without_replacement`` (uniform, p1): S of N without replacement; dp-accounting accounts it (RDP only)
  under the replace-one relation, where one client's replacement moves the sum by up to 2C, so the event is
  ``SampledWithoutReplacementDpEvent(N, S, GaussianDpEvent(sigma / 2))`` per round;
* ``none`` (full, cyclic, reshuffled_cyclic, markov, trace, plugins without checkable probabilities): no
  sampling randomness to amplify by. Client i's epsilon is the composition of the k_i Gaussian mechanisms
  of the rounds it took part in, ``SelfComposedDpEvent(GaussianDpEvent(sigma), k_i)``, and the reported
  epsilon is the worst client's (the largest k_i; with several sigmas, the largest sum_t sigma_t^-2, which
  orders Gaussian compositions exactly);
* ``local`` (``privacy.mode=local``, every pattern): client i's report clip(u_i) + z_i is seen by the
  server, so the client's presence is public and what is protected is its data: replacing it moves the
  clipped report by up to 2C (from one point of the C-ball to the opposite one), so each round it reports
  is ``GaussianDpEvent(sigma / 2)`` (sensitivity 2C, noise sigma C), composed over its k_i rounds as above.

Probabilities are rounded UP to 12 decimals before accounting (a sine pattern's p_i^t at t and t + period
differ in the last bits of float64; rounded they are one event, computed once).

The state (sigma, the rounds' q_t, every client's k_i) is the checkpoint's ``privacy/`` group; the epsilon
after round t is a function of it, so a resumed run reports the same epsilon, bit for bit.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import dp_accounting as dpa
import numpy as np
from dp_accounting import mechanism_calibration, pld, rdp
from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

from fedrun.errors import CheckpointError

if TYPE_CHECKING:
    from fedrun.privacy.config import PrivacyConfig

SAMPLINGS = ("poisson", "without_replacement", "none", "local")
# dp-accounting warns (through absl, once per order) when a fractional RDP order's series does not converge and
# leaves that order out of the minimum over orders, which stays a valid bound: not something a run's log needs
logging.getLogger("absl").addFilter(lambda record: "failed to converge" not in record.getMessage())
DECIMALS = 12  # probabilities are rounded up to this many decimals before accounting


def rounded(q: float) -> float:
    """``q`` rounded up to :data:`DECIMALS` decimals, at most 1."""
    return min(1.0, math.ceil(float(q) * 10**DECIMALS - 1e-6) / 10**DECIMALS)


def fresh_accountant(kind: str, sampling: str) -> dpa.PrivacyAccountant:
    """dp-accounting's accountant ``kind`` (rdp, pld) with the neighbouring relation ``sampling`` needs."""
    if kind == "pld":
        return pld.PLDAccountant()
    relation = dpa.NeighboringRelation.REPLACE_ONE if sampling == "without_replacement" else \
        dpa.NeighboringRelation.ADD_OR_REMOVE_ONE
    return rdp.RdpAccountant(neighboring_relation=relation)


def round_event(sampling: str, sigma: float, q: float, num_clients: int, cohort: int) -> dpa.DpEvent:
    """One round's event (module docstring): poisson with probability ``q``, S = ``cohort`` of N without
    replacement, the plain Gaussian mechanism (none), or one client's report under replace-one (local)."""
    if sampling == "poisson":
        return dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma))
    if sampling == "without_replacement":
        return dpa.SampledWithoutReplacementDpEvent(num_clients, cohort, dpa.GaussianDpEvent(sigma / 2))
    if sampling == "local":
        return dpa.GaussianDpEvent(sigma / 2)
    return dpa.GaussianDpEvent(sigma)


def run_event(sampling: str, sigma: float, q: Sequence[float], worst: int, num_clients: int,
              cohort: int) -> dpa.DpEvent:
    """The whole run's event as dp-accounting composes it: the rounds' events in order (poisson), the round
    event ``len(q)`` times (without replacement), or the Gaussian ``worst`` times (none)."""
    if sampling == "poisson":
        return dpa.ComposedDpEvent([round_event(sampling, sigma, qt, num_clients, cohort) for qt in q])
    if sampling == "without_replacement":
        return dpa.SelfComposedDpEvent(round_event(sampling, sigma, 1.0, num_clients, cohort), len(q))
    return dpa.SelfComposedDpEvent(round_event(sampling, sigma, 1.0, num_clients, cohort), worst)


def composed(sampling: str, levels: Sequence[float], rounds: Sequence[int], num_clients: int,
             cohort: int) -> dpa.DpEvent:
    """``rounds[e]`` rounds at noise multiplier ``levels[e]`` (one client's rounds, or every round without
    replacement): a single self-composition when one sigma was used throughout."""
    parts = [dpa.SelfComposedDpEvent(round_event(sampling, s, 1.0, num_clients, cohort), k)
             for s, k in zip(levels, rounds, strict=True) if k]
    return parts[0] if len(parts) == 1 else dpa.ComposedDpEvent(parts)


class Accountant:
    """Epsilon of a run at ``delta`` under one of :data:`SAMPLINGS`, round by round.

    Every round is accounted at the sigma it actually used: ``sigma`` is the multiplier of the rounds to come
    (a resume may change it: a recalibration for more rounds, an accepted ``privacy.noise_multiplier``), and
    ``sigmas[t]`` the one round t used. The RDP accountant is kept as a running sum of cached per-event RDP
    vectors, keyed by (q, sigma) (the arithmetic dp-accounting's ``RdpAccountant.compose`` does, without
    recomputing an event seen before: one event costs about 0.1 s); the PLD accountant composes one round at a
    time into a live ``PLDAccountant``. Without sampling, ``counts[i, e]`` is the number of rounds client i
    joined at the e-th distinct sigma (``levels()``), so each client's composition is exact under any history."""

    def __init__(self, kind: str, delta: float, sampling: str, num_clients: int, cohort: int, sigma: float) -> None:
        self.kind, self.delta, self.sampling = kind, delta, sampling
        self.num_clients, self.cohort, self.sigma = num_clients, cohort, float(sigma)
        self.q: list[float] = []  # per round: the worst client's sampling probability (1.0 without sampling)
        self.sigmas: list[float] = []  # per round: the noise multiplier it used
        self.counts = np.zeros((num_clients, 0), dtype=np.int64)  # k_i: rounds client i joined, per distinct sigma
        self._vectors: dict[tuple[str, float, float], np.ndarray] = {}
        self._orders = fresh_accountant("rdp", sampling).orders if kind == "rdp" else None
        self._rdp = None if self._orders is None else np.zeros_like(self._orders)
        self._live = fresh_accountant(kind, sampling) if kind == "pld" else None

    def levels(self) -> list[float]:
        """The distinct sigmas of the rounds recorded, in order of first use (the columns of ``counts``)."""
        return list(dict.fromkeys(self.sigmas))

    # ------------------------------------------------------------------------------------------ rounds
    def record(self, q: float, participants: np.ndarray) -> None:
        """Round done at the current ``sigma``: the worst client's probability ``q`` (poisson) and the ids of its
        ``participants``."""
        q = rounded(q) if self.sampling == "poisson" else 1.0
        self.counts = self._counted(self.counts, self.levels(), participants)
        self.q.append(q)
        self.sigmas.append(self.sigma)
        if self.sampling == "poisson":
            self._compose(q, self.sigma)

    def epsilon(self) -> float:
        """Epsilon at ``delta`` after the rounds recorded (the worst client's)."""
        return self._epsilon(self._rdp, self._live, self.counts, self.levels(), self.sigmas)

    def epsilon_after_next(self, q_next: float, participants: np.ndarray) -> float:
        """Epsilon after one more round at ``sigma`` (poisson: with probability ``q_next``; none: with
        ``participants``): what the budget check of ``privacy.target_epsilon`` compares."""
        sigmas = [*self.sigmas, self.sigma]
        levels = list(dict.fromkeys(sigmas))
        counts = self._counted(self.counts, self.levels(), participants)
        if self.sampling != "poisson" or self.sigma == 0:
            return self._epsilon(self._rdp, self._live, counts, levels, sigmas)
        q = rounded(q_next)
        event = round_event(self.sampling, self.sigma, q, self.num_clients, self.cohort)
        if self._live is not None:
            live = copy.deepcopy(self._live)
            live.compose(event)
            return float(live.get_epsilon(self.delta))
        return self._epsilon(self._rdp + self._vector(event, ("q", q, self.sigma)), None, counts, levels, sigmas)

    # ------------------------------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, np.ndarray]:
        return {"sigma": np.float64(self.sigma), "q": np.asarray(self.q, dtype=np.float64),
                "sigmas": np.asarray(self.sigmas, dtype=np.float64), "counts": self.counts.copy()}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Restore the rounds recorded (the RDP sum or the PLD composition is rebuilt in the same order). The
        sigma of the rounds to come stays this run's (its config's, checked against the checkpoint's by the
        caller); a checkpoint written before ``sigmas`` was recorded used its ``sigma`` in every round."""
        self.q = [float(v) for v in np.asarray(d["q"], dtype=np.float64)]
        saved = float(np.asarray(d["sigma"]))
        self.sigmas = [float(v) for v in np.asarray(d["sigmas"], dtype=np.float64)] if "sigmas" in d else \
            [saved] * len(self.q)
        counts = np.asarray(d["counts"], dtype=np.int64)
        if counts.ndim == 1:  # written before per-round sigmas: one sigma, or no round yet
            counts = counts.reshape(-1, 1) if self.q else np.zeros((len(counts), 0), dtype=np.int64)
        self.counts = counts.copy()
        if len(self.sigmas) != len(self.q) or self.counts.shape != (self.num_clients, len(self.levels())):
            raise CheckpointError(f"privacy/: {len(self.q)} rounds' q, {len(self.sigmas)} sigmas and counts of shape "
                                  f"{self.counts.shape} do not fit together ({self.num_clients} clients)")
        self._rdp = None if self._orders is None else np.zeros_like(self._orders)
        self._live = fresh_accountant(self.kind, self.sampling) if self.kind == "pld" else None
        if self.sampling == "poisson":
            for q, sigma in zip(self.q, self.sigmas, strict=True):
                self._compose(q, sigma)

    # ------------------------------------------------------------------------------------------ internals
    def _counted(self, counts: np.ndarray, levels: list[float], participants: np.ndarray) -> np.ndarray:
        """``counts`` with one more round at ``sigma`` for ``participants`` (a new column for a new sigma)."""
        if self.sigma not in levels:
            counts = np.concatenate([counts, np.zeros((self.num_clients, 1), dtype=np.int64)], axis=1)
            levels = [*levels, self.sigma]
        else:
            counts = counts.copy()
        counts[participants, levels.index(self.sigma)] += 1
        return counts

    def _compose(self, q: float, sigma: float) -> None:
        if sigma == 0:  # no noise: epsilon is infinite (dp-accounting divides by sigma for some events)
            return
        event = round_event(self.sampling, sigma, q, self.num_clients, self.cohort)
        if self._live is not None:
            self._live.compose(event)
        else:
            self._rdp += self._vector(event, ("q", q, sigma))

    def _vector(self, event: dpa.DpEvent, key: tuple[str, float, float]) -> np.ndarray:
        """The RDP vector of ``event`` at the accountant's orders (computed once per ``key``: kind, q, sigma)."""
        if key not in self._vectors:
            acc = fresh_accountant("rdp", self.sampling)
            acc.compose(event)
            self._vectors[key] = acc.rdp
        return self._vectors[key]

    def _epsilon(self, rdp_sum: np.ndarray | None, live: Any, counts: np.ndarray, levels: list[float],
                 sigmas: list[float]) -> float:
        if 0 in sigmas:
            return math.inf
        if self.sampling == "poisson":
            if live is not None:
                return float(live.get_epsilon(self.delta))
            return float(compute_epsilon(self._orders, rdp_sum, self.delta)[0])
        if self.sampling == "without_replacement":  # every round composes, whoever joined
            rounds = [sigmas.count(s) for s in levels]
        else:  # the worst client: the largest sum_t 1 / sigma_t^2 over its rounds (exact for Gaussians)
            worst = int(np.argmax(counts @ np.asarray(levels) ** -2.0)) if counts.size else 0
            rounds = [int(k) for k in counts[worst]] if counts.size else []
        if not any(rounds):
            return 0.0
        if self.kind == "pld":
            acc = fresh_accountant("pld", self.sampling)
            acc.compose(composed(self.sampling, levels, rounds, self.num_clients, self.cohort))
            return float(acc.get_epsilon(self.delta))
        events = [(k, round_event(self.sampling, s, 1.0, self.num_clients, self.cohort), s)
                  for s, k in zip(levels, rounds, strict=True) if k]
        total = sum(k * self._vector(event, ("round", 1.0, s)) for k, event, s in events)
        return float(compute_epsilon(self._orders, total, self.delta)[0])


def calibrate(cfg: PrivacyConfig, sampling: str, num_clients: int, cohort: int, q: Sequence[float],
              worst: int) -> float:
    """The smallest sigma whose run (``q``: the planned rounds' worst-client probabilities; ``worst``: the
    most rounds one client joins) spends at most ``privacy.target_epsilon`` at ``privacy.delta`` under
    ``privacy.accountant``: dp-accounting's Brent search (``calibrate_dp_mechanism``), under RDP first and for
    PLD then between half that sigma and it. The poisson rounds are grouped by their probability (composition
    commutes)."""
    kind, delta, target = cfg.accountant, cfg.delta, cfg.target_epsilon
    if sampling == "poisson":
        values, counts = np.unique([rounded(v) for v in q], return_counts=True)

        def event(sigma: float) -> dpa.DpEvent:
            return dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(round_event(sampling, sigma, float(v), num_clients,
                                                                            cohort), int(c))
                                        for v, c in zip(values, counts, strict=True)])
    else:
        def event(sigma: float) -> dpa.DpEvent:
            return run_event(sampling, sigma, q, worst, num_clients, cohort)
    bracket = mechanism_calibration.LowerEndpointAndGuess(1e-3, 1.0)
    sigma = float(mechanism_calibration.calibrate_dp_mechanism(lambda: fresh_accountant("rdp", sampling), event,
                                                               target, delta, bracket, tol=1e-4))
    if kind == "rdp":
        return sigma
    # PLD: below the RDP sigma (RDP's epsilon bounds PLD's from above), searched from a lower end that PLD can
    # discretize: at sigma 1e-3 its privacy-loss grid needs hundreds of GiB
    lower = sigma / 2
    while lower > 1e-3 and epsilon_of(event(lower), "pld", sampling, delta) <= target:
        lower /= 2
    bracket = mechanism_calibration.ExplicitBracketInterval(lower, sigma)
    return float(mechanism_calibration.calibrate_dp_mechanism(lambda: fresh_accountant("pld", sampling), event,
                                                              target, delta, bracket, tol=1e-4))


def epsilon_of(event: dpa.DpEvent, kind: str, sampling: str, delta: float) -> float:
    """Epsilon at ``delta`` of one ``event`` under accountant ``kind``."""
    acc = fresh_accountant(kind, sampling)
    acc.compose(event)
    return float(acc.get_epsilon(delta))
