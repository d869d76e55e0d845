"""``data.name=synthetic_fedprox``: Synthetic(alpha, beta) of the FedProx paper (Li et al., 2020), per client
on demand.

Client k (0 <= k < N = ``data.num_clients``) is generated from (seed, k) alone by its own counter-based
Philox stream, keyed by h(seed, STREAM, k), so any client is reproducible without the others and the
start-up holds only the N client sizes. In that stream, in this order:

    u_k ~ N(0, alpha^2),  B_k ~ N(0, beta^2)
    W_k ~ N(u_k, 1) in R^{C x d},  b_k ~ N(u_k, 1) in R^C,  v_k ~ N(B_k, 1) in R^d
    x = v_k + Sigma^{1/2} z,  z ~ N(0, I_d),  Sigma = diag(j^-1.2), j = 1..d
    y = argmax softmax(W_k x + b_k) = argmax (W_k x + b_k)

with d = 60, C = 10 by default (alpha, beta are standard deviations, as in the paper's generator). The
first n_k draws of x are the client's training examples, the next m_k = max(1, round(f n_k)) its test
examples (f = ``test_fraction``).

Sizes follow the paper's generator, a lognormal power law: n_k = min(50 + floor(exp(4 + 2 g_k)), max_examples),
g_k standard normal, computed for all N at once as g_k = Phi^-1(U_k) with U_k uniform from the hash
h(seed, SIZE_STREAM, k) (scipy.special.ndtri): O(N) with tiny constants, no per-client generator.
"""

from __future__ import annotations

import numpy as np
from scipy.special import ndtri

from fedrun.config import DataConfig
from fedrun.data.client_source import ClientSource, sample_clients
from fedrun.data.dataset import TaskData
from fedrun.data.hashing import hash_keys

STREAM = 0x46505258  # "FPRX": client k's Philox key h(seed, STREAM, k)
SIZE_STREAM = 0x4650535A  # "FPSZ": the uniforms U_k of the client sizes
POOL_STREAM = 0x46505054  # "FPPT": the clients whose test examples form the pooled test set
MIN_EXAMPLES, SIZE_MU, SIZE_SIGMA = 50, 4.0, 2.0


def client_sizes(num_clients: int, seed: int, max_examples: int) -> np.ndarray:
    """n_k = min(50 + floor(exp(4 + 2 Phi^-1(U_k))), max_examples), U_k in (0, 1) from h(seed, SIZE_STREAM, k)."""
    keys = hash_keys(seed, SIZE_STREAM, np.arange(num_clients))
    uniform = ((keys >> np.uint64(11)).astype(np.float64) + 0.5) / 2.0**53
    return np.minimum(MIN_EXAMPLES + np.floor(np.exp(SIZE_MU + SIZE_SIGMA * ndtri(uniform))),
                      max_examples).astype(np.int64)


class SyntheticFedprox(ClientSource):
    """Synthetic(alpha, beta): every client generated when it is loaded."""

    resident = False

    def __init__(self, cfg: DataConfig, seed: int) -> None:
        self.cfg, self.seed = cfg.synthetic_fedprox, seed
        self.num_examples = client_sizes(cfg.num_clients, seed, self.cfg.max_examples)
        self.test_examples = np.maximum(1, np.round(self.cfg.test_fraction * self.num_examples)).astype(np.int64)
        self.scale = np.arange(1, self.cfg.dim + 1, dtype=np.float64) ** -0.6  # sqrt(Sigma_jj)
        x_probe, y_probe = self.load(np.zeros(1, dtype=np.int64))
        x_test, y_test = self.load_test(sample_clients(cfg.num_clients, self.cfg.test_clients, seed, POOL_STREAM))
        self.task = TaskData("synthetic_fedprox", x_probe, y_probe, x_test, y_test, self.cfg.classes)

    def client(self, k: int, test: bool = False, key: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Client k's n_k training examples, or with ``test`` its m_k test examples: float32 x ``[n, d]`` and
        int64 y. Its stream draws the training rows' z before the test rows', so both are drawn; the other
        part's x and y are not computed (for the test examples, four fifths of the client at the default
        test_fraction: most of what evaluating a client cost). ``key``: h(seed, STREAM, k), if known."""
        c = self.cfg
        key = int(hash_keys(self.seed, STREAM, k)) if key is None else key
        rng = np.random.Generator(np.random.Philox(key=key))
        u, big_b = rng.normal(0.0, c.alpha), rng.normal(0.0, c.beta)
        w = rng.normal(u, 1.0, (c.classes, c.dim))
        b = rng.normal(u, 1.0, c.classes)
        v = rng.normal(big_b, 1.0, c.dim)
        n = int(self.num_examples[k])
        z = rng.standard_normal((n + int(self.test_examples[k]), c.dim))
        x = v + (z[n:] if test else z[:n]) * self.scale
        y = np.argmax(x @ w.T + b, axis=1).astype(np.int64)
        return x.astype(np.float32), y

    def _concat(self, ids: np.ndarray, test: bool) -> tuple[np.ndarray, np.ndarray]:
        xs, ys = [np.zeros((0, self.cfg.dim), dtype=np.float32)], [np.zeros(0, dtype=np.int64)]
        keys = hash_keys(self.seed, STREAM, np.asarray(ids, dtype=np.int64))  # all at once: a call costs ~40 us
        for k, key in zip(ids, keys, strict=True):
            x, y = self.client(int(k), test, int(key))
            xs.append(x)
            ys.append(y)
        return np.concatenate(xs), np.concatenate(ys)

    def load(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._concat(ids, test=False)

    def load_test(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._concat(ids, test=True)
