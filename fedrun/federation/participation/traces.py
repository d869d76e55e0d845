"""Per-client participation files: a trace ``[rounds, clients]`` of booleans, per-client probability vectors,
Markov transition rows (.npy or .csv). Every problem is a :class:`ConfigError` naming the field and file."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from fedrun.errors import ConfigError, require_file


def read_array(path: str, field: str) -> np.ndarray:
    """A numeric or boolean array from .npy or .csv; ConfigError naming the field and file otherwise."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in (".npy", ".csv"):
        raise ConfigError(f"{field}: {path}: expected a .npy or .csv file")
    try:
        require_file(p, f"a {suffix} file", ConfigError)
    except ConfigError as exc:
        raise ConfigError(f"{field}: {exc}") from None
    try:
        if suffix == ".npy":
            return np.load(p, allow_pickle=False)
        with open(p, newline="") as fh:
            rows = [[cell.strip() for cell in row] for row in csv.reader(fh)
                    if row and not row[0].lstrip().startswith("#")]
    except (OSError, ValueError, EOFError) as exc:
        first = (str(exc).splitlines() or [""])[0]
        raise ConfigError(f"{field}: cannot read {path} ({type(exc).__name__}: {first})") from None
    widths = {len(r) for r in rows}
    if len(widths) > 1:
        raise ConfigError(f"{field}: {path}: rows have different numbers of columns ({sorted(widths)})")
    words = {"true": 1.0, "false": 0.0}
    out = np.empty((len(rows), widths.pop() if widths else 0))
    for r, row in enumerate(rows):
        for c, cell in enumerate(row):
            try:
                out[r, c] = words[cell.lower()] if cell.lower() in words else float(cell)
            except ValueError:
                raise ConfigError(f"{field}: {path}: row {r + 1}, column {c + 1}: not a number or "
                                  f"boolean: {cell!r}") from None
    return out


def load_trace(path: str, num_clients: int, rounds: int, field: str = "participation.trace") -> np.ndarray:
    """Load and check a participation trace: bool [T, N] with T >= rounds."""
    raw = read_array(path, field)
    if raw.dtype != bool:
        if raw.dtype.kind not in "iuf" or not np.all((raw == 0) | (raw == 1)):
            raise ConfigError(f"{field}: {path}: expected boolean values (0/1, true/false), "
                              f"got dtype {raw.dtype} with values other than 0 and 1")
    if raw.ndim != 2:
        raise ConfigError(f"{field}: {path}: expected a [rounds, clients] array, got shape {raw.shape}")
    if raw.shape[1] != num_clients:
        raise ConfigError(f"{field}: {path}: has {raw.shape[1]} clients (columns), "
                          f"expected data.num_clients = {num_clients}")
    if raw.shape[0] < rounds:
        raise ConfigError(f"{field}: {path}: has {raw.shape[0]} rounds (rows), the run needs {rounds}")
    return raw.astype(bool)


def load_client_vector(path: str, num_clients: int, field: str, low: float = 0.0,
                       high: float = 1.0) -> np.ndarray:
    """A per-client float vector [N] (.npy, or .csv with one value per row or one row) within [low, high]."""
    raw = np.asarray(read_array(path, field), dtype=np.float64).reshape(-1)
    if raw.shape != (num_clients,):
        raise ConfigError(f"{field}: {path}: has {raw.size} values, expected one per client "
                          f"({num_clients})")
    if not np.all((raw > low) & (raw <= high)):
        raise ConfigError(f"{field}: {path}: expected values in ({low}, {high}], "
                          f"got min {raw.min():g}, max {raw.max():g}")
    return raw
