"""FADAS (Wang, Wang, Lu, Chen, ICML 2024; docs/algorithms/fadas_fedcada_fafed_async.md).

Clients run plain local SGD and upload Delta_i = x_end - x_start (stateless). The server averages the
updates it consumes (uniform mean) into Delta_t and takes one AMSGrad step with Adam's bias correction
and the delay-adaptive factor lambda_t:

    m <- b1 m + (1-b1) Delta_t ; v <- b2 v + (1-b2) Delta_t^2 ; vhat <- max(vhat, v)   (uncorrected v)
    lambda_t = 1/tau_max if tau_max > tau_c else 1            (delay_rule "scale", official code)
    eta_t    = min(eta, 1/tau_max) if tau_max > tau_c else eta (delay_rule "min", paper form: lambda = eta_t/eta)
    bias_correction (default, code):  x <- x + (eta lambda / c1) m / (sqrt(vhat)/sqrt(c2) + eps)
                                      c1 = 1 - b1^n, c2 = 1 - b2^n, n = applied server steps (1-based)
    otherwise (paper):                x <- x + eta lambda m / (sqrt(vhat) + eps)

tau_max is the largest staleness of the consumed updates (``RoundContext.max_staleness``): 0 in synchronous
rounds, where FADAS is server AMSGrad (FedAMS); the official code's buffered asynchronous mode is the runtime's
``asynchrony`` section (fedrun.federation.schedule). ``delay_adaptive = false`` is the official
"FADAS without delay-adaptive" (lambda = 1). An empty round changes nothing (step count not advanced).
Down 1 (x) / up 1 (Delta_i). Server state x, m, v, vhat (+ the step counter).

``bn_buffers``: the flat model vector of this runtime holds trainable parameters only, so both settings
(``average_of_buffer``, the code; ``keep_global``) give the same result; the switch is kept for
runtimes whose models carry BatchNorm statistics.
"""

from __future__ import annotations

from torch import Tensor

from fedrun.algorithms.base import Entry, RoundContext, Scalar, Vector
from fedrun.algorithms.fedopt import ServerOptimizer
from fedrun.config.hparams import FADASHparams


def delay_factor(hp: FADASHparams, tau_max: int) -> float:
    """lambda_t: the multiplier of the server lr eta for a buffer whose largest staleness is tau_max."""
    if not hp.delay_adaptive or tau_max <= hp.tau_c:
        return 1.0
    if hp.delay_rule == "scale":
        return 1.0 / tau_max
    return min(hp.global_lr, 1.0 / tau_max) / hp.global_lr


def amsgrad_step(hp: FADASHparams, server: dict[str, Tensor], delta: Tensor, lam: float) -> dict[str, Tensor]:
    """One AMSGrad server step (module docstring) on the mean update ``delta`` with delay factor ``lam``."""
    steps = server["steps"] + 1
    m = hp.beta1 * server["m"] + (1 - hp.beta1) * delta
    v = hp.beta2 * server["v"] + (1 - hp.beta2) * delta * delta
    vhat = server["vhat"].maximum(v)
    if hp.bias_correction:
        c1 = 1 - hp.beta1 ** steps
        c2 = 1 - hp.beta2 ** steps
        x = server["x"] + (hp.global_lr * lam / c1) * m / (vhat.sqrt() / c2.sqrt() + hp.eps)
    else:
        x = server["x"] + hp.global_lr * lam * m / (vhat.sqrt() + hp.eps)
    return {"x": x, "m": m, "v": v, "vhat": vhat, "steps": steps}


class FADAS(ServerOptimizer):
    name = "fadas"
    Hparams = FADASHparams

    def server_state(self) -> tuple[Entry, ...]:
        return (Vector("m"), Vector("v"), Vector("vhat", self.hp.max_init), Scalar("steps"))

    def step(self, server: dict[str, Tensor], delta: Tensor, ctx: RoundContext) -> dict[str, Tensor]:
        return amsgrad_step(self.hp, server, delta, delay_factor(self.hp, ctx.max_staleness))
