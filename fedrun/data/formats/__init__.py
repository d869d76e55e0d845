"""Readers for the standard on-disk dataset formats, one module a format.

Every reader returns plain numpy arrays (images as uint8 ``[n, C, H, W]`` or float32 already in
[0, 1], labels as int64) and raises :class:`~fedrun.errors.DataError` with a one-line message
naming the file and what was expected. Scaling, normalization and the choice of directories under
``data.root`` are left to :mod:`fedrun.data.sources`.

Formats: MNIST / Fashion-MNIST IDX (optionally gzipped, :mod:`fedrun.data.formats.idx`), SVHN cropped
digits ``.mat`` (:mod:`fedrun.data.formats.svhn`), CIFAR-10 / CIFAR-100 "python version" batches
(:mod:`fedrun.data.formats.cifar`: pickles, read with the restricted unpickler of
:mod:`fedrun.data.formats.safe_pickle`), the Tiny-ImageNet folder layout
(:mod:`fedrun.data.formats.tiny_imagenet`), and LEAF JSON (FEMNIST, Shakespeare; :mod:`fedrun.data.formats.leaf`).
"""

from __future__ import annotations

from fedrun.data.formats.cifar import read_cifar10, read_cifar100, read_cifar_batch
from fedrun.data.formats.idx import idx_path, read_idx, read_mnist_idx
from fedrun.data.formats.leaf import (
    SHAKESPEARE_CHARS,
    SHAKESPEARE_SEQ_LEN,
    SHAKESPEARE_UNK,
    SHAKESPEARE_VOCAB_SIZE,
    LeafUser,
    encode_chars,
    femnist_arrays,
    read_leaf_dir,
    shakespeare_arrays,
)
from fedrun.data.formats.safe_pickle import safe_unpickle
from fedrun.data.formats.svhn import read_svhn_mat
from fedrun.data.formats.tiny_imagenet import read_tiny_imagenet

__all__ = ["SHAKESPEARE_CHARS", "SHAKESPEARE_SEQ_LEN", "SHAKESPEARE_UNK", "SHAKESPEARE_VOCAB_SIZE", "LeafUser",
           "encode_chars", "femnist_arrays", "idx_path", "read_cifar10", "read_cifar100", "read_cifar_batch",
           "read_idx", "read_leaf_dir", "read_mnist_idx", "read_svhn_mat", "read_tiny_imagenet",
           "safe_unpickle", "shakespeare_arrays"]
