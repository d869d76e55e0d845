"""docs/extending.md followed end to end: the plugin package is built from the page's snippets alone (each
names its file and must equal the file in examples/, so the page is the whole source), and the page's
commands run as written, in a directory that holds nothing but what the page gave; a command's expected
output, when the page shows one right after it, must be what it prints. The commands that need Slurm or
minutes (the kill-and-resume and the job-array submission) are run by tests/test_examples.py."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, child_env, mpiexec

pytestmark = pytest.mark.mpi

PAGE = REPO / "docs" / "extending.md"
# commands of the page this test does not run, and where they are run instead
ELSEWHERE = ("make venv", "export ", "timeout -s KILL", "run.dir=runs/myfl-cut", "sweep examples/sweep.yaml  ",
             "report runs/sweeps/myfl-clip")


def blocks() -> list[tuple[str, str]]:
    return re.findall(r"^```(\w*)\n(.*?)^```", PAGE.read_text(), re.S | re.M)


def commands(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def run(line: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    argv = shlex.split(line, comments=True)
    argv = [{"python": sys.executable, "mpiexec": mpiexec()}.get(a, a) for a in argv]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_the_page_builds_the_package_and_its_commands_run_as_written(tmp_path):
    found = blocks()
    files = {}
    for lang, text in found:
        if lang == "python":
            header, _, body = text.partition("\n")
            assert header.startswith("# examples/"), f"a python snippet without its file name: {header}"
            files[header[2:]] = body
        elif lang == "yaml":
            name = "examples/sweep.yaml" if "\nname: myfl-clip" in text else "examples/experiment.yaml"
            files[name] = text
    repo_files = {str(p.relative_to(REPO)) for p in (REPO / "examples").rglob("*") if p.suffix in (".py", ".yaml")}
    assert set(files) == repo_files, "every file of examples/ on the page, and nothing else"
    for name, text in files.items():
        assert text == (REPO / name).read_text(), f"{name} on the page differs from the repository's"
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    env = {**child_env(), "PYTHONPATH": f"{tmp_path / 'examples'}{os.pathsep}{REPO}"}
    ran = 0
    for i, (lang, text) in enumerate(found):
        if lang != "bash":
            continue
        expected = found[i + 1][1].strip() if i + 1 < len(found) and found[i + 1][0] == "" else None
        for line in commands(text):
            if any(skip in line + "  " for skip in ELSEWHERE):
                continue
            proc = run(line, tmp_path, env)
            ran += 1
            if expected is not None and "--resume" in line:
                assert proc.returncode == 2 and proc.stderr.strip() == expected, (line, proc.stderr)
                continue
            assert proc.returncode == 0, (line, proc.stdout[-2000:], proc.stderr[-2000:])
            if " inspect " in line:
                for field in ("algorithm.name", "model.name", "data.name", "participation.pattern"):
                    assert f"plugins/{field}: myfl." in proc.stdout, proc.stdout
            if "--defaults" in line:
                assert re.search(r"^model\.width +32 +hidden units$", proc.stdout, re.M), proc.stdout
                assert re.search(r"^participation\.cooldown +1 +rounds a client", proc.stdout, re.M)
            if line.startswith("head "):  # the sink's file, written once on 2 ranks: a header, then rounds 1, 2
                lines = proc.stdout.splitlines()
                assert lines[0] == "round,train_loss,test_accuracy,active_clients", lines
                assert [row.split(",")[0] for row in lines[1:]] == ["1", "2"], lines
    assert ran == 6  # train, inspect, head of the sink's file, config --defaults, the refused resume, sweep --dry-run


def test_the_pages_error_lines_are_what_fedrun_says(monkeypatch):
    from fedrun.config import load_config
    from fedrun.errors import ConfigError

    monkeypatch.syspath_prepend(str(REPO / "examples"))
    lines = next(t for lang, t in blocks() if lang == "" and "model.width: expected" in t).splitlines()
    for override in ("algorithm.clipp=1", "model.width=wide", "participation.cooldown=-1"):
        with pytest.raises(ConfigError) as err:
            load_config(REPO / "examples" / "experiment.yaml", [override])
        assert f"fedrun: error: {err.value}" in lines
