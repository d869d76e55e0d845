"""Fingerprints of state: a short digest of each entry's exact bits, logged every round (metrics.jsonl's
``fingerprint``), so that two runs can be compared round by round without storing their models
(``fedrun compare``, fedrun/compare.py)."""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor

DIGEST_BYTES = 8  # a 64-bit BLAKE2b digest: two different states share one with probability 2^-64


def digest(value: Tensor) -> str:
    """BLAKE2b of ``value``'s dtype, shape and bytes (bit for bit: -0.0 and 0.0 differ, NaNs by payload)."""
    host = value.detach().cpu().contiguous()
    h = hashlib.blake2b(f"{host.dtype}{list(host.shape)}".encode(), digest_size=DIGEST_BYTES)
    h.update(host.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def fingerprint(state: dict[str, Tensor], prefix: str = "") -> dict[str, str]:
    """``{prefix + name: digest}`` for every entry of ``state``, in name order."""
    return {prefix + name: digest(state[name]) for name in sorted(state)}
