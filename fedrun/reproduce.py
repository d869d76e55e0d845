"""``fedrun reproduce CLAIM_ID``: rerun the runs behind one row of a claims file, or print their commands.

A row of ``docs/results/claims.json`` (docs/results.md, "How a verdict is reached") names its run records in
``a`` and ``b``: JSON files, paths from the repository root. A record says how it was made:

* a training record has ``base`` (a config file) and ``overrides``: the run is
  ``python -m fedrun train --config BASE OVERRIDES``;
* a flatness record has, besides the ``base`` and ``overrides`` of the run that wrote its model, that
  model's ``checkpoint`` and the measure's settings (``examples``, ``rho``, ``directions``,
  ``flatness_seed``): the run, then ``python -m fedrun flatness CHECKPOINT ...`` on the rerun's checkpoint
  of the same name;
* any other file (an analysis of other runs) names no run: its row is refused with one line that gives
  the row's ``command``, the experiment step that rewrites the committed file.

``c`` and ``d``, where a row has them, are run files too. A row whose files are not all there yet (the
page's "not yet run") is refused with one line giving its ``command``.

A rerun writes to its own directory, ``OUT/<the record's path from the claims file's folder, without
.json>`` (``runs/reproduce/fmnist_10seeds/eta0.3/p1/FedSUM_s0``; its ``run.dir`` override is
replaced; extra overrides come last, e.g. ``run.rounds=25``), from the repository root, one command at a
time, and ``--resume auto``: a finished rerun says so, an interrupted one continues. Each rerun is then
set against its record: the test accuracy at every evaluation round both have (a training record), the top
eigenvalue, the loss increases and the accuracies (a flatness record), compared exactly. Fields of a row or
a record not named here are ignored.
"""

from __future__ import annotations

import argparse
import difflib
import json
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedrun.errors import EXIT_FAILURE, EXIT_OK, ConfigError, report

CLAIMS = Path("docs") / "results" / "claims.json"
FLATNESS_FIELDS = ("top_eigenvalue", "loss_increase", "train_loss", "train_accuracy", "test_accuracy")


@dataclass(frozen=True)
class Rerun:
    """One record of a row and the commands that make it again (run from the repository root)."""

    record: str  # its path from the repository root
    fields: dict[str, Any]
    run_dir: str  # the rerun's run directory, from the repository root
    commands: tuple[tuple[str, ...], ...]

    def shell(self) -> str:
        return "\n".join(shlex.join(["python", "-m", "fedrun", *c]) for c in self.commands)


def find_claims(path: str | None) -> Path:
    """``path``, else docs/results/claims.json of the working directory or of the checkout holding fedrun."""
    if path is not None:
        found = Path(path)
        if not found.is_file():
            raise ConfigError(f"--claims {path}: no such file; expected a claims JSON file")
        return found
    for root in (Path.cwd(), Path(__file__).resolve().parents[1]):
        if (root / CLAIMS).is_file():
            return root / CLAIMS
    raise ConfigError(f"no {CLAIMS} in the working directory or beside the fedrun package; expected --claims FILE")


def load_rows(claims: Path) -> list[dict[str, Any]]:
    try:
        rows = json.loads(claims.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{claims}: not a readable JSON file ({exc})") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and isinstance(r.get("id"), str) for r in rows):
        raise ConfigError(f"{claims}: expected a JSON list of rows, each with an id")
    return rows


def find_row(rows: list[dict[str, Any]], claim_id: str, claims: Path) -> dict[str, Any]:
    for row in rows:
        if row["id"] == claim_id:
            return row
    near = difflib.get_close_matches(claim_id, [r["id"] for r in rows], n=3)
    hint = f"; the nearest: {', '.join(near)}" if near else f"; ids look like {rows[0]['id']}" if rows else ""
    raise ConfigError(f"{claim_id}: no row of {claims} has this id ({len(rows)} rows{hint})")


def record_paths(row: dict[str, Any], claims: Path) -> list[str]:
    """The row's run records, ``a``, ``b`` (and ``c``, ``d`` where a statistic pairs more lists), each once."""
    paths: list[str] = []
    for side in ("a", "b", "c", "d"):
        files = row.get(side, [])
        if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
            raise ConfigError(f"{claims}: row {row['id']}: expected {side!r}, a list of run files")
        paths += [f for f in files if f not in paths]
    return paths


def repository_root(claims: Path, paths: list[str]) -> Path | None:
    """The nearest folder above the claims file from which one of the row's record paths exists (None: none
    of them is there yet)."""
    for folder in claims.resolve().parents:
        if any((folder / p).is_file() for p in paths):
            return folder
    return None


def _pending(row: dict[str, Any], missing: list[str]) -> ConfigError:
    """The line for a row whose run files are not all there yet (the page lists it as not yet run)."""
    step = row.get("command")
    return ConfigError(f"row {row['id']}: {len(missing)} of its run files are not there yet ({missing[0]}"
                       f"{', ...' if len(missing) > 1 else ''}): the claim is not yet run"
                       + (f"; its row's command `{step}` runs them" if isinstance(step, str) else ""))


def plan(root: Path, record: str, out: Path, extra: list[str], folder: Path | None = None) -> Rerun:
    """The commands that remake ``record`` (see the module's docstring) into ``out/<record>``, the record's
    path taken from ``folder`` (the claims file's) when it lies below it."""
    try:
        fields = json.loads((root / record).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{record}: not a readable run record ({exc})") from None
    base, overrides = fields.get("base"), fields.get("overrides")
    if not isinstance(base, str) or not isinstance(overrides, list):
        return Rerun(record, fields, "", ())  # an analysis of other files: only its row's command makes it
    name = Path(record).with_suffix("")
    if folder is not None and (root / name).resolve().is_relative_to(folder):
        name = (root / name).resolve().relative_to(folder)
    run_dir = str(out / name)
    train = ("train", "--config", base, *(o for o in overrides if not o.startswith("run.dir=")),
             f"run.dir={run_dir}", *extra, "--resume", "auto", "--quiet")
    if "checkpoint" not in fields:
        return Rerun(record, fields, run_dir, (train,))
    try:
        flatness = ("flatness", f"{run_dir}/{Path(fields['checkpoint']).name}", "--examples", str(fields["examples"]),
                    "--rho", *(str(r) for r in fields["rho"]), "--directions", str(fields["directions"]),
                    "--seed", str(fields["flatness_seed"]), "--json")
    except (KeyError, TypeError):
        raise ConfigError(f"{record}: a checkpoint without the flatness settings (expected examples, rho, "
                          "directions, flatness_seed)") from None
    return Rerun(record, fields, run_dir, (train, flatness))


def plan_row(row: dict[str, Any], claims: Path, seeds: list[int] | None, out: Path,
             extra: list[str]) -> tuple[Path, list[Rerun]]:
    """(the repository root, the reruns of ``row`` of ``claims``: its records of ``seeds``, every seed if None)."""
    paths = record_paths(row, claims)
    if not paths:
        raise ConfigError(f"{claims}: row {row['id']} names no run files")
    root = repository_root(claims, paths)
    if root is None or (missing := [p for p in paths if not (root / p).is_file()]):
        raise _pending(row, paths if root is None else missing)
    reruns = [plan(root, p, out, extra, claims.resolve().parent) for p in paths]
    if unnamed := [r.record for r in reruns if not r.commands]:
        step = row.get("command")
        raise ConfigError(f"{unnamed[0]}: names no run (no 'base' config and 'overrides'), so fedrun reproduce "
                          "cannot rerun it on its own" + (f"; its row's command `{step}` makes it again, in place "
                                                           "of the committed file" if isinstance(step, str) else ""))
    if seeds is not None:
        reruns = [r for r in reruns if r.fields.get("seed") in seeds]
        if not reruns:
            raise ConfigError(f"--seeds {' '.join(map(str, seeds))}: row {row['id']} has no run of these seeds")
    return root, reruns


def compare(rerun: Rerun, root: Path, flatness_json: str | None) -> tuple[bool, str]:
    """(the same as the record, a line saying what was compared)."""
    want = rerun.fields
    if flatness_json is not None:
        got = json.loads(flatness_json)
        fields = [k for k in FLATNESS_FIELDS if k in want and k in got]
        differ = [f"{k} {want[k]} -> {got[k]}" for k in fields if want[k] != got[k]]
    else:
        rows = [json.loads(line) for line in (root / rerun.run_dir / "metrics.jsonl").read_text().splitlines()]
        got = {r["round"]: r["test_accuracy"] for r in rows if "test_accuracy" in r}
        recorded = dict(zip(want.get("eval_rounds", []), want.get("test_accuracy", []), strict=False))
        fields = [f"round {t}" for t in recorded if t in got]
        differ = [f"round {t}: {recorded[t]} -> {got[t]}" for t in recorded if t in got and recorded[t] != got[t]]
        if not fields:
            return True, f"{rerun.record}: no evaluation round in common with the record; nothing compared"
    what = "test accuracy at " + ", ".join(fields) if flatness_json is None else ", ".join(fields)
    if differ:
        return False, f"{rerun.record}: differs from the record: {'; '.join(differ)}"
    return True, f"{rerun.record}: the same as the record ({what})"


def rerun_all(root: Path, reruns: list[Rerun]) -> int:
    """Run every command from ``root``, then compare: 0 when every rerun equals its record, 1 when one differs,
    a failing command's own exit status (after one line naming it) when one fails."""
    same = 0
    for i, r in enumerate(reruns, 1):
        print(f"[{i}/{len(reruns)}] {r.record}", flush=True)
        captured = None
        for command in r.commands:
            flatness = command[0] == "flatness"
            proc = subprocess.run([sys.executable, "-m", "fedrun", *command], cwd=root, text=True,
                                  stdout=subprocess.PIPE if flatness else None)
            if proc.returncode != 0:
                report(f"fedrun reproduce: {r.record}: `{shlex.join(['python', '-m', 'fedrun', *command])}` "
                       f"ended with exit status {proc.returncode}")
                return proc.returncode
            captured = proc.stdout if flatness else None
        ok, line = compare(r, root, captured)
        same += ok
        print(line, flush=True)
    print(f"{same} of {len(reruns)} reruns the same as their records (the same bits need the same CPU kind and "
          "library versions: docs/results.md)")
    return EXIT_OK if same == len(reruns) else EXIT_FAILURE


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``fedrun reproduce`` (on fedrun.cli's subcommand parser)."""
    p.add_argument("claim", metavar="CLAIM_ID", help="a row's id, e.g. fig1a-faster-r25/P1/FedSUM-vs-FedAvg")
    p.add_argument("--seeds", nargs="+", metavar="S", help="only the runs of these seeds (default: every seed "
                                                           "of the row)")
    p.add_argument("--print", action="store_true", help="print the commands (from the repository root), run "
                                                        "nothing")
    p.add_argument("--claims", help=f"the claims file (default: {CLAIMS} of the working directory, else of the "
                                    "checkout holding fedrun)")
    p.add_argument("--out", default="runs/reproduce", help="where the reruns go, from the repository root "
                                                           "(default runs/reproduce)")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides added to every run, e.g. "
                                                "run.rounds=25 (up to the first evaluation)")


def reproduce(args: argparse.Namespace) -> int:
    """``fedrun reproduce``: exit 0 when every rerun equals its record (or with --print), 1 when one differs,
    a failed command's status; bad input raises :class:`ConfigError` (one line, exit 2)."""
    given = args.seeds or []
    overrides = [*args.overrides, *(v for v in given if "=" in v)]  # `--seeds 0 run.rounds=25`
    if bad := [v for v in given if "=" not in v and not v.isdigit()]:
        raise ConfigError(f"--seeds {' '.join(bad)}: expected integers >= 0")
    seeds = [int(v) for v in given if "=" not in v] if args.seeds else None
    claims = find_claims(args.claims)
    row = find_row(load_rows(claims), args.claim, claims)
    root, reruns = plan_row(row, claims, seeds, Path(args.out), overrides)
    if args.print:
        print(f"# {args.claim}: {len(reruns)} runs, from the repository root {root}")
        for r in reruns:
            print(f"# {r.record}\n{r.shell()}")
        return EXIT_OK
    return rerun_all(root, reruns)
