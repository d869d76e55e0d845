"""Both sides of tests/test_hdf5_fuzz.py's differential cases, in a process of its own (HDF5 may crash on a
damaged file: the test then knows which case and which side).

usage: python tests/hdf5_fuzz_worker.py CASES.json FIRST

CASES.json: a list of ``{"train": path, "test": path, "clients": n, "cache": dir}``. From case FIRST on, each case
prints (one JSON line each, flushed) ``{"case": i, "begin": side}`` before a side starts and ``{"case": i, side:
result}`` after it; sides: ``fedrun`` (``FederatedH5`` started on the pair, then every client loaded, train and
test) and ``h5py`` (every client of both files read with h5py's high-level calls, as a user would).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import h5py
import numpy as np

from fedrun.config import DataConfig, FederatedH5Config
from fedrun.data.federated_h5 import FederatedH5
from fedrun.errors import DataError


def digest(a: np.ndarray) -> str:
    return f"{list(a.shape)}:{hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]}"


def fedrun_side(case: dict) -> dict:
    """What fedrun makes of the pair: refused (the line, at start-up or when a client is loaded), or the ids,
    counts, example shape, classes and each client's arrays as loaded."""
    os.environ["XDG_CACHE_HOME"] = case["cache"]
    cfg = DataConfig(name="federated_h5", num_clients=case["clients"],
                     federated_h5=FederatedH5Config(train=case["train"], test=case["test"]))
    try:
        source = FederatedH5(cfg, 0)
    except DataError as exc:
        return {"refused": str(exc), "when": "start"}
    except Exception as exc:  # noqa: BLE001 - what escapes is the finding
        return {"escaped": f"{type(exc).__name__}: {exc}"}
    try:
        everyone = np.arange(len(source.ids))
        train = [source.load(everyone[i:i + 1]) for i in everyone]
        test = [source.load_test(everyone[i:i + 1]) for i in everyone]
        return {"ids": source.ids, "counts": source.num_examples.tolist(), "test_counts": source.test_examples.tolist(),
                "shape": list(source.shape), "classes": int(source.task.num_classes),
                "train": [[digest(x.reshape(len(x), -1)), digest(y)] for x, y in train],
                "test": [[digest(x.reshape(len(x), -1)), digest(y)] for x, y in test]}
    except DataError as exc:
        return {"refused": str(exc), "when": "load"}
    except Exception as exc:  # noqa: BLE001
        return {"escaped": f"{type(exc).__name__}: {exc}"}
    finally:
        source.close()


def h5py_side(case: dict) -> dict:
    """Every client of both files as h5py reads them (inputs as float32, labels as int64), or h5py's error."""
    out = {}
    try:
        for split in ("train", "test"):
            with h5py.File(case[split], "r") as f:
                clients = {}
                for cid in sorted(f["examples"].keys()):
                    x = np.asarray(f["examples"][cid]["pixels"][()], dtype=np.float32)
                    y = np.asarray(f["examples"][cid]["label"][()], dtype=np.int64).reshape(-1)
                    clients[cid] = [digest(x.reshape(len(x), -1)), digest(y), len(y), list(x.shape[1:]),
                                    int(y.max(initial=-1))]
                out[split] = clients
    except Exception as exc:  # noqa: BLE001 - h5py's refusal
        return {"error": f"{type(exc).__name__}: {exc}"}
    return out


def main() -> None:
    cases = json.loads(open(sys.argv[1]).read())
    for i in range(int(sys.argv[2]), len(cases)):
        for side, run in (("fedrun", fedrun_side), ("h5py", h5py_side)):
            print(json.dumps({"case": i, "begin": side}), flush=True)
            print(json.dumps({"case": i, side: run(cases[i])}), flush=True)


if __name__ == "__main__":
    main()
