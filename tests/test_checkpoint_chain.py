"""Incremental checkpoints (fedrun.checkpoint.chain, checkpoint.full_every): real runs on real ranks whose
checkpoints hold the client rows changed since the previous one; resumes on 1 and 2 ranks and elastic ones,
broken links, pruning and a consolidated copy, each compared bit for bit with the uninterrupted run.

Every run is made once, in three launches (tests/mpi_runs.py), by the module's fixture; the tests read the
files. Float64 least squares, 40 clients, 3 a round, 8 rounds, cut after 5."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import REPO, RESUME_BASE, final_state, metrics, run_ranks

from fedrun.checkpoint.chain import base_file
from fedrun.checkpoint.consolidate import consolidate
from fedrun.checkpoint.files import prune
from fedrun.cli import main
from fedrun.errors import CheckpointError
from fedrun.federation.snapshot import check_chain

CUT, ROUNDS = 5, 8
KILLED_AT = 4  # a run SIGKILLed while it writes the checkpoint of round 4 (an increment on 3 on 2 on 1)
ALGORITHMS = {"scaffold": "algorithm.name=scaffold", "fedsum": "algorithm.name=fedsum",
              "fedawe": "algorithm.name=fedawe"}  # FedAWE's x_own starts at x^(0): the rows form in full files too
CHAIN = "chain"  # SCAFFOLD, full checkpoints at 1 and 4, increments 2, 3 (on 1) and 5 (on 4)
DAMAGES = ("deleted", "truncated")  # what happens to the chain's ckpt 4 (which ckpt 5 builds on)


def _launch(ranks: int, root: Path, runs: list[tuple[str, list[str], str | None]]) -> None:
    spec = root / f"spec_{ranks}_{runs[0][0]}.json"
    spec.write_text(json.dumps([{"name": name, "overrides": overrides, "resume": resume}
                                for name, overrides, resume in runs]))
    run_ranks(ranks, [str(REPO / "tests" / "mpi_runs.py"), str(spec), str(root)], timeout=400)


def _run(root: Path, name: str, rounds: int, *extra: str) -> list[str]:
    return [f"run.dir={root / name}", f"run.rounds={rounds}", *RESUME_BASE, "data.num_clients=40", *extra]


def _disk(root: Path, algorithm: str, *extra: str) -> tuple[str, ...]:
    return (ALGORITHMS[algorithm], "state.store=disk", f"state.dir={root / 'scratch'}", "checkpoint.every=1",
            *extra)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("chain")
    chain = _disk(root, "scaffold", "checkpoint.keep=10", "checkpoint.full_every=3")
    first = [(f"whole_{a}", _run(root, f"whole_{a}", ROUNDS, ALGORITHMS[a], "state.store=memory"), None)
             for a in ALGORITHMS]
    first += [(f"cut_{a}", _run(root, f"cut_{a}", CUT, *_disk(root, a)), None) for a in ALGORITHMS]
    full = _disk(root, "scaffold", "checkpoint.full_every=1")  # every checkpoint full, as before the chain
    first += [("full", _run(root, "full", CUT, *full), None)]
    first += [("cut2", _run(root, "cut2", CUT, *_disk(root, "scaffold", "checkpoint.every=2")), None),
              (CHAIN, _run(root, CHAIN, CUT, *chain), None)]
    _launch(2, root, first)
    killed = run_ranks(0, [str(REPO / "tests" / "kill_in_write.py"), str(KILLED_AT),
                           *_run(root, "killed", ROUNDS, *_disk(root, "scaffold"))], check=False)
    assert killed.returncode == -9 and (root / "killed" / f".ckpt_{KILLED_AT:08d}.h5.tmp").exists(), killed.stderr
    assert sorted(p.name for p in (root / "killed").glob("ckpt_*")) == [f"ckpt_{r:08d}.h5" for r in (1, 2, 3)]
    shutil.copytree(root / "cut2", root / "2to1")
    shutil.copytree(root / "cut2", root / "2to2")
    _launch(1, root, [("cut1", _run(root, "cut1", CUT, *_disk(root, "scaffold", "checkpoint.every=2")), None),
                      ("2to1", _run(root, "2to1", ROUNDS, *_disk(root, "scaffold", "checkpoint.every=2")), "auto")])
    shutil.copytree(root / "cut1", root / "1to2")
    (root / "fresh").mkdir()
    consolidate(root / CHAIN / "ckpt_00000005.h5", root / "fresh" / "all.h5", check_chain)
    for damage in DAMAGES:
        shutil.copytree(root / CHAIN, root / damage)
        base = root / damage / "ckpt_00000004.h5"
        if damage == "deleted":
            base.unlink()
        else:
            base.write_bytes(base.read_bytes()[:3000])
    last = [(f"cut_{a}", _run(root, f"cut_{a}", ROUNDS, *_disk(root, a)), "auto") for a in ALGORITHMS]
    last += [("full", _run(root, "full", ROUNDS, *full), "auto")]
    last += [(name, _run(root, name, ROUNDS, *_disk(root, "scaffold", "checkpoint.every=2")), "auto")
             for name in ("2to2", "1to2")]
    last += [("killed", _run(root, "killed", ROUNDS, *_disk(root, "scaffold")), "auto")]
    last += [(f"{d}_explicit", _run(root, d, ROUNDS, *chain), str(root / d / "ckpt_00000005.h5")) for d in DAMAGES]
    last += [(d, _run(root, d, ROUNDS, *chain), "auto") for d in DAMAGES]
    last += [("fresh", _run(root, "fresh", ROUNDS, *chain), str(root / "fresh" / "all.h5"))]
    _launch(2, root, last)
    return root


def _same(a: Path, b: Path) -> None:
    """The same final state (every server and client entry) and the same losses of the last rounds."""
    sa, sb = final_state(a), final_state(b)
    assert sa.keys() == sb.keys()
    for key in sa:  # a row of the rows form that no link stores (NaN) holds x^(0): compared where both store it
        x, y = sa[key], sb[key]
        if x.ndim == 2:
            stored = ~(np.isnan(x).all(axis=1) | np.isnan(y).all(axis=1))
            x, y = x[stored], y[stored]
        assert np.array_equal(x, y), key
    assert [m["train_loss"] for m in metrics(a)][-3:] == [m["train_loss"] for m in metrics(b)][-3:]


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_resume_from_an_increment_equals_the_uninterrupted_run(runs, algorithm):
    """The disk store's default chain (a full checkpoint, then increments): cut after 5 rounds, the newest file
    an increment 4 links deep, resumed on 2 ranks, equals the uninterrupted run on the in-memory store (and,
    for SCAFFOLD, the same cut run with full checkpoints, checkpoint.full_every=1)."""
    with h5py.File(runs / f"cut_{algorithm}" / f"ckpt_{CUT:08d}.h5", "r") as f:
        assert json.loads(f["meta/base"].asstr()[()])["depth"] == 4
    _same(runs / f"whole_{algorithm}", runs / f"cut_{algorithm}")
    if algorithm == "scaffold":  # and the same run with every checkpoint full
        with h5py.File(runs / "full" / f"ckpt_{ROUNDS:08d}.h5", "r") as f:
            assert "meta/base" not in f and f["clients/c_i"].shape == (40, 5)
        _same(runs / "full", runs / "cut_scaffold")


@pytest.mark.mpi
@pytest.mark.parametrize("run", ["2to2", "2to1", "1to2"])
def test_resumes_from_increments_on_one_two_and_another_number_of_ranks(runs, run):
    """SCAFFOLD's chain written on 2 ranks resumes on 2 and on 1, and written on 1 resumes on 2, each equal to the
    uninterrupted run bit for bit (the client sums are exact)."""
    _same(runs / "whole_scaffold", runs / run)


@pytest.mark.mpi
def test_a_kill_in_the_middle_of_a_write_leaves_the_chain_valid(runs):
    """SIGKILL while the increment of round 4 streams its rows into its temporary: 1, 2, 3 stay whole (the fixture
    checks the files); --resume auto goes on from 3 and ends equal to the uninterrupted run bit for bit."""
    assert "resumed from" in (runs / "killed.out").read_text() and "skipping" not in (runs / "killed.out").read_text()
    _same(runs / "whole_scaffold", runs / "killed")


@pytest.mark.mpi
def test_an_increment_stores_the_clients_trained_since_the_previous_checkpoint(runs):
    """Checkpoints every 2 rounds: each increment's rows are the distinct clients trained since its base
    (history/last_active), on 2 ranks and on 1, read back with h5py."""
    for cut in ("cut2", "cut1"):
        paths = sorted((runs / cut).glob("ckpt_*.h5"))
        assert [p.name for p in paths] == ["ckpt_00000002.h5", "ckpt_00000004.h5", "ckpt_00000005.h5"]
        for path in paths[1:]:
            with h5py.File(path, "r") as f:
                since = json.loads(f["meta/base"].asstr()[()])["round"]  # the previous checkpoint's round
                trained = np.flatnonzero(f["history/last_active"][()] >= since)
                assert 0 < len(trained) <= 3 * (f["meta/round"][()] - since)
                assert np.array_equal(f["clients/c_i/rows"][()], trained), path
                assert f["clients/c_i/values"].shape == (len(trained), 5)


def _fedrun(capsys, *args: str) -> tuple[int, str, str]:
    """``fedrun ARGS`` in this process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.mpi
@pytest.mark.parametrize("damage", DAMAGES)
def test_a_broken_link_is_named_and_skipped_to_the_newest_complete_checkpoint(runs, damage):
    """ckpt 4 deleted or truncated: an explicit --resume of 5 is refused naming it; --resume auto says in one line
    that it skips 5 and why, resumes from 3 (3 -> 2 -> 1 is complete), and ends equal to the uninterrupted run."""
    explicit = (runs / f"{damage}_explicit.out").read_text().splitlines()
    assert explicit[-1].startswith("error: --resume") and "chain link ckpt_00000004.h5" in explicit[-1], explicit
    warned = [line for line in (runs / f"{damage}.out").read_text().splitlines() if "skipping" in line]
    assert len(warned) == 1 and "skipping checkpoint ckpt_00000005.h5" in warned[0], warned
    assert "chain link ckpt_00000004.h5" in warned[0] and "resuming from ckpt_00000003.h5" in warned[0]
    _same(runs / "whole_scaffold", runs / damage)


@pytest.mark.mpi
def test_inspect_names_a_broken_link_and_what_it_breaks(runs, tmp_path, capsys):
    """inspect of ckpt 5 whose base 4 is deleted, truncated or replaced by another run's, and of the truncated 4
    itself: one line naming 4 and the checkpoint it breaks, status 2; of the whole chain's 5: it verifies."""
    code, out, err = _fedrun(capsys, "inspect", str(runs / CHAIN / "ckpt_00000005.h5"))
    assert code == 0 and "chain: an increment, 1 after a full checkpoint" in out, err
    for damage in (*DAMAGES, "replaced"):
        run = tmp_path / damage
        shutil.copytree(runs / CHAIN, run)
        base = run / "ckpt_00000004.h5"
        if damage == "deleted":
            base.unlink()
        elif damage == "truncated":
            base.write_bytes(base.read_bytes()[:3000])
        else:  # another run's checkpoint of the same round, complete and valid itself
            shutil.copy(runs / "cut2" / "ckpt_00000004.h5", base)
        for target in ("ckpt_00000005.h5", "ckpt_00000004.h5")[: 2 if damage == "truncated" else 1]:
            code, out, err = _fedrun(capsys, "inspect", str(run / target))
            lines = err.strip().splitlines()
            assert code == 2 and len(lines) == 1 and "ckpt_00000004.h5" in lines[0], err
            assert "breaks ckpt_00000005.h5" in lines[0] and (damage != "replaced" or "replaced" in lines[0]), lines


def test_keep_never_deletes_a_base_a_kept_checkpoint_needs(runs, tmp_path):
    """keep=1 after ckpt 5: 5 is kept and so is the full checkpoint 4 it builds on; 1, 2, 3 go. keep=2 after 3
    (an increment on 2 on 1) keeps 3 and 2 and their base 1."""
    for newest, keep, left in ((5, 1, [4, 5]), (3, 2, [1, 2, 3])):
        run = tmp_path / f"keep{keep}"
        shutil.copytree(runs / CHAIN, run)
        prune(run, newest, keep, base_file)
        assert sorted(p.name for p in run.glob("ckpt_*")) == [f"ckpt_{r:08d}.h5" for r in left] + [
            f"ckpt_{r:08d}.h5" for r in range(newest + 1, CUT + 1)]


@pytest.mark.mpi
def test_a_consolidated_copy_resumes_bit_for_bit_in_a_fresh_directory(runs, tmp_path, capsys):
    """One self-contained file from the chain 5 -> 4: no meta/base, every client row some link stores; resumed
    from a fresh directory it ends equal to the uninterrupted run. Bad input: one error, nothing written."""
    with h5py.File(runs / "fresh" / "all.h5", "r") as f:
        assert "meta/base" not in f and 0 < f["clients/c_i/rows"].shape[0] <= 40
    _same(runs / "whole_scaffold", runs / "fresh")
    with pytest.raises(CheckpointError, match="nosuch.h5"):
        consolidate(tmp_path / "nosuch.h5", tmp_path / "x.h5", check_chain)
    with pytest.raises(CheckpointError, match="ckpt_00000004.h5"):
        consolidate(_broken(runs, tmp_path), tmp_path / "x.h5", check_chain)
    with pytest.raises(CheckpointError, match="an incremental checkpoint; expected --out FILE"):
        consolidate(runs / CHAIN / "ckpt_00000005.h5", None, check_chain)
    assert not list(tmp_path.glob("x.h5*")) and not list(tmp_path.glob(".x.h5*"))
    code, out, err = _fedrun(capsys, "checkpoint", "consolidate", str(tmp_path / "nosuch.h5"), "--out",
                             str(tmp_path / "y.h5"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and not (tmp_path / "y.h5").exists(), err


def _broken(runs: Path, tmp_path: Path) -> Path:
    """A copy of the chain's ckpt 5 without the ckpt 4 it builds on."""
    (tmp_path / "broken").mkdir()
    shutil.copy(runs / CHAIN / "ckpt_00000005.h5", tmp_path / "broken")
    return tmp_path / "broken" / "ckpt_00000005.h5"
