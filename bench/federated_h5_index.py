"""Start-up of ``data.name=federated_h5`` at StackOverflow's client count (docs/datasets.md): index and check
every client once (fedrun/data/federated_h5_index.py).

    python bench/federated_h5_index.py [--clients 342477] [--examples 2]

Builds a train and a test file in TensorFlow Federated's layout with ``--clients`` tiny clients
(``examples/<id>/tokens`` [n, 4] int32 and ``label`` [n] int32, n = ``--examples``; a few MB however many
clients) under the system's temporary directory, then times fedrun's start-up on them (``FederatedH5``:
opening both files, indexing and checking every client, reading every label and the pooled test set) twice:
cold (the files indexed, the index cached) and warm (the index from the cache), beside h5py's own walk of the
same datasets with the high-level API (``len(group[name])`` per dataset, what start-up did before). The
target: a start under 30 s at 342,477 clients. The files and the cache are removed at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def build(path: Path, clients: int, examples: int) -> None:
    rng = np.random.default_rng(0)
    with h5py.File(path, "w", libver="latest") as f:
        group = f.create_group("examples")
        for i in range(clients):
            g = group.create_group(f"{i:08d}")
            g.create_dataset("tokens", data=rng.integers(0, 100, (examples, 4), dtype=np.int32))
            g.create_dataset("label", data=rng.integers(0, 10, examples, dtype=np.int32))


def high_level_walk(path: Path) -> int:
    """The old start-up's metadata walk: every client's two datasets through h5py's high-level objects."""
    total = 0
    with h5py.File(path, "r") as f:
        examples = f["examples"]
        for cid in sorted(examples.keys()):
            group = examples[cid]
            total += len(group["tokens"]) + len(group["label"][()])
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=342_477)
    parser.add_argument("--examples", type=int, default=2)
    args = parser.parse_args()
    from fedrun.config import DataConfig, FederatedH5Config
    from fedrun.data.federated_h5 import FederatedH5

    root = Path(tempfile.mkdtemp(prefix="fedrun_h5_bench_"))
    try:
        t = time.perf_counter()
        for split in ("train", "test"):
            build(root / f"{split}.h5", args.clients, args.examples)
        built = time.perf_counter() - t
        size = sum(p.stat().st_size for p in root.iterdir())
        cfg = DataConfig(name="federated_h5", num_clients=args.clients,
                         federated_h5=FederatedH5Config(train=str(root / "train.h5"), test=str(root / "test.h5"),
                                                        feature="tokens"))
        os.environ["XDG_CACHE_HOME"] = str(root / "cache")
        times = []
        for _ in ("cold", "warm"):
            t = time.perf_counter()
            source = FederatedH5(cfg, seed=0)
            times.append(time.perf_counter() - t)
            assert int(source.num_examples.sum()) == args.clients * args.examples
            source.close()
        cold, warm = times
        t = time.perf_counter()
        high_level_walk(root / "train.h5")
        walk_s = 2 * (time.perf_counter() - t)  # both files
        print(f"{args.clients} clients x {args.examples} examples: files {size / 2**20:.1f} MiB built in {built:.1f} s")
        print(f"fedrun start-up, cold (index + check + labels + pooled test set, both files): {cold:.1f} s")
        print(f"fedrun start-up, warm (the index from the cache, the pooled test set read): {warm:.2f} s "
              f"(target < 30 s: {'met' if warm < 30 else 'MISSED'})")
        print(f"high-level h5py walk of the same datasets (both files): {walk_s:.1f} s; "
              f"ratios walk / cold = {walk_s / cold:.2f}, walk / warm = {walk_s / warm:.0f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
