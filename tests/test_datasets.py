"""Dataset readers: small files written in the real on-disk formats, read back through the loaders."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest

from fedrun.config import DataConfig
from fedrun.data import formats, sources
from fedrun.data.partition import partition, split_client_tests
from fedrun.data.sources import load_dataset
from fedrun.errors import DataError

# ------------------------------------------------------------------------------------------- helpers


def write_idx(path: Path, arr: np.ndarray, gz: bool = True, type_code: int = 0x08) -> Path:
    """An IDX file: magic 0x0000TTNN, big-endian uint32 dimensions, then the data."""
    raw = bytes([0, 0, type_code, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()
    path = path.with_name(path.name + ".gz") if gz else path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return path


def mnist_like(directory: Path, gz: bool = True, n_train: int = 6, n_test: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    arrays = {}
    for split, n in (("train", n_train), ("t10k", n_test)):
        x = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        y = (np.arange(n) % 10).astype(np.uint8)
        write_idx(directory / f"{split}-images-idx3-ubyte", x, gz)
        write_idx(directory / f"{split}-labels-idx1-ubyte", y, gz)
        arrays[split] = (x, y)
    return arrays


def assert_one_line(err: pytest.ExceptionInfo, *needles: str) -> None:
    msg = str(err.value)
    assert "\n" not in msg
    for needle in needles:
        assert needle in msg, (needle, msg)


def py2_pickle(obj) -> bytes:
    """Protocol 2 as Python 2's cPickle wrote the CIFAR files: str as (SHORT_)BINSTRING, numpy arrays
    through numpy.core.multiarray._reconstruct + ndarray.__setstate__, dtypes through numpy.dtype."""
    out = bytearray(b"\x80\x02")

    def emit(o) -> None:
        if isinstance(o, dict):
            out.extend(b"}(")
            for k, v in o.items():
                emit(k)
                emit(v)
            out.extend(b"u")
        elif isinstance(o, list):
            out.extend(b"](")
            for v in o:
                emit(v)
            out.extend(b"e")
        elif isinstance(o, bytes):
            out.extend((b"U" + bytes([len(o)])) if len(o) < 256 else (b"T" + struct.pack("<I", len(o))))
            out.extend(o)
        elif isinstance(o, bool):
            out.extend(b"\x88" if o else b"\x89")
        elif isinstance(o, int):
            out.extend(b"J" + struct.pack("<i", o))
        elif o is None:
            out.extend(b"N")
        elif isinstance(o, np.ndarray):
            out.extend(b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n")
            emit(0)
            out.extend(b"\x85")  # TUPLE1: shape (0,)
            emit(b"b")
            out.extend(b"\x87R(")  # TUPLE3, REDUCE, then the __setstate__ tuple
            emit(1)
            out.extend(b"(")
            for d in o.shape:
                emit(d)
            out.extend(b"tcnumpy\ndtype\n")
            emit(o.dtype.str[1:].encode())
            emit(0)
            emit(1)
            out.extend(b"\x87R(")
            for v in (3, b"|", None, None, None, -1, -1, 0):
                emit(v)
            out.extend(b"tb")  # dtype state, BUILD
            emit(False)  # Fortran order
            emit(o.tobytes())
            out.extend(b"tb")
        else:
            raise TypeError(type(o))

    emit(obj)
    out.extend(b".")
    return bytes(out)


def cifar_rows(n: int, seed: int) -> np.ndarray:
    """Rows of R, G, B planes; plane k of row i is constant 10*i + k + 1 in pixel 0, random elsewhere."""
    rows = np.random.default_rng(seed).integers(0, 256, (n, 3072), dtype=np.uint8)
    for i in range(n):
        for k in range(3):
            rows[i, 1024 * k] = 10 * i + k + 1
    return rows


# -------------------------------------------------------------------------------------- MNIST, IDX


@pytest.mark.parametrize("gz", [True, False])
def test_mnist_idx_shapes_labels_normalization(tmp_path, gz):
    raw = mnist_like(tmp_path / "mnist", gz=gz)
    t = load_dataset("mnist", str(tmp_path), seed=0, test_fraction=0.2)
    assert t.x_train.shape == (6, 1, 28, 28) and t.x_test.shape == (4, 1, 28, 28)
    assert t.x_train.dtype == np.float32 and t.y_train.dtype == np.int64
    assert t.num_classes == 10 and t.groups is None and t.input_shape == (1, 28, 28)
    np.testing.assert_array_equal(t.y_train, raw["train"][1])
    np.testing.assert_array_equal(t.y_test, raw["t10k"][1])
    assert abs(t.x_train.mean()) < 1e-5 and abs(t.x_train.std() - 1) < 1e-4
    # the test split uses the train statistics
    scaled = raw["train"][0] / 255.0
    m, s = scaled.mean(), scaled.std()
    np.testing.assert_allclose(t.x_test[:, 0], (raw["t10k"][0] / 255.0 - m) / s, rtol=1e-5, atol=1e-5)


def test_mnist_found_directly_in_root_and_in_torchvision_layout(tmp_path):
    mnist_like(tmp_path / "a")
    mnist_like(tmp_path / "b" / "MNIST" / "raw", gz=False)
    assert load_dataset("mnist", str(tmp_path / "a"), 0, 0.2).x_train.shape[0] == 6
    assert load_dataset("mnist", str(tmp_path / "b"), 0, 0.2).x_train.shape[0] == 6


def test_fashion_mnist_root_and_default_dir(tmp_path, monkeypatch):
    mnist_like(tmp_path / "fashion-mnist", n_train=5)
    assert load_dataset("fashion_mnist", str(tmp_path), 0, 0.2).x_train.shape == (5, 1, 28, 28)
    monkeypatch.setattr(sources, "DEBIAN_FASHION_MNIST_DIR", tmp_path / "fashion-mnist")
    assert load_dataset("fashion_mnist", None, 0, 0.2).x_train.shape == (5, 1, 28, 28)
    monkeypatch.setattr(sources, "DEBIAN_FASHION_MNIST_DIR", tmp_path / "nowhere")
    with pytest.raises(DataError) as err:
        load_dataset("fashion_mnist", None, 0, 0.2)
    assert_one_line(err, "data.root", "dataset-fashion-mnist", str(tmp_path / "nowhere"))


@pytest.mark.skipif(not (sources.DEBIAN_FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz").is_file(),
                    reason="Debian package dataset-fashion-mnist not installed")
def test_fashion_mnist_from_debian_package():
    t = load_dataset("fashion_mnist", None, 0, 0.2)
    assert t.x_train.shape == (60000, 1, 28, 28) and t.x_test.shape == (10000, 1, 28, 28)
    assert list(t.y_train[:5]) == [9, 0, 0, 3, 0]
    assert np.bincount(t.y_train).tolist() == [6000] * 10


def test_idx_bad_magic(tmp_path):
    mnist_like(tmp_path)
    bad = tmp_path / "train-images-idx3-ubyte.gz"
    raw = bytearray(gzip.decompress(bad.read_bytes()))
    raw[0:4] = b"\x00\x00\x07\x03"
    bad.write_bytes(gzip.compress(bytes(raw)))
    with pytest.raises(DataError) as err:
        load_dataset("mnist", str(tmp_path), 0, 0.2)
    assert_one_line(err, str(bad), "magic number 0x00000703")


def test_idx_wrong_number_of_dimensions(tmp_path):
    mnist_like(tmp_path)
    path = write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros((4, 2), np.uint8))
    with pytest.raises(DataError) as err:
        load_dataset("mnist", str(tmp_path), 0, 0.2)
    assert_one_line(err, str(path), "2 dimensions", "expected 1")


def test_idx_truncated_data_and_truncated_gzip(tmp_path):
    mnist_like(tmp_path, gz=False)
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(DataError) as err:
        load_dataset("mnist", str(tmp_path), 0, 0.2)
    assert_one_line(err, str(path), "truncated", "[6, 28, 28]")

    gz = write_idx(tmp_path / "gz" / "train-images-idx3-ubyte", np.zeros((6, 28, 28), np.uint8))
    gz.write_bytes(gz.read_bytes()[:20])
    with pytest.raises(DataError) as err:
        formats.read_idx(gz)
    assert_one_line(err, str(gz), "gzip")


def test_idx_label_count_mismatch_and_trailing_bytes(tmp_path):
    mnist_like(tmp_path)
    path = write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(5, np.uint8))
    with pytest.raises(DataError) as err:
        load_dataset("mnist", str(tmp_path), 0, 0.2)
    assert_one_line(err, str(path), "5 labels", "expected 6")

    extra = tmp_path / "extra-idx1-ubyte"
    extra.write_bytes(bytes([0, 0, 8, 1]) + struct.pack(">I", 2) + b"\x01\x02\x03")
    with pytest.raises(DataError) as err:
        formats.read_idx(extra)
    assert_one_line(err, str(extra), "trailing")


def test_idx_other_type_codes_read_big_endian(tmp_path):
    arr = np.arange(6, dtype=">i4").reshape(2, 3)
    path = write_idx(tmp_path / "x-idx2-int", arr, gz=False, type_code=0x0C)
    out = formats.read_idx(path, ndim=2)
    assert out.dtype == np.int32 and out.dtype.isnative
    np.testing.assert_array_equal(out, np.arange(6).reshape(2, 3))


# ---------------------------------------------------------------------------------- missing roots


def test_missing_root_and_missing_files_name_data_root_and_paths(tmp_path):
    with pytest.raises(DataError) as err:
        load_dataset("cifar10", None, 0, 0.2)
    assert_one_line(err, "data.root", "cifar-10-batches-py", "data_batch_1")
    with pytest.raises(DataError) as err:
        load_dataset("mnist", str(tmp_path), 0, 0.2)
    assert_one_line(err, "data.root", str(tmp_path / "mnist"), "train-images-idx3-ubyte")
    (tmp_path / "mnist").mkdir()
    write_idx(tmp_path / "mnist" / "train-images-idx3-ubyte", np.zeros((2, 28, 28), np.uint8))
    with pytest.raises(DataError) as err:
        load_dataset("mnist", str(tmp_path), 0, 0.2)
    assert_one_line(err, "missing file", str(tmp_path / "mnist" / "train-labels-idx1-ubyte"),
                    "train-labels-idx1-ubyte.gz")


def test_unknown_dataset_and_download_refused(tmp_path):
    with pytest.raises(KeyError):
        load_dataset("imagenet", str(tmp_path), 0, 0.2)
    with pytest.raises(DataError) as err:
        load_dataset("mnist", str(tmp_path), 0, 0.2, download=True)
    assert_one_line(err, "download")
    assert issubclass(DataError, ValueError)


# ---------------------------------------------------------------------------------------------- SVHN


def write_svhn(path: Path, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    import scipy.io

    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8)
    y = (np.arange(n) % 10 + 1).reshape(n, 1).astype(np.uint8)  # 1..10, 10 meaning digit 0
    path.parent.mkdir(parents=True, exist_ok=True)
    scipy.io.savemat(path, {"X": x, "y": y})
    return x, y


def test_svhn_mat_layout_and_label_10_is_0(tmp_path):
    x, y = write_svhn(tmp_path / "svhn" / "train_32x32.mat", 12, 0)
    write_svhn(tmp_path / "svhn" / "test_32x32.mat", 5, 1)
    raw_x, raw_y = formats.read_svhn_mat(tmp_path / "svhn" / "train_32x32.mat")
    assert raw_x.shape == (12, 3, 32, 32) and raw_x.dtype == np.uint8
    assert raw_x[7, 2, 4, 9] == x[4, 9, 2, 7]  # X[row, col, channel, i] -> x[i, channel, row, col]
    assert raw_y.tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2]
    t = load_dataset("svhn", str(tmp_path), 0, 0.2)
    assert t.x_train.shape == (12, 3, 32, 32) and t.x_test.shape == (5, 3, 32, 32)
    np.testing.assert_allclose(t.x_train.mean(axis=(0, 2, 3)), 0, atol=1e-5)
    np.testing.assert_allclose(t.x_train.std(axis=(0, 2, 3)), 1, atol=1e-4)
    assert t.y_test.tolist() == [1, 2, 3, 4, 5]


def test_svhn_wrong_shape_and_corrupt_file(tmp_path):
    import scipy.io

    bad = tmp_path / "train_32x32.mat"
    scipy.io.savemat(bad, {"X": np.zeros((28, 28, 3, 2), np.uint8), "y": np.ones((2, 1), np.uint8)})
    with pytest.raises(DataError) as err:
        formats.read_svhn_mat(bad)
    assert_one_line(err, str(bad), "[32, 32, 3, n]", "[28, 28, 3, 2]")
    scipy.io.savemat(bad, {"X": np.zeros((32, 32, 3, 2), np.uint8), "y": np.ones((3, 1), np.uint8)})
    with pytest.raises(DataError) as err:
        formats.read_svhn_mat(bad)
    assert_one_line(err, str(bad), "y of shape [2, 1]")
    bad.write_bytes(b"not a mat file at all" * 10)
    with pytest.raises(DataError) as err:
        formats.read_svhn_mat(bad)
    assert_one_line(err, str(bad))


# --------------------------------------------------------------------------------------------- CIFAR


def write_cifar10(directory: Path, n: int = 3) -> dict[str, np.ndarray]:
    directory.mkdir(parents=True, exist_ok=True)
    rows = {}
    for k, name in enumerate([f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]):
        rows[name] = cifar_rows(n, k)
        batch = {b"batch_label": f"batch {k}".encode(), b"labels": [(k + i) % 10 for i in range(n)],
                 b"data": rows[name], b"filenames": [f"img_{k}_{i}.png".encode() for i in range(n)]}
        (directory / name).write_bytes(py2_pickle(batch))
    return rows


def test_python2_style_pickle_is_what_pickle_itself_reads(tmp_path):
    rows = cifar_rows(2, 0)
    obj = pickle.loads(py2_pickle({b"data": rows, b"labels": [1, 2]}), encoding="bytes")
    np.testing.assert_array_equal(obj[b"data"], rows)


def test_cifar10_python_batches(tmp_path):
    rows = write_cifar10(tmp_path / "cifar-10-batches-py")
    x, y = formats.read_cifar_batch(tmp_path / "cifar-10-batches-py" / "data_batch_2", "labels", 10)
    assert x.shape == (3, 3, 32, 32) and x.dtype == np.uint8 and y.tolist() == [1, 2, 3]
    assert [x[2, c, 0, 0] for c in range(3)] == [21, 22, 23]  # R, G, B planes in order
    np.testing.assert_array_equal(x.reshape(3, -1), rows["data_batch_2"])
    t = load_dataset("cifar10", str(tmp_path), 0, 0.2)
    assert t.x_train.shape == (15, 3, 32, 32) and t.x_test.shape == (3, 3, 32, 32)
    assert t.y_train.tolist()[:6] == [0, 1, 2, 1, 2, 3] and t.y_test.tolist() == [5, 6, 7]
    np.testing.assert_allclose(t.x_train.mean(axis=(0, 2, 3)), 0, atol=1e-5)


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_cifar100_fine_labels_resaved_by_python3(tmp_path, protocol):
    d = tmp_path / "cifar-100-python"
    d.mkdir()
    for name, n in (("train", 4), ("test", 2)):
        batch = {b"data": cifar_rows(n, n), b"fine_labels": [99 - i for i in range(n)],
                 b"coarse_labels": [19] * n}
        (d / name).write_bytes(pickle.dumps(batch, protocol=protocol))
    t = load_dataset("cifar100", str(tmp_path), 0, 0.2)
    assert t.num_classes == 100 and t.y_train.tolist() == [99, 98, 97, 96] and t.y_test.tolist() == [99, 98]
    assert t.x_train.shape == (4, 3, 32, 32)


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_rejected_before_running(tmp_path):
    marker = tmp_path / "pwned"
    d = tmp_path / "cifar-10-batches-py"
    write_cifar10(d)
    (d / "data_batch_3").write_bytes(pickle.dumps({b"data": _Evil(marker), b"labels": [0]}, protocol=2))
    with pytest.raises(DataError) as err:
        load_dataset("cifar10", str(tmp_path), 0, 0.2)
    assert_one_line(err, str(d / "data_batch_3"), "refusing", "system")
    assert not marker.exists()
    evil = tmp_path / "eval.pkl"
    evil.write_bytes(b"\x80\x02cbuiltins\neval\nX\x06\x00\x00\x001 + 1\x85R.")
    with pytest.raises(DataError) as err:
        formats.safe_unpickle(evil)
    assert_one_line(err, "builtins.eval")
    # _codecs.encode is allowed only as Python 3's latin1 bytes trick
    codec = tmp_path / "codec.pkl"
    codec.write_bytes(b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00aX\x03\x00\x00\x00hex\x86R.")
    with pytest.raises(DataError) as err:
        formats.safe_unpickle(codec)
    assert_one_line(err, "latin1")


def test_object_arrays_and_wrong_shapes_rejected(tmp_path):
    path = tmp_path / "test_batch"
    path.write_bytes(pickle.dumps({b"data": np.array([1, "a"], dtype=object), b"labels": [0, 1]}))
    with pytest.raises(DataError) as err:
        formats.read_cifar_batch(path, "labels", 10)
    assert_one_line(err, str(path), "object dtype")
    path.write_bytes(pickle.dumps({b"data": np.zeros((2, 1024), np.uint8), b"labels": [0, 1]}))
    with pytest.raises(DataError) as err:
        formats.read_cifar_batch(path, "labels", 10)
    assert_one_line(err, str(path), "[n, 3072] uint8", "[2, 1024]")
    path.write_bytes(pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}))
    with pytest.raises(DataError) as err:
        formats.read_cifar_batch(path, "labels", 10)
    assert_one_line(err, str(path), "0..9")
    path.write_bytes(pickle.dumps({b"data": np.zeros((2, 3072), np.uint8)}))
    with pytest.raises(DataError) as err:
        formats.read_cifar_batch(path, "fine_labels", 100)
    assert_one_line(err, str(path), "fine_labels")
    path.write_bytes(py2_pickle({b"data": cifar_rows(2, 0), b"labels": [0, 1]})[:-500])
    with pytest.raises(DataError) as err:
        formats.read_cifar_batch(path, "labels", 10)
    assert_one_line(err, str(path), "truncated")


# ------------------------------------------------------------------------------------- Tiny-ImageNet


def write_jpeg(path: Path, color, size: int = 64, mode: str = "RGB") -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, (size, size), color).save(path, "JPEG")


def write_tiny_imagenet(root: Path) -> Path:
    d = root / "tiny-imagenet-200"
    d.mkdir(parents=True)
    wnids = ["n01443537", "n09999999"]
    (d / "wnids.txt").write_text("\n".join(wnids) + "\n")
    colors = [(200, 20, 20), (20, 20, 200)]
    for w, c in zip(wnids, colors, strict=True):
        for k in range(2):
            write_jpeg(d / "train" / w / "images" / f"{w}_{k}.JPEG", c)
        (d / "train" / w / f"{w}_boxes.txt").write_text("")
    write_jpeg(d / "train" / wnids[1] / "images" / f"{wnids[1]}_2.JPEG", 128, mode="L")  # grayscale
    write_jpeg(d / "val" / "images" / "val_0.JPEG", colors[1])
    write_jpeg(d / "val" / "images" / "val_1.JPEG", colors[0])
    (d / "val" / "val_annotations.txt").write_text(
        f"val_0.JPEG\t{wnids[1]}\t0\t0\t63\t63\nval_1.JPEG\t{wnids[0]}\t1\t2\t40\t50\n")
    return d


def test_tiny_imagenet_folder(tmp_path):
    d = write_tiny_imagenet(tmp_path)
    x, y, xv, yv, wnids = formats.read_tiny_imagenet(d)
    assert x.shape == (5, 3, 64, 64) and x.dtype == np.uint8 and y.tolist() == [0, 0, 1, 1, 1]
    assert yv.tolist() == [1, 0] and wnids == ["n01443537", "n09999999"]
    assert abs(int(x[0, 0].mean()) - 200) < 8 and abs(int(x[0, 2].mean()) - 20) < 8  # red, channel first
    assert abs(int(xv[0, 2].mean()) - 200) < 8  # val_0 is blue
    assert (x[4, 0] == x[4, 1]).all()  # the grayscale image became RGB
    t = load_dataset("tiny_imagenet", str(tmp_path), 0, 0.2)
    assert t.num_classes == 2 and t.x_train.shape == (5, 3, 64, 64) and t.x_test.shape == (2, 3, 64, 64)
    assert t.x_train.dtype == np.float32


def test_tiny_imagenet_errors(tmp_path):
    d = write_tiny_imagenet(tmp_path)
    ann = d / "val" / "val_annotations.txt"
    ann.write_text("val_0.JPEG\tn00000000\t0\t0\t1\t1\n")
    with pytest.raises(DataError) as err:
        formats.read_tiny_imagenet(d)
    assert_one_line(err, f"{ann}:1", "n00000000")
    ann.write_text("val_0.JPEG\tn09999999\t0\t0\t63\t63\n")
    small = d / "val" / "images" / "val_0.JPEG"
    write_jpeg(small, (1, 2, 3), size=32)
    with pytest.raises(DataError) as err:
        formats.read_tiny_imagenet(d)
    assert_one_line(err, str(small), "64x64", "32x32")
    write_jpeg(small, (1, 2, 3))
    small.write_bytes(small.read_bytes()[:200])
    with pytest.raises(DataError) as err:
        formats.read_tiny_imagenet(d)
    assert_one_line(err, str(small))
    (d / "wnids.txt").write_text("n01443537\nn09999999\nn05555555\n")
    with pytest.raises(DataError) as err:
        formats.read_tiny_imagenet(d)
    assert_one_line(err, str(d / "train" / "n05555555" / "images"))


# ---------------------------------------------------------------------------------------------- LEAF


def leaf_doc(users: dict[str, tuple[list, list]]) -> dict:
    return {"users": list(users), "num_samples": [len(y) for _, y in users.values()],
            "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}


def write_femnist(root: Path) -> Path:
    d = root / "femnist" / "data"
    rng = np.random.default_rng(0)

    def px(n):
        return rng.random((n, 784)).round(3).tolist()

    (d / "train").mkdir(parents=True)
    (d / "test").mkdir()
    (d / "train" / "all_data_0_niid_0_keep_0_train_9.json").write_text(json.dumps(
        leaf_doc({"f0000_14": (px(2), [3, 61]), "f0001_41": (px(3), [0, 10, 36])})))
    (d / "train" / "all_data_1_niid_0_keep_0_train_9.json").write_text(json.dumps(
        leaf_doc({"f0002_07": (px(1), [5])})))
    (d / "test" / "all_data_0_niid_0_keep_0_test_9.json").write_text(json.dumps(
        leaf_doc({"f0000_14": (px(1), [7]), "f0002_07": (px(2), [8, 9])})))
    return d


def test_femnist_leaf_json(tmp_path):
    write_femnist(tmp_path)
    t = load_dataset("femnist", str(tmp_path), 0, 0.2)
    assert t.x_train.shape == (6, 1, 28, 28) and t.x_test.shape == (3, 1, 28, 28)
    assert t.x_train.dtype == np.float32 and t.num_classes == 62
    assert t.y_train.tolist() == [3, 61, 0, 10, 36, 5] and t.y_test.tolist() == [7, 8, 9]
    assert t.groups is not None and t.groups.dtype == np.int64
    assert t.groups.tolist() == [0, 0, 1, 1, 1, 2]
    assert t.groups_test.tolist() == [0, 2, 2]  # the test examples of users f0000_14 and f0002_07
    assert abs(t.x_train.mean()) < 1e-5 and abs(t.x_train.std() - 1) < 1e-4


def test_per_client_test_split_leaf_users_and_held_out_rows(tmp_path):
    """LEAF: each client is tested on its own user's test examples, its training rows untouched.
    Elsewhere: m_i = min(n_i - 1, max(1, round(f n_i))) held-out rows, a function of (seed, client) only."""
    write_femnist(tmp_path)
    t = load_dataset("femnist", str(tmp_path), 0, 0.2)
    leaf = DataConfig(name="femnist", num_clients=3, partition="natural", client_test_fraction=0.5)
    parts = partition(t, leaf, 0)
    train, tests = split_client_tests(t, parts, leaf, 0)
    assert [p.tolist() for p in train] == [p.tolist() for p in parts]
    assert tests.y is t.y_test and [p.tolist() for p in tests.parts] == [[0], [], [1, 2]]
    t.groups_test = None  # the held-out split of the same clients
    train, tests = split_client_tests(t, parts, leaf, 0)
    assert [len(p) for p in tests.parts] == [1, 2, 0] and [len(p) for p in train] == [1, 1, 1]
    for i, rows in enumerate(parts):
        assert sorted([*train[i], *tests.parts[i]]) == rows.tolist()
    # a client's split depends on the seed and its id, not on the other clients (so not on the ranks)
    many = [np.arange(100) + 100 * i for i in range(4)]
    held = split_client_tests(t, many, DataConfig(client_test_fraction=0.2), 7)[1].parts
    again = split_client_tests(t, many[:2], DataConfig(client_test_fraction=0.2), 7)[1].parts
    other = split_client_tests(t, many, DataConfig(client_test_fraction=0.2), 8)[1].parts
    assert [len(h) for h in held] == [20] * 4 and [h.tolist() for h in again] == [h.tolist() for h in held[:2]]
    assert held[0].tolist() != other[0].tolist() and held[0].tolist() != (held[1] - 100).tolist()


def test_femnist_errors_name_the_file(tmp_path):
    d = write_femnist(tmp_path)
    bad = d / "train" / "all_data_1_niid_0_keep_0_train_9.json"
    bad.write_text('{"users": ["a"], "user_data": {"a": {"x": [[0.1, 0.2]], "y": [1]}}}')
    with pytest.raises(DataError) as err:
        load_dataset("femnist", str(tmp_path), 0, 0.2)
    assert_one_line(err, str(bad), "[n, 784]", "[1, 2]")
    bad.write_text('{"users": ["a"], "user_data": {"a": {"x": [], "y": [')
    with pytest.raises(DataError) as err:
        load_dataset("femnist", str(tmp_path), 0, 0.2)
    assert_one_line(err, str(bad), "bad JSON", "line 1")
    bad.write_text(json.dumps({"users": ["a"], "num_samples": [2],
                               "user_data": {"a": {"x": [[0.0] * 784], "y": [1]}}}))
    with pytest.raises(DataError) as err:
        load_dataset("femnist", str(tmp_path), 0, 0.2)
    assert_one_line(err, str(bad), "num_samples says 2")
    bad.write_text(json.dumps({"users": ["a", "b"], "user_data": {"a": {"x": [], "y": []}}}))
    with pytest.raises(DataError) as err:
        load_dataset("femnist", str(tmp_path), 0, 0.2)
    assert_one_line(err, str(bad), "'b'")
    for f in (d / "test").iterdir():
        f.unlink()
    bad.unlink()
    with pytest.raises(DataError) as err:
        load_dataset("femnist", str(tmp_path), 0, 0.2)
    assert_one_line(err, str(d / "test") + "/*.json")


def test_shakespeare_vocabulary():
    chars = formats.SHAKESPEARE_CHARS
    assert len(chars) == 80 and len(set(chars)) == 80
    assert formats.SHAKESPEARE_UNK == 80 and formats.SHAKESPEARE_VOCAB_SIZE == 81
    assert formats.encode_chars("\n a}").tolist() == [0, 1, chars.index("a"), 79]
    assert formats.encode_chars("é#\t€😀").tolist() == [80] * 5


def test_shakespeare_leaf_json(tmp_path):
    d = tmp_path / "shakespeare" / "data"
    (d / "train").mkdir(parents=True)
    (d / "test").mkdir()
    line = "To be, or not to be: that is the question. Whether 'tis nobler in the mind to suf"
    assert len(line) == 81
    x0, y0 = line[:80], line[80]
    odd = "é" + line[1:80]
    (d / "train" / "train.json").write_text(json.dumps(leaf_doc({
        "THE_TRAGEDY_OF_HAMLET_HAMLET": ([x0, x0[1:] + y0], [y0, "f"]),
        "THE_TEMPEST_PROSPERO": ([odd], ["é"])})))
    (d / "test" / "test.json").write_text(json.dumps(leaf_doc({
        "THE_TEMPEST_PROSPERO": ([x0], ["X"])})))
    t = load_dataset("shakespeare", str(tmp_path), 0, 0.2)
    assert t.x_train.shape == (3, 80) and t.x_train.dtype == np.int64 and t.y_train.dtype == np.int64
    assert t.num_classes == 81 and t.input_shape == (80,)
    assert "".join(formats.SHAKESPEARE_CHARS[i] for i in t.x_train[0]) == x0
    assert t.x_train[2, 0] == 80 and t.y_train.tolist()[2] == 80
    assert y0 == "f" and t.y_train[0] == formats.SHAKESPEARE_CHARS.index("f") == 58
    assert t.groups.tolist() == [0, 0, 1]
    assert t.y_test.tolist() == [formats.SHAKESPEARE_CHARS.index("X")]
    (d / "test" / "test.json").write_text(json.dumps(leaf_doc({"A": (["too short"], ["x"])})))
    with pytest.raises(DataError) as err:
        load_dataset("shakespeare", str(tmp_path), 0, 0.2)
    assert_one_line(err, str(d / "test" / "test.json"), "80 characters")


def test_leaf_all_data_split_by_test_fraction(tmp_path):
    d = tmp_path / "femnist" / "data" / "all_data"
    d.mkdir(parents=True)
    users = {f"w{k}": ([[k / 10] * 784] * n, list(range(n))) for k, n in enumerate([10, 1, 4])}
    (d / "all_data_0.json").write_text(json.dumps(leaf_doc(users)))
    a = load_dataset("femnist", str(tmp_path), 3, 0.2)
    b = load_dataset("femnist", str(tmp_path), 3, 0.2)
    c = load_dataset("femnist", str(tmp_path), 4, 0.2)
    # per user: round(0.2 * n) to test, at least one sample kept in train
    assert len(a.y_train) == 8 + 1 + 3 and len(a.y_test) == 2 + 0 + 1
    assert a.groups.tolist() == [0] * 8 + [1] + [2] * 3
    np.testing.assert_array_equal(a.y_train, b.y_train)
    assert a.y_train.tolist() != c.y_train.tolist()
