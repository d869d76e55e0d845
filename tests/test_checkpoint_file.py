"""The checkpoint file layer: real HDF5 files, read back by h5py, broken in the ways disks break them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest

from fedrun.checkpoint import (
    FORMAT_VERSION,
    CheckpointReader,
    CheckpointWriter,
    describe_checkpoint,
    find_latest_valid,
    list_checkpoints,
    remove_checkpoints_after,
)
from fedrun.errors import CheckpointError

REPO = Path(__file__).resolve().parents[1]
N, D = 12, 9


def write_ckpt(run_dir: Path, round: int, *, keep: int | None = 3, seed: int = 0, n: int = N, d: int = D):
    """A small, complete checkpoint; returns (path, the client matrix written)."""
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((n, d)).astype(np.float32)
    with CheckpointWriter(run_dir, round, algorithm="scaffold", num_clients=n, dim=d, keep=keep) as w:
        w.write("server/x", rng.standard_normal(d).astype(np.float32))
        w.create_rows("clients/c", n, (d,), np.float32, rows_per_chunk=4)
        for start in range(0, n, 5):
            w.write_rows("clients/c", start, c[start : start + 5])
    return w.path, c


def flip_byte(path: Path, dataset: str, index: int = 3) -> None:
    """Flip one byte of a dataset's stored data (not its metadata)."""
    with h5py.File(path, "r") as f:
        ds = f[dataset]
        offset = ds.id.get_chunk_info(0).byte_offset if ds.chunks else ds.id.get_offset()
    with open(path, "r+b") as fh:
        fh.seek(offset + index)
        b = fh.read(1)
        fh.seek(offset + index)
        fh.write(bytes([b[0] ^ 0xFF]))


def rounds(run_dir: Path) -> list[int]:
    return [int(p.name[5:13]) for p in list_checkpoints(run_dir)]


def assert_one_line(err: Exception, *needles: str) -> None:
    text = str(err)
    assert "\n" not in text
    for needle in needles:
        assert needle in text, (needle, text)


# ------------------------------------------------------------------------------------------ layout


def test_round_trip_of_every_kind_of_entry(tmp_path):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    x = rng.standard_normal(D).astype(np.float32)
    c = rng.standard_normal((N, D)).astype(np.float32)
    weights = rng.random(N)
    mask = rng.random((5, N)) < 0.3
    counters = np.arange(N, dtype=np.uint64) * 7
    loss = rng.random(5)
    config = "algorithm: scaffold\nlr: 0.1  # ünïcode\n"
    metrics = '{"round": 0, "loss": 2.3}\n{"round": 1, "loss": 1.9}\n'
    with CheckpointWriter(tmp_path, 5, algorithm="scaffold", num_clients=N, dim=D, config=config) as w:
        w.write("server/x", torch.from_numpy(x))  # a tensor is accepted as is
        w.write("server/c", np.zeros(D, np.float64))
        w.write("server/lr", 0.25)
        w.write("server/step", 17)
        w.write("server/warm", True)
        w.create_rows("clients/c", N, (D,), np.float32)
        w.write_rows("clients/c", 0, c)
        w.create_rows("clients/weight", N, (), np.float64)
        w.write_rows("clients/weight", 0, weights[:7])
        w.write_rows("clients/weight", 7, weights[7:])
        w.write("clients/last_seen", np.full(N, -1, np.int32))
        w.write("participation/mask", mask)
        w.write("random/counters", counters)
        w.write("random/name", b"philox")
        w.write("history/loss/train", loss)
        w.write("metrics/jsonl", metrics)
    path = tmp_path / "ckpt_00000005.h5"
    assert w.path == path and list_checkpoints(tmp_path) == [path]

    with CheckpointReader(path) as r:
        assert r.meta["round"] == 5 and r.meta["algorithm"] == "scaffold"
        assert r.meta["num_clients"] == N and r.meta["dim"] == D
        assert r.meta["format_version"] == FORMAT_VERSION and r.meta["config"] == config
        assert r.meta["created"].endswith("+00:00")
        r.verify()
        assert r.read("server/x").dtype == np.float32 and np.array_equal(r.read("server/x"), x)
        assert r.read("server/lr") == 0.25 and r.read("server/step") == 17 and bool(r.read("server/warm"))
        assert np.array_equal(r.read("clients/c"), c)
        assert np.array_equal(r.read("clients/weight"), weights)
        assert np.array_equal(r.read("clients/last_seen"), np.full(N, -1))
        assert (
            np.array_equal(r.read("participation/mask"), mask) and r.read("participation/mask").dtype == bool
        )
        assert np.array_equal(r.read("random/counters"), counters)
        assert r.read("random/name") == b"philox"
        assert np.array_equal(r.read("history/loss/train"), loss)
        assert r.read("metrics/jsonl") == metrics
        assert r.names() == ["clients", "history", "meta", "metrics", "participation", "random", "server"]
        assert r.names("server") == ["c", "lr", "step", "warm", "x"]
        assert r.names("history/loss") == ["train"]
        assert r.shape("clients/c") == (N, D) and r.dtype("clients/c") == np.float32

    # Plain h5py sees the documented layout and checksums.
    with h5py.File(path, "r") as f:
        assert f["clients/c"].chunks[1] == D
        assert zlib.crc32(f["clients/c"][()].tobytes()) == f["clients/c"].attrs["crc32"]
        assert zlib.crc32(f["meta/config"].asstr()[()].encode()) == f["meta/config"].attrs["crc32"]
        assert int(f["meta/round"][()]) == 5 and int(f["meta/format_version"][()]) == FORMAT_VERSION


def test_streamed_rows_equal_the_full_array_and_reblock_on_read(tmp_path):
    rng = np.random.default_rng(2)
    n, d = 50, 33
    full = rng.standard_normal((n, d)).astype(np.float32)
    (tmp_path / "a").mkdir()
    with CheckpointWriter(tmp_path / "a", 1, algorithm="fedavg", num_clients=n, dim=d) as w:
        w.create_rows("clients/h", n, d, np.float32, rows_per_chunk=8)
        start = 0
        for size in (1, 5, 13, 8, 3, 20):  # arbitrary call sizes, crossing chunk boundaries
            w.write_rows("clients/h", start, full[start : start + size])
            start += size
        w.create_rows("clients/g", n, d, np.float32, rows_per_chunk=8)
        w.write_rows("clients/g", 0, full.astype(np.float64))  # same_kind casts are allowed
        w.write("history/full", full)
    with CheckpointReader(w.path) as r, h5py.File(w.path, "r") as f:
        assert f["clients/h"].chunks == (8, d)
        assert np.array_equal(f["clients/h"][()], full) and np.array_equal(f["clients/g"][()], full)
        assert (
            f["clients/h"].attrs["crc32"] == f["history/full"].attrs["crc32"] == f["clients/g"].attrs["crc32"]
        )
        assert len(f["clients/h"].attrs["crc32_blocks"]) == 7
        # a resume on 3 ranks (blocks 17/17/16) and on 7 ranks, not aligned with the 8-row chunks
        for ranks in (3, 7):
            bounds = np.linspace(0, n, ranks + 1).astype(int)
            parts = [r.read_rows("clients/h", a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
            assert np.array_equal(np.concatenate(parts), full)
        assert r.read_rows("clients/h", 9, 9).shape == (0, d)
        assert np.array_equal(r.read_rows("history/full", 3, 6), full[3:6])
        with pytest.raises(CheckpointError, match="out of range"):
            r.read_rows("clients/h", 40, 51)


def test_rows_must_come_in_order_fit_and_be_complete(tmp_path):
    prev, _ = write_ckpt(tmp_path, 1)
    w = CheckpointWriter(tmp_path, 2, algorithm="fedavg", num_clients=N, dim=D)
    w.create_rows("clients/c", N, D)
    w.write_rows("clients/c", 0, np.zeros((4, D)))
    with pytest.raises(CheckpointError, match="expected start 4, got 5"):
        w.write_rows("clients/c", 5, np.zeros((1, D)))
    with pytest.raises(CheckpointError, match="do not fit"):
        w.write_rows("clients/c", 4, np.zeros((1, D + 1)))
    with pytest.raises(CheckpointError, match="cannot store complex64 rows in a float32 dataset"):
        w.write_rows("clients/c", 4, np.zeros((1, D), np.complex64))
    with pytest.raises(CheckpointError, match="need 12 rows"):
        w.create_rows("clients/bad", N - 1, D)
    with pytest.raises(CheckpointError, match="written by the checkpoint writer"):
        w.write("meta/round", 3)
    with pytest.raises(CheckpointError, match="no pickling"):
        w.write("history/objects", np.array([{"a": 1}], dtype=object))
    with pytest.raises(CheckpointError, match="already in checkpoint"):
        w.write("clients/c", np.zeros((N, D)))
    with pytest.raises(CheckpointError, match=r"clients/c has 4 of 12 rows written"):
        w.commit()
    assert rounds(tmp_path) == [1] and not w.tmp_path.exists()
    assert find_latest_valid(tmp_path) == prev


# -------------------------------------------------------------------------------------- corruption


def test_truncated_file_is_detected_and_resume_falls_back(tmp_path):
    first, _ = write_ckpt(tmp_path, 1)
    second, _ = write_ckpt(tmp_path, 2)
    size = second.stat().st_size
    os.truncate(second, size // 2)
    with pytest.raises(CheckpointError) as e:
        CheckpointReader(second)
    assert_one_line(e.value, str(second), "not a readable HDF5 file")
    warnings: list[str] = []
    assert find_latest_valid(tmp_path, warn=warnings.append) == first
    assert len(warnings) == 1
    assert_one_line(CheckpointError(warnings[0]), "ckpt_00000002.h5", "not a readable HDF5 file")


def test_flipped_byte_is_detected_and_resume_falls_back(tmp_path):
    first, _ = write_ckpt(tmp_path, 1)
    second, c = write_ckpt(tmp_path, 2, seed=1)
    flip_byte(second, "clients/c", index=5)  # inside row 0, i.e. the first 4-row chunk
    with CheckpointReader(second) as r:  # metadata is fine: it opens
        with pytest.raises(CheckpointError) as e:
            r.verify()
        assert_one_line(e.value, str(second), "checksum mismatch in clients/c rows 0:4")
        with pytest.raises(CheckpointError, match="checksum mismatch in clients/c"):
            r.read("clients/c")
        with pytest.raises(CheckpointError, match="rows 0:4"):
            r.read_rows("clients/c", 2, 6)
        assert np.array_equal(r.read_rows("clients/c", 4, 12), c[4:])  # other ranks' rows are fine
        assert r.read("clients/c", verify=False).shape == (N, D)
    assert "checksums: FAILED for 1 of" in describe_checkpoint(second)
    warnings: list[str] = []
    assert find_latest_valid(tmp_path, warn=warnings.append) == first
    assert len(warnings) == 1 and "ckpt_00000002.h5" in warnings[0] and "checksum mismatch" in warnings[0]


def test_every_problem_on_open_is_one_clear_line(tmp_path):
    with pytest.raises(CheckpointError) as e:
        CheckpointReader(tmp_path / "ckpt_00000009.h5")
    assert_one_line(e.value, "ckpt_00000009.h5", "no such checkpoint file")
    junk = tmp_path / "ckpt_00000008.h5"
    junk.write_bytes(b"this is not HDF5\n" * 100)
    with pytest.raises(CheckpointError) as e:
        CheckpointReader(junk)
    assert_one_line(e.value, str(junk), "not a readable HDF5 file")
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["x"] = 1
    with pytest.raises(CheckpointError) as e:
        CheckpointReader(other)
    assert_one_line(e.value, str(other), "not a fedrun checkpoint")
    (tmp_path / "run").mkdir()
    path, _ = write_ckpt(tmp_path / "run", 1)
    with CheckpointReader(path) as r:
        with pytest.raises(CheckpointError) as e:
            r.read("clients/nope")
        assert_one_line(e.value, str(path), "no dataset 'clients/nope'")
        with pytest.raises(CheckpointError, match="it is a group"):
            r.read("clients")
        with pytest.raises(CheckpointError, match="no group"):
            r.names("server/x")


def test_wrong_format_version_is_rejected(tmp_path):
    path, _ = write_ckpt(tmp_path, 1)
    with h5py.File(path, "r+") as f:  # what a future fedrun might write
        del f["meta/format_version"]
        f["meta/format_version"] = np.int64(FORMAT_VERSION + 1)
        f["meta/format_version"].attrs["crc32"] = np.uint32(
            zlib.crc32(np.int64(FORMAT_VERSION + 1).tobytes())
        )
    with pytest.raises(CheckpointError) as e:
        CheckpointReader(path)
    assert_one_line(
        e.value, str(path), f"format version {FORMAT_VERSION + 1}", f"reads version {FORMAT_VERSION}"
    )
    warnings: list[str] = []
    assert find_latest_valid(tmp_path, warn=warnings.append) is None and len(warnings) == 1


# ----------------------------------------------------------------------------- atomicity and keep


def test_keep_and_an_exception_mid_write(tmp_path):
    for r in (1, 2, 3):
        write_ckpt(tmp_path, r, keep=2)
    assert rounds(tmp_path) == [2, 3]
    before = (tmp_path / "ckpt_00000003.h5").read_bytes()
    with pytest.raises(RuntimeError, match="boom"):
        with CheckpointWriter(tmp_path, 4, algorithm="scaffold", num_clients=N, dim=D, keep=2) as w:
            w.create_rows("clients/c", N, D)
            w.write_rows("clients/c", 0, np.ones((5, D)))
            raise RuntimeError("boom")  # e.g. a failing device-to-host copy of the next block
    assert rounds(tmp_path) == [2, 3] and not w.tmp_path.exists()
    assert (tmp_path / "ckpt_00000003.h5").read_bytes() == before
    assert find_latest_valid(tmp_path) == tmp_path / "ckpt_00000003.h5"
    write_ckpt(tmp_path, 4, keep=2)
    assert rounds(tmp_path) == [3, 4]


def test_an_hdf5_error_mid_write_is_a_checkpoint_error(tmp_path, monkeypatch):
    prev, _ = write_ckpt(tmp_path, 1)

    def fail(self, key, value):
        raise OSError(
            "Can't write data (file write failed: errno = 28, error message = 'No space left on device')"
        )

    with pytest.raises(CheckpointError) as e:
        with CheckpointWriter(tmp_path, 2, algorithm="scaffold", num_clients=N, dim=D) as w:
            w.create_rows("clients/c", N, D)
            monkeypatch.setattr(h5py.Dataset, "__setitem__", fail)
            w.write_rows("clients/c", 0, np.ones((N, D)))
    monkeypatch.undo()
    assert_one_line(e.value, "ckpt_00000002.h5", "writing clients/c rows 0:12", "No space left on device")
    assert rounds(tmp_path) == [1] and not w.tmp_path.exists() and find_latest_valid(tmp_path) == prev


def _child(code: str, *args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_sigkill_while_writing_a_large_checkpoint(tmp_path):
    write_ckpt(tmp_path, 1, keep=2)
    prev, _ = write_ckpt(tmp_path, 2, keep=2)
    before = prev.read_bytes()
    child = _child(
        """
        import sys, time
        import numpy as np
        from fedrun.checkpoint import CheckpointWriter
        n, d = 256, 65536  # 64 MiB of client state, streamed one row at a time
        row = np.ones((1, d), np.float32)
        with CheckpointWriter(sys.argv[1], 3, algorithm="scaffold", num_clients=n, dim=d, keep=2) as w:
            w.create_rows("clients/c", n, d)
            for i in range(n):
                w.write_rows("clients/c", i, row)
                if i == 16:
                    print("streaming", flush=True)
                time.sleep(0.01)
        """,
        str(tmp_path),
    )
    try:
        assert child.stdout.readline().strip() == "streaming", child.stderr.read()
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    tmp = tmp_path / ".ckpt_00000003.h5.tmp"
    assert tmp.exists()  # killed mid-write: the temporary is left behind ...
    assert rounds(tmp_path) == [1, 2] and prev.read_bytes() == before  # ... and nothing else changed
    assert find_latest_valid(tmp_path, warn=pytest.fail) == prev
    write_ckpt(tmp_path, 3, keep=2)  # the next write cleans it up and honours keep
    assert not tmp.exists() and rounds(tmp_path) == [2, 3]


def test_file_too_large_mid_write_is_a_clear_error(tmp_path):
    """A real write failure: RLIMIT_FSIZE makes write(2) fail with EFBIG, as a full disk fails with ENOSPC."""
    prev, _ = write_ckpt(tmp_path, 1)
    child = _child(
        """
        import resource, signal, sys
        import numpy as np
        from fedrun.checkpoint import CheckpointWriter
        from fedrun.errors import CheckpointError
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        try:
            with CheckpointWriter(sys.argv[1], 2, algorithm="scaffold", num_clients=64, dim=8192) as w:
                w.create_rows("clients/c", 64, 8192)
                for i in range(0, 64, 8):
                    w.write_rows("clients/c", i, np.ones((8, 8192), np.float32))
        except CheckpointError as e:
            print(f"CheckpointError: {e}")
        """,
        str(tmp_path),
    )
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert out.startswith("CheckpointError: ") and out.count("\n") == 1, out
    assert "ckpt_00000002.h5" in out and "File too large" in out, out
    assert rounds(tmp_path) == [1] and not (tmp_path / ".ckpt_00000002.h5.tmp").exists()
    assert find_latest_valid(tmp_path, warn=pytest.fail) == prev


def test_unwritable_run_directory_is_a_clear_error(tmp_path):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a regular file where a directory should be")
    for run_dir in (blocker / "run", blocker):
        with pytest.raises(CheckpointError) as e:
            CheckpointWriter(run_dir, 1, algorithm="fedavg", num_clients=N, dim=D)
        assert_one_line(e.value, str(run_dir), "cannot write checkpoints into")
    assert blocker.read_text().startswith("a regular file")


def test_leftover_temporaries_are_ignored_then_cleaned(tmp_path):
    prev, _ = write_ckpt(tmp_path, 1)
    junk = tmp_path / ".ckpt_00000005.h5.tmp"
    junk.write_bytes(b"\x89HDF half a file")
    assert list_checkpoints(tmp_path) == [prev]
    assert find_latest_valid(tmp_path, warn=pytest.fail) == prev
    write_ckpt(tmp_path, 2)
    assert not junk.exists() and rounds(tmp_path) == [1, 2]


def test_newer_rounds_from_an_earlier_attempt_are_kept_until_removed(tmp_path):
    for r in (1, 2, 3, 4):
        write_ckpt(tmp_path, r, keep=None)
    write_ckpt(tmp_path, 2, keep=2)  # a rerun from round 1 rewrites round 2
    assert rounds(tmp_path) == [1, 2, 3, 4]  # keep counts rounds <= 2; 3 and 4 are left alone
    assert remove_checkpoints_after(tmp_path, 2) == [
        tmp_path / "ckpt_00000003.h5",
        tmp_path / "ckpt_00000004.h5",
    ]
    write_ckpt(tmp_path, 3, keep=2)
    assert rounds(tmp_path) == [2, 3]


def test_describe_checkpoint(tmp_path):
    path, _ = write_ckpt(tmp_path, 7)
    text = describe_checkpoint(path)
    assert "after round 7 (resumes with round 8)" in text and "algorithm scaffold" in text
    assert f"N={N}" in text and f"d={D}" in text
    assert f"format version {FORMAT_VERSION}" in text
    line = next(s for s in text.splitlines() if "clients/c" in s)
    assert f"({N}, {D})" in line and "float32" in line and f"{N * D * 4:,} B" in line and line.endswith("ok")
    assert "checksums: all 9 datasets verify" in text and "total data" in text
    out = subprocess.run(
        [sys.executable, "-m", "fedrun.checkpoint", str(path)], capture_output=True, text=True, cwd=REPO
    )
    assert out.returncode == 0 and out.stdout.strip() == text


def test_dataset_crc_combined_from_chunk_crcs_equals_zlib():
    from fedrun.checkpoint.crc import crc32_combine

    rng = np.random.default_rng(3)
    for _ in range(200):
        a, b = (rng.bytes(int(rng.integers(0, 5000))) for _ in range(2))
        assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


def test_a_run_directory_that_is_gone_is_never_created_again(tmp_path):
    """A run directory moved away mid-run (after snapshot's check, before the writer starts) must fail the
    checkpoint, not come back empty at the old path where the run would go on writing."""
    run_dir = tmp_path / "moved_away"
    with pytest.raises(CheckpointError) as e:
        CheckpointWriter(run_dir, 3, algorithm="fedavg", num_clients=N, dim=D)
    assert_one_line(e.value, str(run_dir), "cannot write checkpoints into")
    assert not run_dir.exists()
