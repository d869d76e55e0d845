"""Every rule held to its declaration (fedrun/algorithms/contract.py): a plugin rule that returns a
misshapen, wrongly typed, missing or undeclared entry, or reads an entry it was not given, ends the run with
ONE line naming the plugin, the rule, the entry, what was expected and what came (exit status 2), before
any checkpoint is written. On 2 real ranks for the server rule (rank 0 alone runs it) and for a client
rule (both ranks meet it: one line all the same); the other breaches in this process."""

from __future__ import annotations

import io
import textwrap
from contextlib import redirect_stderr, redirect_stdout

import pytest
from helpers import LEAST_SQUARES, run_ranks

from fedrun.cli import main

PLUGIN = textwrap.dedent('''
    import torch
    from fedrun.algorithms.fedavg import FedAvg
    from fedrun.algorithms.scaffold import Scaffold

    class WideX(FedAvg):  # x as [1, d]: the checkpoints of such a run would fail inspect
        def server_update(self, server, up, ctx):
            new = super().server_update(server, up, ctx)
            return {**new, "x": new["x"].unsqueeze(0)}

    class HalfX(FedAvg):  # float16: the run would go on with the model rounded every round
        def server_update(self, server, up, ctx):
            new = super().server_update(server, up, ctx)
            return {**new, "x": new["x"].to(torch.float16)}

    class Empty(FedAvg):
        def server_update(self, server, up, ctx):
            return {}

    class Extra(FedAvg):
        def server_update(self, server, up, ctx):
            return {**super().server_update(server, up, ctx), "momentum": server["x"]}

    class TypoRead(FedAvg):
        def server_update(self, server, up, ctx):
            return {"x": server["x"] + up["delta_typo"]}

    class TypoClient(FedAvg):
        def client_finish(self, down, state, local, clients, ctx):
            return {"delta": local.x_end - down["x_typo"]}, state

    class NoUpload(FedAvg):
        def client_finish(self, down, state, local, clients, ctx):
            return {}, state

    class ScalarUpload(FedAvg):
        def client_finish(self, down, state, local, clients, ctx):
            return {"delta": (local.x_end - down["x"]).sum(dim=1)}, state

    class BadState(Scaffold):
        def client_finish(self, down, state, local, clients, ctx):
            up, new = super().client_finish(down, state, local, clients, ctx)
            return up, {**new, "c_i": new["c_i"][:, :1]}

    class BadAfter(FedAvg):
        def after_round(self, down_next, state, active, ctx):
            return {"ghost": down_next["x"]}

    class BadPlan(FedAvg):
        def local_plan(self, down, state, clients, ctx):
            from fedrun.protocol import LocalPlan
            return LocalPlan(start=down["x"])
''')

BASE = [*LEAST_SQUARES, "run.rounds=3", "local.steps=2", "checkpoint.every=1", "participation.clients_per_round=3"]


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    (tmp_path / "badrules.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    import sys

    sys.modules.pop("badrules", None)


def _in_process(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        code = main(argv)
    return code, err.getvalue()


@pytest.mark.parametrize("cls, words", [
    ("HalfX", ["rule server_update", "server entry 'x'", "[5] float16", "expected [5] float64"]),
    ("Empty", ["rule server_update", "did not return server entry 'x'", "got none"]),
    ("Extra", ["rule server_update", "'momentum', which is not declared"]),
    ("TypoRead", ["rule server_update", "read entry 'delta_typo'", "delta"]),
    ("NoUpload", ["rule client_finish", "did not return upload entry 'delta'"]),
    ("ScalarUpload", ["rule client_finish", "upload entry 'delta'", "[3] float64", "expected [3, 5] float64"]),
    ("BadState", ["rule client_finish", "client state entry 'c_i'", "[3, 1]", "expected [3, 5]"]),
    ("BadAfter", ["rule after_round", "'ghost', which is not declared"]),
    ("BadPlan", ["rule local_plan", "LocalPlan.start", "[5] float64", "expected [3, 5]"]),
])
def test_a_rule_breaking_its_declaration_is_one_line_and_status_2(plugin_dir, cls, words):
    run = plugin_dir / "run"
    code, err = _in_process(["train", "--quiet", *BASE, f"algorithm.name=badrules:{cls}",
                             f"run.dir={run}"])
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"fedrun: error: algorithm.name=badrules:{cls}: "), lines
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert not list(run.glob("ckpt_*.h5")), "a checkpoint was written after the breach"


@pytest.mark.parametrize("cls, words", [
    ("WideX", ["rank 0", "rule server_update", "server entry 'x'", "[1, 5]", "expected [5]"]),
    ("TypoClient", ["rule client_finish", "read entry 'x_typo'"]),
])
def test_on_two_ranks_the_breach_ends_the_job_with_one_line_and_no_checkpoint(plugin_dir, cls, words):
    run = plugin_dir / "run"
    proc = run_ranks(2, ["-m", "fedrun", "train", "--quiet", *BASE, "run.placement=blocks",
                         f"algorithm.name=badrules:{cls}", f"run.dir={run}"], cwd=plugin_dir, check=False, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for word in [f"algorithm.name=badrules:{cls}", *words]:
        assert word in lines[0], (word, lines[0])
    assert not list(run.glob("ckpt_*.h5")), "a checkpoint was written after the breach"
