"""``--resume FILE``, ``--resume auto`` and ``inspect`` agree on what a damaged chain is (docs/checkpoint.md): a
byte flipped in an intermediate link's ``history/last_active_before`` (its checksum fails; the file still opens
and has its layout) is named by all three; the explicit resume is refused with status 2 and writes nothing."""

from __future__ import annotations

import contextlib
import io

import h5py
from helpers import LEAST_SQUARES, file_digests

from fedrun.cli import main

RUN = [*LEAST_SQUARES, "participation.clients_per_round=3", "algorithm.name=scaffold", "state.store=disk",
       "checkpoint.every=1", "checkpoint.full_every=3"]  # ckpt 1 full, 2 on 1, 3 on 2


def _fedrun(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def test_a_flipped_byte_in_an_intermediate_link_is_damage_for_resume_auto_and_inspect(tmp_path):
    run = tmp_path / "run"
    assert _fedrun("train", "--quiet", f"run.dir={run}", "run.rounds=3", *RUN)[0] == 0
    link = run / "ckpt_00000002.h5"
    with h5py.File(link, "r") as f:
        offset = f["history/last_active_before"].id.get_offset()
    raw = bytearray(link.read_bytes())
    raw[offset] ^= 0x01
    link.write_bytes(bytes(raw))
    head = run / "ckpt_00000003.h5"

    code, out, err = _fedrun("inspect", str(head))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "ckpt_00000002.h5" in err, (out, err)

    before = file_digests(run)
    code, out, err = _fedrun("train", "--quiet", f"run.dir={run}", "run.rounds=5", *RUN, "--resume", str(head))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "--resume" in lines[0] and "chain link ckpt_00000002.h5" in lines[0] and "damaged" in lines[0], lines
    assert file_digests(run) == before  # nothing written

    code, out, err = _fedrun("train", "--quiet", f"run.dir={run}", "run.rounds=5", *RUN, "--resume", "auto")
    assert code == 0, err
    warned = [line for line in out.splitlines() if "skipping" in line]
    assert len(warned) == 1 and "ckpt_00000002.h5" in warned[0] and "ckpt_00000003.h5" in warned[0], out
    assert "resuming from ckpt_00000001.h5" in warned[0], warned
