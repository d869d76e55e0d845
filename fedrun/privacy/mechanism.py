"""Clipping and Gaussian noise around the exchange: differential privacy as an aggregation concern
(docs/privacy.md). The algorithm never knows about it; the round applies it to what the algorithm uploads.

For client i with uploads u_i (every entry of the declaration's ``up``, vectors and scalars alike, as one
vector) and clip C:

    clip(u_i) = u_i * min(1, C / ||u_i||_2)                                  (on the client's rank)

* ``central``: the clipped uploads are summed exactly as every sum (docs/design.md), then rank 0 adds
  z ~ N(0, sigma^2 C^2 I) once: the server rule sees  sum_{i in S_t} clip(u_i) + z  and, under poisson
  participation, normalizes by the expected cohort m_t = max(1, round(sum_i p_i^t)) instead of |S_t|
  (|S_t| itself would tell one client's presence); z is drawn from a generator seeded by
  (run seed, round, STREAM_CENTRAL), so the run is the same on any number of ranks and after a resume.
  With ``privacy.mechanism=bandmf`` rank 0 adds w_t, z_t correlated with the last rounds' noise
  (:mod:`fedrun.privacy.bandmf`), instead of z_t.
* ``local``: client i uploads clip(u_i) + z_i, z_i ~ N(0, sigma^2 C^2 I) from (seed, round, client,
  STREAM_LOCAL); everything after is post-processing.

Adaptive clipping (Andrew et al. 2021, ``privacy.adaptive_quantile`` gamma): each participant also
reports b_i = 1[||u_i|| <= C_t]; rank 0 forms the shifted, noised share
b_t = (sum_i (b_i - 1/2) + N(0, sigma_b^2)) / m_t + 1/2 with sigma_b = max(m_t / 20, sigma) and sets
C_{t+1} = C_t exp(-eta_C (b_t - gamma)), eta_C = 0.2 (the paper's geometric update and defaults; the floor
sigma keeps sigma_u finite). One client moves sum_i (b_i - 1/2) by 1/2 (add or remove), so the count is the
Gaussian mechanism with multiplier 2 sigma_b, and the two noised sums together are the Gaussian mechanism
with multiplier sigma, sigma^-2 = sigma_u^-2 + (2 sigma_b)^-2, when the update's own multiplier is
sigma_u = (sigma^-2 - (2 sigma_b)^-2)^(-1/2) (the paper's Theorem 1): the accountant counts sigma.
The count travels in one extra small reduce and C_{t+1} in one small broadcast.

Which algorithms central DP accepts (refused at build with one line, status 2): those whose server step
is a function of the round's sum and of server state derived only from such sums. Refused: an algorithm
with gathered uploads (the server sees each client's upload, not a noised sum) or with ``memory`` entries
(the server keeps the sum of every client's latest entry and reuses each client's contribution in every
later round; fedrun.protocol.Declaration.memory). Local mode accepts every algorithm.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from fedrun.errors import CheckpointError, ConfigError
from fedrun.privacy.config import PrivacyConfig
from fedrun.protocol import Declaration, RoundContext, ServerRule
from fedrun.runtime.flat import broadcast_from_root, reduce_to_root
from fedrun.runtime.world import World

if TYPE_CHECKING:  # dp-accounting (and the scipy parts it loads) is imported by a private run only
    from fedrun.privacy.accountant import Accountant
    from fedrun.privacy.bandmf import BandAccountant, BandNoise

STREAM_CENTRAL = 0x4450435A  # "DPCZ": the noise rank 0 adds to the round's sum, rng(seed, t, .)
STREAM_LOCAL = 0x44504C5A  # "DPLZ": client i's own noise in local mode, rng(seed, t, i, .)
STREAM_COUNT = 0x44504342  # "DPCB": the noise of the adaptive clip's count, rng(seed, t, .)
ADAPTIVE_LR = 0.2  # eta_C of the geometric clip update (Andrew et al. 2021)
COUNT_NOISE_SHARE = 20.0  # sigma_b = m / 20 (Andrew et al. 2021)
BUDGET_SLACK = 1e-9  # relative: a calibrated run's last round may exceed the target by the float order of the sums


def generator(device: torch.device, *keys: int, secure: bool = False) -> torch.Generator:
    """A torch generator seeded by a pure function of ``keys`` (seed, round, [client,] stream): anyone who knows
    the run's seed can regenerate the noise (a reproducible simulation); ``secure``: seeded by 64 bits of the
    operating system's entropy instead (``secrets``), so the noise cannot be regenerated and the run is not
    reproducible."""
    g = torch.Generator(device=device)
    if secure:
        g.manual_seed(secrets.randbits(64))
    else:
        g.manual_seed(int(np.random.SeedSequence([int(k) for k in keys]).generate_state(1, np.uint64)[0]))
    return g


def upload_norms(up: dict[str, Tensor], names: list[str]) -> Tensor:
    """||u_i||_2 over every entry ``names`` of each client's upload jointly, ``[C]``."""
    n = len(up[names[0]])
    return torch.stack([up[k].reshape(n, -1).square().sum(dim=1) for k in names]).sum(dim=0).sqrt()


def clip_uploads(up: dict[str, Tensor], names: list[str], clip: float) -> tuple[dict[str, Tensor], Tensor]:
    """``u_i * min(1, C / ||u_i||)`` for every client row (a row within the bound is multiplied by exactly
    1, so it keeps its bits), and the norms before clipping."""
    norms = upload_norms(up, names)
    factor = torch.clamp(clip / norms, max=1.0)  # ||u|| = 0: C / 0 = inf -> 1
    out = dict(up)
    for k in names:
        out[k] = up[k] * factor.view(-1, *([1] * (up[k].dim() - 1)))
    return out, norms


def gaussian_like(up: dict[str, Tensor], names: list[str], std: float, g: torch.Generator) -> dict[str, Tensor]:
    """N(0, std^2) noise shaped like ``up[names]``: one draw of their total size, in the order of ``names``."""
    total = sum(up[k].numel() for k in names)
    first = up[names[0]]
    z = torch.randn(total, generator=g, dtype=first.dtype, device=first.device) * std
    out, at = {}, 0
    for k in names:
        out[k] = z[at:at + up[k].numel()].view_as(up[k])
        at += up[k].numel()
    return out


@dataclasses.dataclass
class PrivacyState:
    """What the rounds advance and the checkpoint's ``privacy/`` group holds: the accountant and C_t (and
    with ``privacy.mechanism=bandmf`` the correlated noise's last rounds)."""

    accountant: Accountant | BandAccountant
    clip: float
    noise: BandNoise | None = None
    restored_sigma: float | None = None  # a resumed checkpoint's privacy/sigma, checked against its source

    def state_dict(self) -> dict[str, np.ndarray]:
        extra = {} if self.noise is None else self.noise.state_dict()
        return {**self.accountant.state_dict(), "clip": np.float64(self.clip), **extra}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.accountant.load_state_dict(d)
        self.clip = float(np.asarray(d["clip"]))
        if self.noise is not None:
            self.noise.load_state_dict(d)
        self.restored_sigma = float(np.asarray(d["sigma"]))


def layout(num_clients: int, rounds_done: int) -> dict[str, tuple[int, ...]]:
    """The datasets of the accountant's state (the checkpoint's ``privacy/`` group) after ``rounds_done`` rounds as
    files without a manifest (the versions before per-round sigmas) wrote them, with their shapes."""
    return {"sigma": (), "clip": (), "q": (rounds_done,), "counts": (num_clients,)}


@dataclasses.dataclass(frozen=True)
class RunShape:
    """What the mechanism reads of the run around it."""

    algorithm: str  # algorithm.name (messages)
    num_clients: int  # N
    rounds: int  # T (run.rounds)
    seed: int  # run.seed
    asynchronous: bool  # asynchrony.enabled (refused: the accountant counts synchronous rounds)


class Privacy:
    """The configured mechanism of a run (``privacy.mode`` central or local), built once per rank: an upload
    transform (fedrun.federation.upload_transform) whose ``client_uploads`` clip (and noise, local mode) on
    the clients' ranks and whose ``server_rule`` noises the exact sum on rank 0 (central mode)."""

    def __init__(self, cfg: PrivacyConfig, run: RunShape, decl: Declaration, participation: Any, planner: Any,
                 world: World) -> None:
        from fedrun.privacy.accountant import Accountant, calibrate  # here: runs without privacy never load it

        num_clients, rounds = run.num_clients, run.rounds
        self.cfg, self.seed, self.world = cfg, run.seed, world
        self.names = [e.name for e in decl.up]
        self.central = cfg.mode == "central"
        self._refuse(run.algorithm, decl, run.asynchronous, participation)
        self.sampling = participation.sampling if self.central else "local"
        self.unamplified = None  # why a pattern declaring poisson sampling is accounted without amplification
        if self.sampling == "poisson" and not valid_probabilities(participation.probabilities(0), num_clients):
            self.sampling = "none"
            self.unamplified = (f"participation.pattern={participation.name} declares poisson sampling but its "
                                f"probabilities(t) is not P(i in S_t) as {num_clients} numbers in [0, 1]: accounted "
                                "without amplification by sampling")
        self.participation = participation
        cohort = participation.max_active()
        self.calibrated = cfg.noise_multiplier is None
        sigma = cfg.noise_multiplier
        self.band = None
        if cfg.mechanism == "bandmf":  # DP-FTRL's correlated noise and its accountant (fedrun.privacy.bandmf)
            from fedrun.privacy.bandmf import BandMF

            self.band = BandMF(cfg, participation, planner, rounds)
        if sigma is None:
            q, worst = plan(planner, self.sampling, rounds, num_clients)
            sigma = calibrate(cfg, self.sampling, num_clients, cohort, q, worst) if self.band is None else \
                self.band.calibrate(cfg, worst)
        self.rounds, self.planner, self.num_clients, self.cohort = rounds, planner, num_clients, cohort
        self.sigma = sigma  # this run's noise multiplier (given, or calibrated for its config)
        accountant = Accountant(cfg.accountant, cfg.delta, self.sampling, num_clients, cohort, sigma) \
            if self.band is None else self.band.accountant(cfg, num_clients, sigma)
        noise = None if self.band is None else self.band.noise(world.device, world.is_root)
        self.state = PrivacyState(accountant, cfg.clip, noise)
        target = cfg.target_epsilon
        first = self.next_epsilon(0) if target is not None else 0.0
        if target is not None and first > target * (1 + BUDGET_SLACK):
            raise ConfigError(f"privacy.target_epsilon: expected at least the epsilon {first:.4g} that round 1 "
                              f"alone spends at noise_multiplier {sigma:g} (delta {cfg.delta:g}), got {target:g}")
        self._below = 0  # adaptive: this rank's clients of the round within the clip
        self._count = 0.0  # adaptive, rank 0: the round's summed count

    def _refuse(self, algorithm: str, decl: Declaration, asynchronous: bool, participation: Any) -> None:
        """One line (ConfigError, status 2) for what this mechanism cannot protect or account."""
        mode = f"privacy.mode={self.cfg.mode}"
        if asynchronous:
            raise ConfigError(f"{mode}: expected asynchrony.enabled=false (an asynchronous step's uploads left "
                              "their clients in earlier steps; the accountant counts synchronous rounds)")
        if self.central and decl.gathered():
            raise ConfigError(f"{mode}: algorithm {algorithm} receives every client's upload "
                              f"({', '.join(sorted(decl.gathered()))}), not their sum, so noise added once to a sum "
                              "protects nothing; expected privacy.mode=local or an algorithm that sums its uploads")
        if self.central and decl.memory:
            raise ConfigError(f"{mode}: algorithm {algorithm}'s server keeps the sum of every client's latest "
                              f"{', '.join(decl.memory)} and reuses each client's contribution in every later round "
                              "(each upload is the change of a client's row), which one round's noise does not "
                              "cover; expected privacy.mode=local or an algorithm whose server step uses only the "
                              "round's sum (fedavg, fedadam, fedprox, ...)")
        if self.central and self.cfg.accountant == "pld" and participation.sampling == "without_replacement":
            raise ConfigError("privacy.accountant: expected rdp with participation.pattern="
                              f"{participation.name} (S of N without replacement: dp-accounting's PLD accountant "
                              "has no such event)")
        if self.cfg.adaptive_quantile is not None and not self.central:
            raise ConfigError("privacy.adaptive_quantile: expected null with privacy.mode=local (the adaptive "
                              "clip's noised count is a central sum)")

    # ------------------------------------------------------------------------------------------ the client side
    def client_uploads(self, up: dict[str, Tensor], ids: np.ndarray, t: int) -> dict[str, Tensor]:
        """The uploads of clients ``ids`` as they leave the clients: clipped (and noised, in local mode)."""
        clip = self.state.clip
        out, norms = clip_uploads(up, self.names, clip)
        if self.cfg.adaptive_quantile is not None:
            self._below += int((norms <= clip).sum())
        if not self.central:
            sigma = self.state.accountant.sigma
            for row, client in enumerate(ids):
                z = gaussian_like({k: out[k][row] for k in self.names}, self.names, sigma * clip,
                                  generator(out[self.names[0]].device, self.seed, t, int(client), STREAM_LOCAL,
                                            secure=self.cfg.secure_noise))
                for k in self.names:
                    out[k][row] += z[k]
        return out

    # ------------------------------------------------------------------------------------------ the server side
    def server_rule(self, rule: ServerRule, probabilities: np.ndarray | None) -> ServerRule:
        """``rule`` applied to the noised sum (central mode; rank 0), normalized by the expected cohort under
        poisson participation (``probabilities``: the round's p_i^t). Collective, before the step's reduce:
        with adaptive clipping the round's count of clients within the clip is summed to rank 0 first."""
        if self.cfg.adaptive_quantile is not None:
            count = torch.tensor([self._below], dtype=torch.int64, device=self.world.device)
            self._count, self._below = float(reduce_to_root(self.world, count)), 0
        if not self.central:
            return rule

        def noised(server: dict[str, Tensor], up: dict[str, Tensor], ctx: RoundContext) -> dict[str, Tensor]:
            m = self.normalizer(probabilities, ctx.num_active)
            sigma, clip = self.update_multiplier(m), self.state.clip
            device = up[self.names[0]].device
            g = generator(device, self.seed, ctx.round, STREAM_CENTRAL, secure=self.cfg.secure_noise)
            z = gaussian_like(up, self.names, sigma * clip, g)
            if self.state.noise is not None:  # bandmf: round t's row of C^{-1} Z
                z = self.state.noise.correlate(z, self.names)
            if self.cfg.adaptive_quantile is not None:
                self.state.clip = self.next_clip(clip, m, ctx.num_active, ctx.round)
            return rule(server, {k: up[k] + z[k] if k in z else up[k] for k in up},
                        dataclasses.replace(ctx, num_active=m))

        return noised

    def normalizer(self, probabilities: np.ndarray | None, num_active: int) -> int:
        """m_t, the count the server rule divides by: the expected cohort max(1, round(sum_i p_i^t)) under
        poisson participation, else the round's |S_t| (a public fact of the schedule)."""
        if self.sampling == "poisson" and probabilities is not None:
            return max(1, round(float(np.sum(probabilities))))
        return num_active

    def update_multiplier(self, m: int) -> float:
        """The noise multiplier of the summed update: sigma, or with adaptive clipping
        sigma_u = (sigma^-2 - (2 sigma_b)^-2)^(-1/2) (:meth:`count_noise` sigma_b)."""
        sigma = self.state.accountant.sigma
        if self.cfg.adaptive_quantile is None or sigma == 0:
            return sigma
        return (sigma**-2 - (2 * self.count_noise(m)) ** -2) ** -0.5

    def count_noise(self, m: int) -> float:
        """sigma_b = max(m / 20, sigma): the paper's m / 20, and never so small that sigma_u has no solution."""
        return max(m / COUNT_NOISE_SHARE, self.state.accountant.sigma)

    def next_clip(self, clip: float, m: int, reported: int, t: int) -> float:
        """C_{t+1} = C_t exp(-eta_C (b_t - gamma)) with the noised share of clients within C_t (rank 0)

            b_t = (sum_{i in S_t} (b_i - 1/2) + N(0, sigma_b^2)) / m_t + 1/2,   b_i = 1[||u_i|| <= C_t],

        the shifted count of Andrew et al. 2021 (and TF Privacy's quantile estimator): adding or removing one
        client moves sum_i (b_i - 1/2) by exactly 1/2, the sensitivity :meth:`update_multiplier`'s sigma_u
        assumes (the unshifted sum_i b_i would move by 1 and spend four times the count's share). ``reported``:
        |S_t|, the clients whose b_i is in the count. A round nobody took part in (m_t = 0, possible without
        poisson sampling) keeps C_t: there is no share to estimate, and nobody's data is read."""
        if m == 0:
            return clip
        g = generator(torch.device("cpu"), self.seed, t, STREAM_COUNT, secure=self.cfg.secure_noise)
        noise = float(torch.randn(1, generator=g, dtype=torch.float64)) * self.count_noise(m)
        share = (self._count - reported / 2 + noise) / m + 0.5
        return clip * math.exp(-ADAPTIVE_LR * (share - float(self.cfg.adaptive_quantile)))

    # ------------------------------------------------------------------------------------------ accounting
    def after_step(self, t: int, participants: np.ndarray) -> dict[str, float]:
        """Round t done with ``participants`` (global ids; collective): with adaptive clipping every rank first
        learns C_{t+1} from rank 0; then the metrics' ``epsilon``, the noise it actually used
        (``noise_multiplier``, the sigma accounted; with adaptive clipping also the update's own
        ``update_noise_multiplier`` sigma_u and the count's ``count_noise`` sigma_b, so that epsilon can be
        recomputed from the records alone) and, when adaptive, ``clip``, the C of the next round."""
        if self.cfg.adaptive_quantile is not None:
            clip = torch.tensor([self.state.clip], dtype=torch.float64, device=self.world.device)
            self.state.clip = float(broadcast_from_root(self.world, clip))
        probabilities = self.participation.probabilities(t)
        if self.sampling == "poisson":
            self.check_poisson(t, probabilities, participants)
        q = float(np.max(probabilities)) if probabilities is not None and len(probabilities) else 1.0
        accountant = self.state.accountant
        out = {"noise_multiplier": accountant.sigma}
        if self.cfg.adaptive_quantile is not None:
            m = self.normalizer(probabilities, len(participants))
            out.update(update_noise_multiplier=self.update_multiplier(m), count_noise=self.count_noise(m))
        accountant.record(q, participants)
        out["epsilon"] = accountant.epsilon()
        if self.cfg.adaptive_quantile is not None:
            out["clip"] = self.state.clip
        return out

    def check_poisson(self, t: int, probabilities: np.ndarray | None, participants: np.ndarray) -> None:
        """A pattern that declares poisson sampling is held to it where the runtime can check: every round gives
        P(i in S_t) for every client, and nobody takes part whose probability is 0. Raises :class:`ConfigError`
        (one line, status 2) naming the pattern otherwise: its amplification would not be earned."""
        ok = valid_probabilities(probabilities, self.state.accountant.num_clients)
        if ok and (not len(participants) or float(np.min(probabilities[participants])) > 0):
            return
        raise ConfigError(f"participation.pattern={self.participation.name}: declares poisson sampling, but in round "
                          f"{t + 1} " + ("some participants have probability 0 in probabilities(t)" if ok else
                                         "probabilities(t) is not P(i in S_t) as numbers in [0, 1]") +
                          "; expected each client drawn independently with the probability it reports")

    def over_budget(self, t: int) -> str | None:
        """The line that stops the run before round t when that round would take epsilon past
        ``privacy.target_epsilon`` (a relative 1e-9 allows for the calibration's float order), else None."""
        target = self.cfg.target_epsilon
        if target is None:
            return None
        eps = self.next_epsilon(t)
        if eps <= target * (1 + BUDGET_SLACK):
            return None
        return (f"privacy: round {t + 1} would raise epsilon to {eps:.4g} (delta {self.cfg.delta:g}), past "
                f"privacy.target_epsilon = {target:g}; stopped after round {t}")

    def next_epsilon(self, t: int) -> float:
        """Epsilon after round t, before it runs."""
        probabilities = self.participation.probabilities(t)
        q = float(np.max(probabilities)) if probabilities is not None and len(probabilities) else 1.0
        clients = self.participants(t) if self.sampling in ("none", "local") else np.zeros(0, dtype=np.int64)
        return self.state.accountant.epsilon_after_next(q, clients)

    def participants(self, t: int) -> np.ndarray:
        """The clients of round t, from the planner (a fresh copy of the run's pattern, replayed from round 0
        when it is past t: a stateful pattern's draws depend on the rounds before), leaving the run's own
        pattern untouched."""
        if self.planner.next_round > t:
            self.planner.reset()
        while self.planner.next_round < t:
            self.planner.active(self.planner.next_round)
        return np.flatnonzero(self.planner.active(t))

    def check_source(self, saved: PrivacyConfig, saved_rounds: int, saved_planner: Any, where: str) -> None:
        """A resumed checkpoint's privacy state against its source (issue 46: a rewritten ``privacy/sigma``
        with a recomputed checksum was accepted and lowered the reported epsilon): its sigma must be its own
        config's (``saved``: the checkpoint's ``privacy`` section, ``saved_rounds`` its ``run.rounds``,
        ``saved_planner`` a fresh copy of its pattern) noise multiplier or that config's calibration, and
        every round's q the pattern's. Raises :class:`CheckpointError` (one line, status 2) otherwise. The
        rounds to come use this run's sigma (an accepted ``privacy.noise_multiplier``, or a recalibration
        for a changed ``run.rounds``), and every round is accounted at the sigma it used."""
        from fedrun.privacy.accountant import calibrate, rounded

        acc = self.state.accountant
        sigma, how = saved.noise_multiplier, "its privacy.noise_multiplier"
        if sigma is None:
            how = f"calibrated for privacy.target_epsilon {saved.target_epsilon:g} over {saved_rounds} rounds"
            if saved == self.cfg and saved_rounds == self.rounds:
                sigma = acc.sigma  # this run's calibration had the same inputs
            else:
                q, worst = plan(saved_planner, self.sampling, saved_rounds, self.num_clients)
                sigma = calibrate(saved, self.sampling, self.num_clients, self.cohort, q, worst) \
                    if self.band is None else self.band.calibrate(saved, worst)
        restored = self.state.restored_sigma
        if restored != sigma:
            raise CheckpointError(f"{where}: privacy/sigma is {restored!r}, but the checkpoint's config gives "
                                  f"{sigma!r} ({how}); its privacy state does not match its source")
        if self.band is not None and self.sigma != restored:  # its noise state and accountant hold one sigma
            raise ConfigError(f"privacy.noise_multiplier: the checkpoint's rounds used {restored!r} and this run's "
                              f"config gives {self.sigma!r}; privacy.mechanism=bandmf keeps one noise multiplier for "
                              "the whole run: keep privacy.noise_multiplier (or privacy.target_epsilon and "
                              "run.rounds) as the checkpoint's config has them")
        for t, q in enumerate(acc.q if self.band is None else ()):  # bandmf's accountant keeps no q
            probabilities = self.participation.probabilities(t) if self.sampling == "poisson" else None
            want = rounded(float(np.max(probabilities))) if probabilities is not None else 1.0
            if q != want:
                raise CheckpointError(f"{where}: privacy/q[{t}] is {q!r}, but participation.pattern="
                                      f"{self.participation.name} gives {want!r} for round {t + 1}; its privacy "
                                      "state does not match its source")

    def describe(self) -> str:
        """The start-up line: mode, sigma (and whether it was calibrated), C, accountant, sampling."""
        acc = self.state.accountant
        how = (f" (calibrated for epsilon {self.cfg.target_epsilon:g} at delta {self.cfg.delta:g} over "
               f"{self.rounds} rounds)") if self.calibrated else ""
        clip = f"clip {self.cfg.clip:g}" + (f" (adaptive to quantile {self.cfg.adaptive_quantile:g})"
                                            if self.cfg.adaptive_quantile is not None else "")
        why = f" ({self.unamplified})" if self.unamplified else ""
        band = "" if self.band is None else self.band.describe()
        return (f"privacy {self.cfg.mode}: noise_multiplier {acc.sigma:.6g}{how}, {clip}, {self.cfg.accountant} "
                f"accountant, {self.sampling.replace('_', ' ')} sampling{band}{why}")


def valid_probabilities(probabilities: np.ndarray | None, num_clients: int) -> bool:
    """``probabilities`` is P(i in S_t) for ``num_clients`` clients: float [N], every value in [0, 1]."""
    if probabilities is None:
        return False
    p = np.asarray(probabilities)
    return p.shape == (num_clients,) and np.issubdtype(p.dtype, np.floating) and bool(np.all((p >= 0) & (p <= 1)))


def plan(participation: Any, sampling: str, rounds: int, num_clients: int) -> tuple[list[float], int]:
    """The planned rounds of a fresh copy of the run's pattern, for calibration: each round's worst-client
    probability (poisson), and the most rounds one client joins (none)."""
    if sampling == "poisson":
        return [float(np.max(participation.probabilities(t))) for t in range(rounds)], 0
    if sampling == "without_replacement":
        return [1.0] * rounds, 0
    counts = np.zeros(num_clients, dtype=np.int64)
    for t in range(rounds):
        counts += participation.active(t)
    return [1.0] * rounds, int(counts.max(initial=0))
