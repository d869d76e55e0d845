"""Data checked at the door: what every loader hands the run must be usable as it stands.

A bad array found later costs more than a clear line now: NaN in the training inputs surfaces as a
"divergence" (exit status 3) that no learning rate cures, NaN in the test inputs as a null test loss, a
label of 1e9 as a model 1e9 classes wide, a float label as a silently truncated class. So every
:class:`~fedrun.data.dataset.TaskData` that enters a run (built-in loaders, ``data.name=arrays``, plugin
loaders) passes :func:`check_task`:

* ``x_train``, ``x_test``: real numbers (floats, or integer token ids), finite, one row per example,
  the same shape per example in both; the test set is not empty;
* classification: ``y_*`` integer class labels in [0, num_classes), ``1 <= num_classes <= MAX_CLASSES``;
  regression: ``y_*`` finite numbers;
* ``groups``: one integer per training example.

:func:`integer_array` converts labels and groups read from a user's file, refusing values that are not
whole numbers (instead of truncating 1.7 to 1). Each failure is one :class:`DataError` naming the file
(or the loader), the array and the first offending index. The finiteness scan goes through the arrays in
pieces of :data:`CHUNK` values, so that a memory-mapped array is read once and never copied whole.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fedrun.data.dataset import TaskData
from fedrun.errors import DataError, brief

MAX_CLASSES = 100_000  # classes of a classification task: the model's last layer is this wide
CHUNK = 1 << 22  # values per piece of the finiteness scan (16 MiB of float32)
ARRAYS = ("x_train", "y_train", "x_test", "y_test", "groups")


def check_task(task: TaskData, source: str | Mapping[str, str]) -> None:
    """Raise :class:`DataError` at the first problem of ``task`` (module docstring). ``source`` names where
    the arrays came from: one string (``data.name=pkg.mod:load``, a .npz path) or one per array name
    (a directory of .npy files)."""
    def where(name: str) -> str:
        origin = source.get(name, "?") if isinstance(source, Mapping) else source
        return f"{origin}: array {name}"

    arrays = {name: getattr(task, name) for name in ARRAYS}
    for name, array in arrays.items():
        if array is not None and not isinstance(array, np.ndarray):
            raise DataError(f"{where(name)}: expected a numpy array, got {type(array).__name__}")
    n, m = _rows(task.x_train, where("x_train")), _rows(task.x_test, where("x_test"))
    if n == 0:
        raise DataError(f"{where('x_train')}: no training examples; expected at least one row")
    if m == 0:
        raise DataError(f"{where('x_test')}: no test examples; expected at least one row (the test set "
                        "measures the model)")
    if task.x_test.shape[1:] != task.x_train.shape[1:]:
        raise DataError(f"{where('x_test')}: examples of shape {list(task.x_test.shape[1:])}, but x_train's "
                        f"are {list(task.x_train.shape[1:])}; expected the same shape")
    for name in ("x_train", "x_test"):
        _check_real(arrays[name], where(name))
    for name, x_name in (("y_train", "x_train"), ("y_test", "x_test"), ("groups", "x_train")):
        array, rows = arrays[name], len(arrays[x_name])
        if array is not None and (array.ndim != 1 or len(array) != rows):
            raise DataError(f"{where(name)}: shape {list(array.shape)}; expected one value per example of "
                            f"{x_name}, shape [{rows}]")
    if task.groups is not None and task.groups.dtype.kind not in "iu":
        raise DataError(f"{where('groups')}: dtype {task.groups.dtype}; expected integer client ids")
    if task.task == "classification":
        classes = task.num_classes
        if not isinstance(classes, (int, np.integer)) or not 1 <= classes <= MAX_CLASSES:
            name, index = _largest_label(arrays["y_train"], arrays["y_test"])
            raise DataError(f"{where(name)}: {_at(index)}num_classes {brief(classes)} (the largest label + 1); "
                            f"expected an integer in [1, {MAX_CLASSES}]")
        for name in ("y_train", "y_test"):
            _check_labels(arrays[name], int(classes), where(name))
    else:
        for name in ("y_train", "y_test"):
            _check_real(arrays[name], where(name))


def integer_array(array: np.ndarray, where: str) -> np.ndarray:
    """``array`` as int64, refusing (DataError at the first offending index) anything but whole numbers:
    text, complex numbers, NaN/Inf, 1.5, values beyond int64."""
    if array.dtype.kind in "iu":
        if array.dtype == np.uint64 and array.size and int(array.max()) > np.iinfo(np.int64).max:
            raise DataError(f"{where}: index {_first(array > np.iinfo(np.int64).max)}: value beyond int64")
        return np.asarray(array, dtype=np.int64)
    if array.dtype.kind == "b":
        return np.asarray(array, dtype=np.int64)
    if array.dtype.kind != "f":
        raise DataError(f"{where}: dtype {array.dtype}; expected integers (class labels or client ids)")
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(array) | (array != np.round(array)) | (np.abs(array) >= 2.0**63)
    if bad.any():
        index = _first(bad)
        raise DataError(f"{where}: index {index}: value {brief(array[index].item())}; expected whole numbers "
                        "(it would be truncated)")
    return np.asarray(array, dtype=np.int64)


def _rows(array: np.ndarray, where: str) -> int:
    if array.ndim < 1:
        raise DataError(f"{where}: a scalar; expected one row per example")
    return len(array)


def _check_real(array: np.ndarray, where: str) -> None:
    """Real numbers (float, integer or bool), all finite; else DataError at the first offending index."""
    if array.dtype.kind not in "fiub":
        raise DataError(f"{where}: dtype {array.dtype}; expected real numbers (floats or integers)")
    if array.dtype.kind != "f":
        return
    flat = array.reshape(-1) if array.flags.c_contiguous else np.ravel(array)
    for start in range(0, flat.size, CHUNK):
        finite = np.isfinite(flat[start:start + CHUNK])
        if not finite.all():
            offset = start + int(np.argmin(finite))
            index = tuple(int(i) for i in np.unravel_index(offset, array.shape))
            raise DataError(f"{where}: element {list(index)} is {flat[offset]}; expected finite numbers")


def _check_labels(array: np.ndarray, classes: int, where: str) -> None:
    if array.dtype.kind not in "iu":
        raise DataError(f"{where}: dtype {array.dtype}; expected integer class labels")
    bad = (array < 0) | (array >= classes)
    if bad.any():
        index = _first(bad)
        raise DataError(f"{where}: index {index}: label {int(array[index])}; expected class labels in "
                        f"[0, {classes})")


def _largest_label(y_train: np.ndarray, y_test: np.ndarray) -> tuple[str, int | None]:
    """The array holding the largest integer label and its index (the one that sets num_classes)."""
    best = ("y_train", None, None)
    for name, y in (("y_train", y_train), ("y_test", y_test)):
        if y.dtype.kind in "iu" and y.size:
            index = int(np.argmax(y.reshape(-1)))
            if best[2] is None or y.reshape(-1)[index] > best[2]:
                best = (name, index, y.reshape(-1)[index])
    return best[0], best[1]


def _at(index: int | None) -> str:
    return "" if index is None else f"index {index}: "


def _first(mask: np.ndarray) -> int:
    return int(np.argmax(mask.reshape(-1)))
