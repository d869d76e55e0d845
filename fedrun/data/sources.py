"""On-disk datasets under ``data.root``: ``load_dataset(name, root, seed, test_fraction) -> TaskData``.

Nothing here downloads. Each dataset is looked for in a few conventional folders under ``data.root``
(see ``docs/datasets.md``); a missing root or folder raises DataError naming ``data.root`` and the
expected paths. Fashion-MNIST falls back to Debian's ``dataset-fashion-mnist`` package
(``/usr/share/datasets/fashion-mnist``) when ``data.root`` is unset.

Images are scaled to [0, 1] and normalized per channel with the mean and standard deviation of the
train split (both splits use the train statistics). Shakespeare stays int64 token ids.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedrun.data import formats
from fedrun.data.dataset import TaskData
from fedrun.errors import DataError

#: Where Debian's ``dataset-fashion-mnist`` package puts the four gzipped IDX files.
DEBIAN_FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")

Loader = Callable[[str | None, int, float], TaskData]


# ------------------------------------------------------------------------------------- normalization


def channel_stats(x: np.ndarray, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and standard deviation (float64 ``[C]``) of ``x * scale``, ``x`` ``[n, C, ...]``.

    Accumulates in float64 over chunks of samples, so uint8 data is never copied whole into floats.
    """
    c = x.shape[1]
    per_sample = max(1, int(np.prod(x.shape[1:])))
    step = max(1, (1 << 22) // per_sample)
    total = np.zeros(c)
    total_sq = np.zeros(c)
    for i in range(0, len(x), step):
        chunk = x[i:i + step].reshape(-1, c, per_sample // c).astype(np.float64)
        total += chunk.sum(axis=(0, 2))
        total_sq += np.square(chunk).sum(axis=(0, 2))
    count = max(1, len(x) * (per_sample // c))
    mean = total / count
    var = np.maximum(total_sq / count - mean**2, 0.0)
    return mean * scale, np.sqrt(var) * scale


def normalize_images(
    x_train: np.ndarray, x_test: np.ndarray, scale: float = 1 / 255
) -> tuple[np.ndarray, np.ndarray]:
    """Scale both splits by ``scale`` (to [0, 1]) and standardize each channel with train statistics.

    Returns float32 arrays. A constant channel keeps standard deviation 1 (no division by zero).
    """
    mean, std = channel_stats(x_train, scale)
    std = np.where(std > 1e-12, std, 1.0)
    shape = (1, -1) + (1,) * (x_train.ndim - 2)
    m, s = mean.astype(np.float32).reshape(shape), std.astype(np.float32).reshape(shape)
    out = []
    for x in (x_train, x_test):
        y = x.astype(np.float32)
        y *= np.float32(scale)
        y -= m
        y /= s
        out.append(y)
    return out[0], out[1]


# ----------------------------------------------------------------------------------- locating folders


@dataclass(frozen=True)
class _Layout:
    subdirs: tuple[str, ...]  # folders tried under data.root, in order; "" is data.root itself
    markers: tuple[str, ...]  # entries that must exist in the folder; "a|b" means a or b
    expected: str  # what the folder holds, for messages


_IDX_MARKERS = ("train-images-idx3-ubyte|train-images-idx3-ubyte.gz",)
_IDX_FILES = ("train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and "
              "t10k-labels-idx1-ubyte (each optionally .gz)")

_LAYOUTS: dict[str, _Layout] = {
    "mnist": _Layout(("mnist", "MNIST/raw", ""), _IDX_MARKERS, _IDX_FILES),
    "fashion_mnist": _Layout(("fashion_mnist", "fashion-mnist", "FashionMNIST/raw", ""), _IDX_MARKERS,
                             _IDX_FILES),
    "svhn": _Layout(("svhn", ""), ("train_32x32.mat",), "train_32x32.mat and test_32x32.mat"),
    "cifar10": _Layout(("cifar-10-batches-py", ""), ("data_batch_1",), "data_batch_1..5 and test_batch"),
    "cifar100": _Layout(("cifar-100-python", ""), ("train",), "train and test (fine labels)"),
    "tiny_imagenet": _Layout(("tiny-imagenet-200", ""), ("wnids.txt",),
                             "wnids.txt, train/<wnid>/images/*.JPEG, val/val_annotations.txt, val/images/"),
    "femnist": _Layout(("femnist/data", "femnist", ""), ("train|all_data",),
                       "train/*.json and test/*.json (LEAF), or all_data/*.json"),
    "shakespeare": _Layout(("shakespeare/data", "shakespeare", ""), ("train|all_data",),
                           "train/*.json and test/*.json (LEAF), or all_data/*.json"),
}


def dataset_dir(name: str, root: str | None) -> Path:
    """The folder under ``root`` that holds dataset ``name`` (the first of its layout's candidates)."""
    layout = _LAYOUTS[name]
    if root is None:
        raise DataError(f"dataset {name!r} needs data.root: set data.root=DIR with "
                        f"DIR/{layout.subdirs[0]}/ holding {layout.expected} (see docs/datasets.md)")
    base = Path(root).expanduser()
    tried = []
    for sub in layout.subdirs:
        d = base / sub if sub else base
        if all(any((d / alt).exists() for alt in m.split("|")) for m in layout.markers):
            return d
        tried.append(str(d))
    raise DataError(f"data.root={root}: no {name} files found; expected {tried[0]}/ holding "
                    f"{layout.expected} (also looked in {', '.join(tried[1:])})")


# -------------------------------------------------------------------------------------------- loaders


def _image_task(name: str, arrays: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], num_classes: int,
                scale: float = 1 / 255, groups: np.ndarray | None = None) -> TaskData:
    """The task of images ``arrays`` = (x_train, y_train, x_test, y_test), pixels times ``scale`` then
    normalized by the training set's statistics, integer labels."""
    x_train, y_train, x_test, y_test = arrays
    x_train, x_test = normalize_images(x_train, x_test, scale)
    return TaskData(name, x_train, y_train.astype(np.int64), x_test, y_test.astype(np.int64), num_classes,
                    groups=groups)


def _idx_task(name: str, directory: Path) -> TaskData:
    x_train, y_train, x_test, y_test = formats.read_mnist_idx(directory)
    for split, y in (("train", y_train), ("t10k", y_test)):
        if len(y) and y.max() > 9:
            raise DataError(f"{directory}/{split}-labels-idx1-ubyte: expected labels 0..9, found {y.max()}")
    return _image_task(name, (x_train[:, None], y_train, x_test[:, None], y_test), 10)


def load_mnist(root: str | None, seed: int = 0, test_fraction: float = 0.2) -> TaskData:
    """MNIST from IDX files: 60k/10k 28x28 grayscale digits, 10 classes, x ``[n, 1, 28, 28]``."""
    return _idx_task("mnist", dataset_dir("mnist", root))


def load_fashion_mnist(root: str | None, seed: int = 0, test_fraction: float = 0.2) -> TaskData:
    """Fashion-MNIST from IDX files; with ``root=None`` from Debian's dataset-fashion-mnist package."""
    if root is None:
        if not any((DEBIAN_FASHION_MNIST_DIR / m).is_file() for m in _IDX_MARKERS[0].split("|")):
            raise DataError(f"dataset 'fashion_mnist': data.root is unset and {DEBIAN_FASHION_MNIST_DIR} has "
                            "no IDX files; run 'apt-get install dataset-fashion-mnist' or set data.root=DIR "
                            f"with DIR/fashion_mnist/ holding {_IDX_FILES}")
        return _idx_task("fashion_mnist", DEBIAN_FASHION_MNIST_DIR)
    return _idx_task("fashion_mnist", dataset_dir("fashion_mnist", root))


def load_svhn(root: str | None, seed: int = 0, test_fraction: float = 0.2) -> TaskData:
    """SVHN cropped digits (train 73,257 / test 26,032), x ``[n, 3, 32, 32]``, label 10 read as 0."""
    d = dataset_dir("svhn", root)
    x_train, y_train = formats.read_svhn_mat(d / "train_32x32.mat")
    x_test, y_test = formats.read_svhn_mat(d / "test_32x32.mat")
    return _image_task("svhn", (x_train, y_train, x_test, y_test), 10)


def load_cifar10(root: str | None, seed: int = 0, test_fraction: float = 0.2) -> TaskData:
    """CIFAR-10 python batches (50k/10k), x ``[n, 3, 32, 32]``, 10 classes."""
    return _image_task("cifar10", formats.read_cifar10(dataset_dir("cifar10", root)), 10)


def load_cifar100(root: str | None, seed: int = 0, test_fraction: float = 0.2) -> TaskData:
    """CIFAR-100 python files (50k/10k), fine labels, x ``[n, 3, 32, 32]``, 100 classes."""
    return _image_task("cifar100", formats.read_cifar100(dataset_dir("cifar100", root)), 100)


def load_tiny_imagenet(root: str | None, seed: int = 0, test_fraction: float = 0.2) -> TaskData:
    """Tiny-ImageNet-200 (100k train, the 10k labelled val images as test), x ``[n, 3, 64, 64]``."""
    x_train, y_train, x_val, y_val, wnids = formats.read_tiny_imagenet(dataset_dir("tiny_imagenet", root))
    return _image_task("tiny_imagenet", (x_train, y_train, x_val, y_val), len(wnids))


def _leaf_users(name: str, root: str | None, seed: int, test_fraction: float,
                shuffle: bool) -> tuple[list[formats.LeafUser], list[formats.LeafUser]]:
    """LEAF train/test users; from ``all_data`` split per user by ``test_fraction`` when no train/ exists.

    The per-user split puts the last ``round(test_fraction * n)`` samples of each user (at least one
    sample stays in train) in test, after a seeded shuffle when ``shuffle`` (FEMNIST). Shakespeare is
    not shuffled, so its overlapping windows do not leak across the split.
    """
    d = dataset_dir(name, root)
    if (d / "train").exists():
        return formats.read_leaf_dir(d / "train"), formats.read_leaf_dir(d / "test")
    train, test = [], []
    rng = np.random.default_rng(seed)
    for u in formats.read_leaf_dir(d / "all_data"):
        n = len(u.y)
        n_test = min(max(n - 1, 0), int(round(test_fraction * n)))
        order = rng.permutation(n) if shuffle else np.arange(n)
        tr, te = order[: n - n_test], order[n - n_test:]
        train.append(formats.LeafUser(u.name, [u.x[i] for i in tr], [u.y[i] for i in tr], u.file))
        test.append(formats.LeafUser(u.name, [u.x[i] for i in te], [u.y[i] for i in te], u.file))
    return train, test


def _contiguous(groups: np.ndarray) -> np.ndarray:
    """Renumber group ids 0..G-1 in order of first appearance (users without train samples drop out)."""
    return np.unique(groups, return_inverse=True)[1].astype(np.int64)


def _user_groups(train_users: list[formats.LeafUser], g_train: np.ndarray, test_users: list[formats.LeafUser],
                 g_test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Client ids of the train examples (:func:`_contiguous`) and of the test examples: a test example
    belongs to the client of the train user with the same name (-1 when that user has no train examples)."""
    groups = _contiguous(g_train)
    client_of_user = dict.fromkeys((u.name for u in train_users), -1)
    for user_index, client in zip(g_train, groups, strict=True):
        client_of_user[train_users[user_index].name] = int(client)
    per_test_user = np.array([client_of_user.get(u.name, -1) for u in test_users] or [-1], dtype=np.int64)
    return groups, per_test_user[g_test]


def load_femnist(root: str | None, seed: int = 0, test_fraction: float = 0.2) -> TaskData:
    """LEAF FEMNIST: x ``[n, 1, 28, 28]``, 62 classes, ``groups`` = writer index of each train sample."""
    train_users, test_users = _leaf_users("femnist", root, seed, test_fraction, shuffle=True)
    x_train, y_train, g_train = formats.femnist_arrays(train_users)
    x_test, y_test, g_test = formats.femnist_arrays(test_users)
    groups, groups_test = _user_groups(train_users, g_train, test_users, g_test)
    task = _image_task("femnist", (x_train, y_train, x_test, y_test), 62, scale=1.0, groups=groups)
    task.groups_test = groups_test
    return task


def load_shakespeare(root: str | None, seed: int = 0, test_fraction: float = 0.2) -> TaskData:
    """LEAF Shakespeare next-character prediction: x int64 ``[n, 80]`` token ids, y int64 next token.

    Tokens index :data:`fedrun.data.formats.SHAKESPEARE_CHARS`; id 80 is any other character, so
    ``num_classes`` is 81. ``groups`` = speaking-role index of each train sample.
    """
    train_users, test_users = _leaf_users("shakespeare", root, seed, test_fraction, shuffle=False)
    x_train, y_train, g_train = formats.shakespeare_arrays(train_users)
    x_test, y_test, g_test = formats.shakespeare_arrays(test_users)
    groups, groups_test = _user_groups(train_users, g_train, test_users, g_test)
    return TaskData("shakespeare", x_train, y_train, x_test, y_test, formats.SHAKESPEARE_VOCAB_SIZE,
                    groups=groups, groups_test=groups_test)


ON_DISK: dict[str, Loader] = {
    "mnist": load_mnist,
    "fashion_mnist": load_fashion_mnist,
    "svhn": load_svhn,
    "cifar10": load_cifar10,
    "cifar100": load_cifar100,
    "tiny_imagenet": load_tiny_imagenet,
    "femnist": load_femnist,
    "shakespeare": load_shakespeare,
}


def load_dataset(name: str, root: str | None, seed: int = 0, test_fraction: float = 0.2,
                 download: bool = False) -> TaskData:
    """Load on-disk dataset ``name`` from ``root`` (``data.root``).

    ``seed`` and ``test_fraction`` matter only for LEAF data that comes without a train/test split
    (``all_data/``); every other dataset has its own test split. ``download=True`` is refused: this
    runtime never fetches data (compute nodes are often offline); place the files as
    ``docs/datasets.md`` describes.
    """
    if name not in ON_DISK:
        raise KeyError(f"unknown dataset {name!r} (known: {', '.join(sorted(ON_DISK))})")
    if download:
        raise DataError(f"dataset {name!r}: download=True is not supported; place the files under data.root "
                        "as docs/datasets.md describes")
    if not 0 < test_fraction < 1:
        raise DataError(f"data.test_fraction: expected a number in (0, 1), got {test_fraction}")
    return ON_DISK[name](root, seed, test_fraction)
