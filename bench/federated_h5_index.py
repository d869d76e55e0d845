"""Start-up of ``data.name=federated_h5`` at StackOverflow's client count (docs/datasets.md): index and check
every client once (fedrun/data/federated_h5_index.py).

    python bench/federated_h5_index.py [--clients 342477] [--examples 2] [--libver earliest|latest] [--dir DIR]
                                       [--no-walk]

Builds a train file in TensorFlow Federated's layout with ``--clients`` tiny clients (``examples/<id>/tokens`` [n,
4] int32 and ``label`` [n] int32, n = ``--examples``), written by h5py with ``--libver`` (``earliest``, h5py's
default and TFF's files: symbol-table groups, version 1 headers, about 1.7 kB per client; ``latest``: compact and
dense link storage, version 2 headers, 0.7 kB per client), and copies it as the test file, under the system's
temporary directory (removed at the end) or in ``--dir`` (kept, and reused by the next run; 342,477 clients take
about 10 minutes to build here). Then it times fedrun's start-up on them (``FederatedH5``: opening both files,
indexing and checking every client, reading every label and the pooled test set) twice: cold (the files indexed,
the index cached) and warm (the index from the cache), in wall and CPU seconds, beside, in the same run:

* per file, the two parts of a cold start that grow with the clients: listing them (``client_ids``) and indexing
  them from their headers (``index_clients``), with the number of clients that went through HDF5 instead;
* HDF5's floor: opening the two datasets of every client of both files with h5py's low-level calls and
  nothing else (no shape, type or label read), what any index through HDF5 pays at least;
* the old start-up's walk with h5py's high-level API (``len(group[name])`` per dataset; ``--no-walk`` skips it).

The target: a start under 30 s at 342,477 clients. The CPU is shared: the load average is printed.
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


def build(path: Path, clients: int, examples: int, libver: str) -> None:
    rng = np.random.default_rng(0)
    with h5py.File(path, "w", libver=libver) as f:
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


def hdf5_opens(path: Path) -> float:
    """Seconds to open every client's two datasets, by path, with h5py's low-level calls: nothing else."""
    with h5py.File(path, "r") as f:
        examples = f["examples"].id
        ids = sorted(f["examples"].keys())
        t = time.perf_counter()
        for cid in ids:
            h5py.h5d.open(examples, f"{cid}/tokens".encode())
            h5py.h5d.open(examples, f"{cid}/label".encode())
        return time.perf_counter() - t


def load() -> str:
    """The 1-minute load average (the CPU is shared)."""
    return f"{os.getloadavg()[0]:.1f}"


def timed(fn, *args) -> tuple[object, float, float]:
    """``fn(*args)``, its wall and its CPU seconds."""
    t, c = time.perf_counter(), time.process_time()
    out = fn(*args)
    return out, time.perf_counter() - t, time.process_time() - c


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=342_477)
    parser.add_argument("--examples", type=int, default=2)
    parser.add_argument("--libver", choices=("earliest", "latest"), default="earliest",
                        help="h5py's libver of the files (TensorFlow Federated's are earliest: h5py's default)")
    parser.add_argument("--dir", type=Path, help="build the files here if they are not, and keep them")
    parser.add_argument("--no-walk", action="store_true", help="skip the old high-level walk (minutes)")
    args = parser.parse_args()
    from fedrun.config import DataConfig, FederatedH5Config
    from fedrun.data.federated_h5 import FederatedH5
    from fedrun.data.federated_h5_index import Members, client_ids, index_clients

    root = args.dir or Path(tempfile.mkdtemp(prefix="fedrun_h5_bench_"))
    name = f"{args.clients}x{args.examples}{'_latest' if args.libver == 'latest' else ''}.h5"
    train, test = root / f"train_{name}", root / f"test_{name}"
    try:
        t = time.perf_counter()
        if not test.exists():
            root.mkdir(parents=True, exist_ok=True)
            build(root / ".building.h5", args.clients, args.examples, args.libver)
            shutil.copyfile(root / ".building.h5", test)  # another inode: indexed and cached on its own
            os.replace(root / ".building.h5", train)
        built = f"built in {time.perf_counter() - t:.1f} s" if args.dir is None or time.perf_counter() - t > 1 \
            else f"reused from {root}"
        size = train.stat().st_size + test.stat().st_size
        cfg = DataConfig(name="federated_h5", num_clients=args.clients,
                         federated_h5=FederatedH5Config(train=str(train), test=str(test), feature="tokens"))
        cache = Path(tempfile.mkdtemp(prefix="fedrun_h5_bench_cache_"))
        os.environ["XDG_CACHE_HOME"] = str(cache)
        print(f"{args.clients} clients x {args.examples} examples: files {size / 2**20:.1f} MiB ({built}); "
              f"{os.cpu_count()} CPUs, load averages (1 min) after each line", flush=True)
        runs = []
        for what in ("cold (index + check + labels + pooled test set, both files)",
                     "warm (the index from the cache, the pooled test set read)"):
            source, wall, cpu = timed(FederatedH5, cfg, 0)
            runs.append((wall, cpu))
            assert int(source.num_examples.sum()) == args.clients * args.examples
            source.close()
            target = f"; target < 30 s: {'met' if wall < 30 else 'MISSED'}" if not runs[1:] else ""
            print(f"fedrun start-up, {what}: {wall:.2f} s (CPU {cpu:.2f} s{target}); load {load()}", flush=True)
        shutil.rmtree(cache, ignore_errors=True)
        (cold, cold_cpu), (warm, _) = runs
        for path in (train, test):
            with h5py.File(path, "r") as f:
                (ids, links), wall, cpu = timed(client_ids, f)
                members = Members("tokens", "label")
                index, index_wall, index_cpu = timed(index_clients, f, str(path), ids, members, None, links)
                links.close()
            print(f"  {path.name}: clients enumerated in {wall:.2f} s (CPU {cpu:.2f} s), indexed from their headers in "
                  f"{index_wall:.2f} s (CPU {index_cpu:.2f} s, {1e6 * index_cpu / len(ids):.1f} us per client; "
                  f"{index.through_hdf5} through HDF5); load {load()}", flush=True)
        _, floor, floor_cpu = timed(lambda: hdf5_opens(train) + hdf5_opens(test))
        print(f"HDF5's floor, the 2 dataset opens per client and file alone: {floor:.1f} s (CPU {floor_cpu:.1f} s); "
              f"cold / floor = {cold / floor:.2f} (CPU {cold_cpu / floor_cpu:.2f}); load {load()}", flush=True)
        if not args.no_walk:
            _, walk, _ = timed(high_level_walk, train)
            print(f"high-level h5py walk of the same datasets (both files): {2 * walk:.1f} s; "
                  f"ratios walk / cold = {2 * walk / cold:.2f}, walk / warm = {2 * walk / warm:.0f}; load {load()}")
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
