"""The built-in algorithms' hyperparameters: the keys of the ``algorithm`` section, typed and checked.

They live here, beside the rest of the config, and not in the algorithms' modules, so that reading and checking
a config (``fedrun config``, a sweep's validation on a login node) imports no torch; each algorithm names its
dataclass (``Hparams = FedAvgHparams``), and :data:`HPARAMS` maps ``algorithm.name`` to it. A plugin algorithm
carries its own ``Hparams`` (docs/extending.md). A field's trailing comment is its help text (``fedrun config
--defaults``); ``check`` bounds the values (one ConfigError line naming the key).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fedrun.errors import require

Weighting = Literal["uniform", "data_size"]  # how the adaptive server rules average their uploads
Form = Literal["code", "paper"]  # MIFA / FedVARP: as their code does, or as their paper writes


@dataclass
class GlobalLrHparams:
    """The hyperparameter every built-in algorithm starts with: the server learning rate eta_g > 0
    (an ``Hparams`` dataclass subclasses it and adds its own fields and checks after ``super().check()``)."""

    global_lr: float = 1.0  # eta_g

    def check(self) -> None:
        require(self.global_lr > 0, "algorithm.global_lr", "a number > 0", self.global_lr)


@dataclass
class FAdamGCHparams(GlobalLrHparams):
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    persist_moments: bool = False
    tracking: Literal["scaffold", "mean_active"] = "scaffold"
    correction: bool = True  # false: ghat = g, the uncorrected local-Adam baseline

    def check(self) -> None:
        super().check()
        require(0 <= self.beta1 < 1, "algorithm.beta1", "a number in [0, 1)", self.beta1)
        require(0 <= self.beta2 < 1, "algorithm.beta2", "a number in [0, 1)", self.beta2)
        require(self.eps > 0, "algorithm.eps", "a number > 0", self.eps)


@dataclass
class FADASHparams(GlobalLrHparams):
    global_lr: float = 1e-3  # eta (README, delay-adaptive; 1e-4 without)
    beta1: float = 0.9
    beta2: float = 0.99
    eps: float = 1e-8  # added after dividing sqrt(vhat) by sqrt(c2)
    max_init: float = 0.0  # vhat_0
    bias_correction: bool = True  # official code; false = paper form
    delay_adaptive: bool = True  # false: lambda = 1 always (asyncfl_forward.py)
    delay_rule: Literal["scale", "min"] = "scale"  # code: lambda = 1/tau_max; paper: min(eta, 1/tau_max)
    tau_c: int = 1  # delay threshold
    bn_buffers: Literal["average_of_buffer", "keep_global"] = "average_of_buffer"
    weighting: Literal["uniform", "data_size"] = "uniform"

    def check(self) -> None:
        super().check()
        require(0 <= self.beta1 < 1, "algorithm.beta1", "a number in [0, 1)", self.beta1)
        require(0 <= self.beta2 < 1, "algorithm.beta2", "a number in [0, 1)", self.beta2)
        require(self.eps >= 0, "algorithm.eps", "a number >= 0", self.eps)
        require(self.max_init >= 0, "algorithm.max_init", "a number >= 0", self.max_init)
        require(self.tau_c >= 0, "algorithm.tau_c", "an integer >= 0", self.tau_c)


@dataclass
class FAFEDHparams(GlobalLrHparams):
    alpha: float = 0.1  # STORM alpha (code default)
    beta: float = 0.1  # EMA weight on the OLD v (code: 0.1 or 0.01)
    rho: float = 0.1  # floor of A
    ext: float = 1.0  # scale on g_old in STORM (1 = exact STORM, the paper)
    global_lr: float = 1.0  # server step on the mean model change (1 = plain averaging, the code)
    init_m: Literal["global", "restart", "local"] = "global"
    bootstrap: Literal["round", "rho"] = "round"
    persist_client_state: bool = False
    schedule: Literal["constant", "cube_root"] = "constant"
    k0: float = 1.0  # cube_root constants (paper defaults not reachable)
    w: float = 1.0
    c: float = 1.0
    weighting: Literal["uniform", "data_size"] = "uniform"

    def check(self) -> None:
        require(0 < self.alpha <= 1, "algorithm.alpha", "a number in (0, 1]", self.alpha)
        require(0 <= self.beta < 1, "algorithm.beta", "a number in [0, 1)", self.beta)
        require(self.rho > 0, "algorithm.rho", "a number > 0", self.rho)
        super().check()
        require(self.init_m != "local" or self.persist_client_state, "algorithm.init_m",
                "global or restart unless persist_client_state is true", self.init_m)
        require(self.k0 > 0 and self.w > 0 and self.c > 0, "algorithm.k0/w/c", "numbers > 0",
                (self.k0, self.w, self.c))


@dataclass
class FedAdamomHparams(GlobalLrHparams):
    global_lr: float = 1.0  # eta (code --globallr)
    beta2: float = 0.05  # code --beta_0; paper ablation best 0.05 (README commands use 0.1)
    eps: float = 1e-3  # clip margin: beta1_t <= 1 - eps (code --eps)

    def check(self) -> None:
        super().check()
        require(0 <= self.beta2 < 1, "algorithm.beta2", "a number in [0, 1)", self.beta2)
        require(0 < self.eps <= 1, "algorithm.eps", "a number in (0, 1]", self.eps)


@dataclass
class FedAUHparams(GlobalLrHparams):
    cutoff: int | None = 50  # K_cut (FedSUM and the FedAWE code use 50); null: no cutoff (code default 1e5)

    def check(self) -> None:
        super().check()
        require(self.cutoff is None or self.cutoff >= 1, "algorithm.cutoff", "null or an integer >= 1",
                self.cutoff)


@dataclass
class FedAvgHparams(GlobalLrHparams):
    # how uploads are averaged: uniform 1/|S_t|, data_size n_i / sum n_j, average_all 1/N, known_prob 1/(N p_i)
    weighting: Literal["uniform", "data_size", "average_all", "known_prob"] = "uniform"


@dataclass
class FedAWEHparams(GlobalLrHparams):
    clip: float | None = 0.5  # r of CLIP_r on the mean echoed update (official code); null disables

    def check(self) -> None:
        super().check()
        require(self.clip is None or self.clip > 0, "algorithm.clip", "null or a number > 0", self.clip)


@dataclass
class FedCAdaHparams(GlobalLrHparams):
    global_lr: float = 1.0  # eta_g (1: plain averaging of the client models)
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    step_count: Literal["global", "restart"] = "global"  # s = n K + k, or s = k
    adjustment: Literal["none", "inv_t", "inv_sqrt_t", "exp"] = "none"
    adjust_a0: float = 1.0
    adjust_t0: float | None = None  # exp's time constant t0; null: T / 10
    adjust_moments: Literal["both", "m", "v"] = "both"
    weighting: Literal["uniform", "data_size"] = "uniform"

    def check(self) -> None:
        super().check()
        require(0 <= self.beta1 < 1, "algorithm.beta1", "a number in [0, 1)", self.beta1)
        require(0 <= self.beta2 < 1, "algorithm.beta2", "a number in [0, 1)", self.beta2)
        require(self.eps > 0, "algorithm.eps", "a number > 0", self.eps)
        require(self.adjust_a0 >= 0, "algorithm.adjust_a0", "a number >= 0", self.adjust_a0)
        require(self.adjust_t0 is None or self.adjust_t0 > 0, "algorithm.adjust_t0", "null or a number > 0",
                self.adjust_t0)


@dataclass
class FedAvgMHparams(GlobalLrHparams):
    beta: float = 0.9  # server momentum (no damping: effective step eta / (1 - beta))
    weighting: Weighting = "uniform"

    def check(self) -> None:
        super().check()
        require(0 <= self.beta < 1, "algorithm.beta", "a number in [0, 1)", self.beta)


@dataclass
class AdaptiveHparams(GlobalLrHparams):
    global_lr: float = 1e-2  # eta: tuned per task (Flower FedYogi's default; the paper grids powers of 10)
    beta1: float = 0.9
    tau: float = 1e-3  # adaptivity (denominator) term
    v_init: Literal["tau_squared", "zero"] = "tau_squared"  # v_{-1}: paper tau^2, Flower 0
    bias_correction: bool = False  # Adam's 1/(1 - beta^n) on m (and v for the EMA rules)
    weighting: Weighting = "uniform"

    def check(self) -> None:
        super().check()
        require(0 <= self.beta1 < 1, "algorithm.beta1", "a number in [0, 1)", self.beta1)
        require(self.tau >= 0, "algorithm.tau", "a number >= 0", self.tau)


@dataclass
class EmaHparams(AdaptiveHparams):
    beta2: float = 0.99

    def check(self) -> None:
        super().check()
        require(0 <= self.beta2 < 1, "algorithm.beta2", "a number in [0, 1)", self.beta2)


@dataclass
class FedAdamHparams(EmaHparams):
    """``bias_correction: flower`` reproduces Flower's FedAdam (flwr 1.42.0, ``FedAdam.aggregate_fit`` in
    flwr/server/strategy/fedadam.py and ``aggregate_train`` in flwr/serverapp/strategy/fedadam.py): m and v
    stay uncorrected and the step size becomes eta * sqrt(1 - beta2^(r+1)) / (1 - beta1^(r+1)) with Flower's
    round number r = t + 1 (its first round is 1), tau outside the correction:
    x <- x + eta_r m / (sqrt(v) + tau). With ``v_init: zero`` and ``weighting: data_size`` (Flower's
    defaults) the whole update is Flower's. An empty round still advances r, as in Flower."""

    bias_correction: bool | Literal["flower"] = False


@dataclass
class AdagradHparams(AdaptiveHparams):
    beta1: float = 0.0  # Flower fixes beta1 = 0 for FedAdagrad (no momentum)


@dataclass
class FedProxHparams(FedAvgHparams):
    mu: float = 0.01  # proximal weight (the paper tries 0.001, 0.01, 0.1, 1)

    def check(self) -> None:
        super().check()
        require(self.mu >= 0, "algorithm.mu", "a number >= 0", self.mu)


@dataclass
class FedSumHparams(GlobalLrHparams):
    skip_empty_rounds: bool = False  # default keeps the stale step x <- x - eta_g eta_l K y / N
    weighting: Literal["uniform", "data_size"] = "uniform"  # data_size: fedrun's extension


@dataclass
class FedSumCRHparams(FedSumHparams):
    # "cumulative" divides by C_t - C_{a_i} = sum_{s=a_i}^{t-1} eta_g eta_l(s) K / N and inverts the
    # server recursion exactly for any lr schedule (and skipped rounds); "constant" divides by
    # eta_g eta_l(t) K (t - a_i) / N, exact only when eta_l is constant and every round steps.
    cr_form: Literal["cumulative", "constant"] = "cumulative"


@dataclass
class FedTrimmedAvgHparams(GlobalLrHparams):
    beta: float = 0.2  # fraction trimmed at EACH end

    def check(self) -> None:
        require(0 <= self.beta < 0.5, "algorithm.beta", "a number in [0, 0.5)", self.beta)
        super().check()


@dataclass
class KrumHparams(GlobalLrHparams):
    num_malicious: int = 1  # f: the number of Byzantine clients per round the rule tolerates
    num_keep: int = 1  # m: 1 is Krum, > 1 Multi-Krum

    def check(self) -> None:
        require(self.num_malicious >= 0, "algorithm.num_malicious", "an integer >= 0", self.num_malicious)
        require(self.num_keep >= 1, "algorithm.num_keep", "an integer >= 1", self.num_keep)
        super().check()


@dataclass
class MifaHparams(GlobalLrHparams):
    form: Form = "code"
    # paper form: no model update until every client has reported once (FLGo's default, c = 1.0);
    # false: zero-initialized memories from round 0 (the only behaviour of the code form)
    wait_all: bool = False

    def check(self) -> None:
        super().check()
        require(not self.wait_all or self.form == "paper", "algorithm.wait_all",
                "false with form=code (the code form starts from zero memories)", self.wait_all)


@dataclass
class FedVarpHparams(GlobalLrHparams):
    form: Form = "code"  # paper: normalized pseudo-gradients (fedrun's option for a varying eta_l)


@dataclass
class ScaffoldHparams(GlobalLrHparams):
    form: Literal["original", "single_uplink"] = "original"


# algorithm.name -> its hyperparameters (fedrun.algorithms registers the same names)
HPARAMS: dict[str, type[GlobalLrHparams]] = {
    "fedavg": FedAvgHparams,
    "fedprox": FedProxHparams,
    "fedavgm": FedAvgMHparams,
    "fedadam": FedAdamHparams,
    "fedyogi": EmaHparams,
    "fedadagrad": AdagradHparams,
    "fedadamom": FedAdamomHparams,
    "mifa": MifaHparams,
    "fedvarp": FedVarpHparams,
    "fedau": FedAUHparams,
    "fedawe": FedAWEHparams,
    "fedsum_b": FedSumHparams,
    "fedsum": FedSumHparams,
    "fedsum_cr": FedSumCRHparams,
    "scaffold": ScaffoldHparams,
    "fadamgc": FAdamGCHparams,
    "fadas": FADASHparams,
    "fedcada": FedCAdaHparams,
    "fafed": FAFEDHparams,
    "fedmedian": GlobalLrHparams,
    "fedtrimmedavg": FedTrimmedAvgHparams,
    "krum": KrumHparams,
}
