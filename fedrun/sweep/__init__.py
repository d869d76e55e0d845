"""Sweeps on a cluster: expand a grid of overrides, submit it as a Slurm job array, report on it.

    python -m fedrun sweep SWEEP.yaml [--dry-run] [--executor slurm|local]
    python -m fedrun report SWEEP_DIR

``spec`` reads sweep files and expands grids (no Slurm, no submitit); ``submit`` turns the runs into a
submitit job array of multi-rank jobs that requeue on timeout/preemption; ``report`` tabulates and plots
a finished (or partly finished) sweep directory. The two entry points import their module lazily, so
``fedrun report`` needs neither submitit nor Slurm.
"""

from __future__ import annotations

from fedrun.sweep.spec import RunSpec, SweepSpec, load_sweep


def sweep_main(argv: list[str]) -> int:
    """``fedrun sweep SWEEP.yaml [--dry-run] [--executor slurm|local] [--root DIR] [--wait]``."""
    from fedrun.sweep.submit import sweep_main as main

    return main(argv)


def report_main(argv: list[str]) -> int:
    """``fedrun report SWEEP_DIR [--out DIR]``: table (CSV, markdown) and PNG curves of a sweep."""
    from fedrun.sweep.report import report_main as main

    return main(argv)


__all__ = ["RunSpec", "SweepSpec", "load_sweep", "report_main", "sweep_main"]
