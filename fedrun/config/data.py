"""The ``data`` section: which dataset, how its examples become clients, and one sub-section of settings for
each generated or file-backed dataset (``data.synthetic``, ``data.least_squares``, ``data.synthetic_fedprox``,
``data.federated_h5``; docs/datasets.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fedrun.errors import require


@dataclass
class SyntheticConfig:
    """Class-conditional Gaussian images or features (bench/README.md, W1/W2), generated from the run seed."""

    shape: list[int] = field(default_factory=lambda: [3, 32, 32])  # [C, H, W] or [features]
    num_classes: int = 10  # classes of the generated labels
    examples_per_client: int = 50  # training examples of every client
    test_examples: int = 1000  # examples of the global test set
    noise: float = 1.0  # std of the Gaussian around each class mean

    def check(self) -> None:
        require(len(self.shape) in (1, 3) and all(s >= 1 for s in self.shape), "data.synthetic.shape",
                 "[features] or [channels, height, width] of positive integers", self.shape)
        require(self.num_classes >= 2, "data.synthetic.num_classes", "an integer >= 2", self.num_classes)
        require(self.examples_per_client >= 1, "data.synthetic.examples_per_client", "an integer >= 1",
                 self.examples_per_client)
        require(self.test_examples >= 1, "data.synthetic.test_examples", "an integer >= 1",
                 self.test_examples)
        require(self.noise > 0, "data.synthetic.noise", "a number > 0", self.noise)


@dataclass
class LeastSquaresConfig:
    """f_i(x) = 1/(2 m) ||A_i x - b_i||^2, generated from the seed or loaded from a .npz (A, b, x0)."""

    file: str | None = None  # .npz with A [N, m, d], b [N, m], optional x0 [d]
    rows_per_client: int = 8  # m
    dim: int = 5  # d
    heterogeneity: float = 1.0  # scale of the per-client shift of b_i (0: every client has the same x*)
    noise: float = 0.1  # std of the Gaussian noise added to b_i

    def check(self) -> None:
        require(self.rows_per_client >= 1, "data.least_squares.rows_per_client", "an integer >= 1",
                 self.rows_per_client)
        require(self.dim >= 1, "data.least_squares.dim", "an integer >= 1", self.dim)
        require(self.heterogeneity >= 0, "data.least_squares.heterogeneity", "a number >= 0",
                 self.heterogeneity)
        require(self.noise >= 0, "data.least_squares.noise", "a number >= 0", self.noise)


@dataclass
class SyntheticFedproxConfig:
    """Synthetic(alpha, beta) of the FedProx paper, generated per client on demand (docs/datasets.md)."""

    alpha: float = 1.0  # std of u_k, the mean of client k's model W_k, b_k
    beta: float = 1.0  # std of B_k, the mean of client k's input mean v_k
    dim: int = 60  # input dimension of x (the paper's 60)
    classes: int = 10  # number of classes of y = argmax softmax(W_k x + b_k)
    max_examples: int = 5000  # client sizes 50 + floor(LogNormal(4, 2)) are clipped at this many
    test_fraction: float = 0.2  # client k also has max(1, round(test_fraction * n_k)) test examples
    test_clients: int = 1000  # the pooled test set: the test examples of a seeded sample of this many clients

    def check(self) -> None:
        require(self.alpha >= 0, "data.synthetic_fedprox.alpha", "a number >= 0", self.alpha)
        require(self.beta >= 0, "data.synthetic_fedprox.beta", "a number >= 0", self.beta)
        require(self.dim >= 1, "data.synthetic_fedprox.dim", "an integer >= 1", self.dim)
        require(self.classes >= 2, "data.synthetic_fedprox.classes", "an integer >= 2", self.classes)
        require(self.max_examples >= 50, "data.synthetic_fedprox.max_examples", "an integer >= 50",
                self.max_examples)
        require(0 < self.test_fraction < 1, "data.synthetic_fedprox.test_fraction", "a number in (0, 1)",
                self.test_fraction)
        require(self.test_clients >= 1, "data.synthetic_fedprox.test_clients", "an integer >= 1", self.test_clients)


@dataclass
class FederatedH5Config:
    """TensorFlow Federated's simulation HDF5 layout: ``examples/<client_id>/<feature>`` (docs/datasets.md)."""

    train: str | None = None  # the train file
    test: str | None = None  # the test file (same client ids)
    feature: str = "pixels"  # the input dataset of every client group
    label: str = "label"  # the label dataset of every client group
    test_clients: int = 1000  # the pooled test set: the test examples of a seeded sample of this many clients

    def check(self) -> None:
        require(self.test_clients >= 1, "data.federated_h5.test_clients", "an integer >= 1", self.test_clients)


@dataclass
class DataConfig:
    name: str = "mnist5k"  # the dataset: a name of `fedrun list` or package.module:loader
    root: str | None = None  # local data root for on-disk datasets
    num_clients: int = 100  # N, the simulated clients
    partition: str = "dirichlet"  # how examples become clients: iid, dirichlet, natural, shards, size_skew
    alpha: float = 0.3  # Dirichlet concentration over labels
    shards_per_client: int = 2  # shards: label-sorted shards per client (McMahan et al. 2017 use 2)
    size_sigma: float = 1.0  # size_skew: std of the log of the client sizes (lognormal); 0: equal sizes
    test_fraction: float = 0.2  # held-out share for datasets without a test split
    # per-client test data (docs/evaluation.md): each client's held-out share of its examples, split
    # before training (seeded by seed and client id); LEAF data with its own per-user test split uses
    # that split instead. 0 (default): no per-client test data, no per-client evaluation
    client_test_fraction: float = 0.0
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    least_squares: LeastSquaresConfig = field(default_factory=LeastSquaresConfig)
    synthetic_fedprox: SyntheticFedproxConfig = field(default_factory=SyntheticFedproxConfig)
    federated_h5: FederatedH5Config = field(default_factory=FederatedH5Config)

    def check(self) -> None:
        require(self.num_clients >= 1, "data.num_clients", "an integer >= 1", self.num_clients)
        require(self.alpha > 0, "data.alpha", "a number > 0", self.alpha)
        require(self.shards_per_client >= 1, "data.shards_per_client", "an integer >= 1",
                self.shards_per_client)
        require(self.size_sigma >= 0, "data.size_sigma", "a number >= 0", self.size_sigma)
        require(0 < self.test_fraction < 1, "data.test_fraction", "a number in (0, 1)", self.test_fraction)
        require(0 <= self.client_test_fraction < 1, "data.client_test_fraction",
                "a number in [0, 1) (0: no per-client evaluation)", self.client_test_fraction)
