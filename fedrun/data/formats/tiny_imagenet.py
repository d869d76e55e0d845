"""Tiny-ImageNet: the ``tiny-imagenet-200`` folder of JPEG images, its labelled validation split as the test
split."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedrun.errors import DataError

_JPEG_SUFFIXES = {".jpeg", ".jpg"}


def _read_rgb(path: Path, size: int) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(path) as im:
            if im.size != (size, size):
                raise DataError(f"{path}: expected a {size}x{size} image, got {im.size[0]}x{im.size[1]}")
            arr = np.asarray(im.convert("RGB"))  # a few Tiny-ImageNet images are grayscale
    except DataError:
        raise
    except FileNotFoundError:
        raise DataError(f"missing file: expected {path}") from None
    except Exception as e:  # PIL: UnidentifiedImageError, OSError("image file is truncated"), ...
        raise DataError(f"{path}: unreadable image, expected a {size}x{size} JPEG ({e})") from e
    return arr.transpose(2, 0, 1)


def read_tiny_imagenet(
    directory: str | Path, image_size: int = 64
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """The ``tiny-imagenet-200`` folder -> ``(x_train, y_train, x_val, y_val, wnids)``.

    Class ``i`` is the ``i``-th line of ``wnids.txt``. Training images are
    ``train/<wnid>/images/*.JPEG``; the labelled validation split (``val/val_annotations.txt``, tab
    separated ``file  wnid  x0 y0 x1 y1``, images in ``val/images/``) serves as the test split, since
    the ``test/`` folder has no labels. Images are uint8 ``[n, 3, image_size, image_size]``.
    """
    directory = Path(directory)
    wnids_path = directory / "wnids.txt"
    try:
        wnids = [w.strip() for w in wnids_path.read_text().splitlines() if w.strip()]
    except FileNotFoundError:
        raise DataError(f"missing file: expected {wnids_path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{wnids_path}: unreadable, expected one WordNet id per line ({e})") from e
    if not wnids:
        raise DataError(f"{wnids_path}: empty, expected one WordNet id per line")
    if len(set(wnids)) != len(wnids):
        raise DataError(f"{wnids_path}: duplicate WordNet ids, expected each class once")
    index = {w: i for i, w in enumerate(wnids)}

    train_files: list[tuple[Path, int]] = []
    for w, i in index.items():
        folder = directory / "train" / w / "images"
        if not folder.is_dir():
            raise DataError(f"missing directory: expected {folder} (class {w} of {wnids_path.name})")
        files = sorted(p for p in folder.iterdir() if p.suffix.lower() in _JPEG_SUFFIXES)
        if not files:
            raise DataError(f"{folder}: no .JPEG images, expected the training images of class {w}")
        train_files += [(p, i) for p in files]

    ann = directory / "val" / "val_annotations.txt"
    val_files: list[tuple[Path, int]] = []
    try:
        lines = ann.read_text().splitlines()
    except FileNotFoundError:
        raise DataError(f"missing file: expected {ann}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{ann}: unreadable, expected lines 'file wnid x0 y0 x1 y1' ({e})") from e
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        fields = line.split("\t") if "\t" in line else line.split()
        if len(fields) < 2:
            raise DataError(f"{ann}:{lineno}: expected 'file<TAB>wnid<TAB>x0<TAB>y0<TAB>x1<TAB>y1'")
        if fields[1] not in index:
            raise DataError(f"{ann}:{lineno}: WordNet id {fields[1]!r} is not in {wnids_path.name}")
        val_files.append((directory / "val" / "images" / fields[0], index[fields[1]]))

    def load(files: list[tuple[Path, int]]) -> tuple[np.ndarray, np.ndarray]:
        x = np.empty((len(files), 3, image_size, image_size), dtype=np.uint8)
        for k, (p, _) in enumerate(files):
            x[k] = _read_rgb(p, image_size)
        return x, np.array([i for _, i in files], dtype=np.int64)

    x_train, y_train = load(train_files)
    x_val, y_val = load(val_files)
    return x_train, y_train, x_val, y_val, wnids
