"""Submit a sweep as one submitit job array; every element is one multi-rank fedrun run.

How one run executes on Slurm: the array element's batch script (submitit, ``use_srun=False``) runs
:class:`FedrunTask` once; it starts the ranks with ``srun --ntasks=R --mpi=none ...`` inside the
allocation (``sbatch --ntasks=R``), so fedrun takes its R ranks from Slurm (``resources.mpi`` chooses
an MPI plugin instead), and waits for them.

Timeout and preemption: sbatch gets ``--signal=USR1@signal_delay_s``, so Slurm sends SIGUSR1 to the
ranks' job step before the time limit; fedrun checkpoints and exits 75. FedrunTask sees 75 and raises
submitit's preemption signal in its own process, so submitit calls :meth:`FedrunTask.checkpoint`
(which waits for the ranks if they are still writing) and requeues the array element with
``scontrol requeue``. Every start runs ``--resume auto``, so the requeued job continues from the
newest checkpoint of its run directory. Preemption with SIGTERM (Slurm's PreemptMode=REQUEUE) goes
the same way: fedrun checkpoints and exits, Slurm requeues, the next start resumes.

Submitting the same sweep again skips runs with a ``result.json``, skips runs whose job is still
queued or running, and submits the others, which resume from their checkpoints.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import yaml

# Slurm's warning signal must be one fedrun handles (SIGUSR1; submitit's default USR2 would kill the
# ranks): set it before submitit is imported here and in the job (sbatch exports this environment).
os.environ.setdefault("SUBMITIT_PREEMPT_SIGNAL", "USR1")
import submitit  # noqa: E402
from submitit.core.job_environment import JobEnvironment  # noqa: E402

from fedrun.errors import EXIT_BAD_INPUT, SweepError, SweepTaskError  # noqa: E402
from fedrun.sweep.spec import RunSpec, SweepSpec, load_sweep  # noqa: E402
from fedrun.sweep.validate import validate_runs  # noqa: E402

JobEnvironment.USR_SIG = os.environ["SUBMITIT_PREEMPT_SIGNAL"]  # in case submitit was imported first

# srun --wait: once one rank has exited, the others get this long to exit too before srun ends them
STEP_WAIT_S = 30
REQUEUE_EXIT = 75  # fedrun train: stopped by SIGTERM/SIGUSR1 after writing a checkpoint
ALIVE_STATES = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING",
                "COMPLETING", "RESIZING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT"}


class FedrunTask(submitit.helpers.Checkpointable):
    """One run: ``program --config CONFIG --resume auto OVERRIDES``, on ``tasks`` ranks.

    Inside a Slurm allocation the ranks are started with srun (``--mpi=<mpi>``); elsewhere with the
    mpiexec next to this interpreter (or on PATH) when ``tasks > 1``, else directly. Returns the
    run's result.json as a dict. Picklable; the live child process is not part of its state.
    """

    def __init__(self, program: list[str], config: str | None, run_dir: str, overrides: list[str],
                 tasks: int = 1, cpus_per_task: int = 1, gpus_per_task: int = 0, mpi: str = "none",
                 stop_timeout_s: float = 60.0, nodes: int = 1, slots: tuple[str, int] | None = None) -> None:
        self.program = list(program)
        self.config = config
        self.run_dir = str(run_dir)
        self.overrides = list(overrides)
        self.tasks = tasks
        self.nodes = nodes
        self.cpus_per_task = cpus_per_task
        self.gpus_per_task = gpus_per_task
        self.mpi = mpi
        self.stop_timeout_s = stop_timeout_s
        self.slots = slots  # (directory, count): run only while holding one of count slot locks there
        self._proc: subprocess.Popen | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_proc"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("nodes", 1)  # pickled by an earlier version
        state.setdefault("slots", None)
        self.__dict__.update(state)

    def train_args(self) -> list[str]:
        config = ["--config", self.config] if self.config else []
        return [*self.program, *config, "--resume", "auto", *self.overrides]

    def command(self, env: dict[str, str] | None = None) -> list[str]:
        env = os.environ if env is None else env
        if "SLURM_JOB_ID" in env and shutil.which("srun"):
            # as launch/srun.sh: --kill-on-bad-exit=0 --wait=30, so that ranks stopping on a signal all
            # exit 75 (with =1, srun kills the ranks of the other nodes while they exit, and returns 143)
            launcher = ["srun", f"--ntasks={self.tasks}", f"--mpi={self.mpi}", "--kill-on-bad-exit=0",
                        f"--wait={STEP_WAIT_S}", f"--cpus-per-task={self.cpus_per_task}"]
            if self.nodes > 1:
                launcher.insert(1, f"--nodes={self.nodes}")
            if self.gpus_per_task:
                launcher.append(f"--gpus-per-task={self.gpus_per_task}")
            return [*launcher, *self.train_args()]
        if self.tasks > 1:
            return [find_mpiexec(), "-n", str(self.tasks), *self.train_args()]
        return self.train_args()

    def __call__(self) -> dict[str, Any]:
        result = Path(self.run_dir) / "result.json"
        if result.is_file():  # finished by an earlier start
            return json.loads(result.read_text())
        slot = hold_slot(*self.slots) if self.slots else None  # noqa: F841 - held until this call returns
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", str(self.cpus_per_task))
        cmd = self.command(env)
        if "SLURM_JOB_NODELIST" in env:
            print(f"fedrun sweep: job {env.get('SLURM_JOB_ID')} on nodes {env['SLURM_JOB_NODELIST']}", flush=True)
        print("fedrun sweep: " + " ".join(cmd), flush=True)
        self._proc = subprocess.Popen(cmd, env=env)
        while (rc := self._proc.poll()) is None:
            time.sleep(0.2)
        self._proc = None
        if rc == REQUEUE_EXIT:
            # the ranks checkpointed on a signal: let submitit checkpoint this task and requeue the job
            print(f"fedrun sweep: ranks exited {rc} after a checkpoint: requeueing", flush=True)
            os.kill(os.getpid(), getattr(signal, "SIG" + JobEnvironment.USR_SIG))
            time.sleep(1.0)  # the handler runs here and exits the process when it requeues
            raise RuntimeError(f"{self.run_dir}: fedrun stopped (exit {rc}) and the job was not requeued")
        if rc != 0:
            raise RuntimeError(f"{self.run_dir}: {' '.join(cmd[:3])} ... exited with status {rc}")
        if not result.is_file():
            raise RuntimeError(f"{self.run_dir}: fedrun exited 0 but wrote no result.json")
        return json.loads(result.read_text())

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        """Called by submitit on timeout/preemption: stop the ranks (they checkpoint), requeue as is."""
        proc = self._proc
        if proc is not None and proc.pid:
            try:
                proc.send_signal(signal.SIGUSR1)  # srun and mpiexec forward it to the ranks
            except ProcessLookupError:
                pass
            deadline = time.time() + self.stop_timeout_s
            while time.time() < deadline and not _exited(proc):
                time.sleep(0.2)
        self._proc = None
        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


def hold_slot(directory: str, count: int) -> IO[str]:
    """Wait for one of ``count`` slot files in ``directory`` to be free and lock it (released when the
    returned file is closed or the process ends): local array tasks all start at once, so this is how at
    most ``resources.array_parallelism`` of them run fedrun at a time, as a Slurm job array would."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    while True:
        for i in range(count):
            fh = open(Path(directory) / f"slot_{i}", "a")  # noqa: SIM115 - held while the run runs
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fh
            except OSError:
                fh.close()
        time.sleep(0.2)


def _exited(proc: subprocess.Popen) -> bool:
    """Whether ``proc`` has exited; safe in a signal handler interrupting ``proc.poll()``."""
    if proc.poll() is not None:
        return True
    try:
        with open(f"/proc/{proc.pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def find_mpiexec() -> str:
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if not found:
        raise RuntimeError("tasks > 1 outside Slurm needs mpiexec (pip install mpich)")
    return found


# --------------------------------------------------------------------------------------------- status


def job_state(job_id: str) -> str | None:
    """Slurm state of a job (``123`` or ``123_4``) from squeue, or None when Slurm does not know it."""
    if not shutil.which("squeue"):
        return None
    # squeue -j understands array elements that have not started yet (shown as 123_[4-7])
    out = subprocess.run(["squeue", "--states=all", "--noheader", "--format=%T", f"--jobs={job_id}"],
                         capture_output=True, text=True, timeout=60)
    states = out.stdout.split()
    return states[0] if out.returncode == 0 and states else None


def run_status(run: RunSpec) -> str:
    """``done`` (result.json), ``queued`` (its last job is alive), ``partial`` (checkpoints), ``new``."""
    if (run.dir / "result.json").is_file():
        return "done"
    job_file = run.dir / "job.json"
    if job_file.is_file():
        info = json.loads(job_file.read_text())
        if info.get("executor") == "slurm" and job_state(str(info.get("job_id"))) in ALIVE_STATES:
            return "queued"
    if any(run.dir.glob("ckpt_*.h5")):
        return "partial"
    return "new"


# --------------------------------------------------------------------------------------------- submit


def make_executor(spec: SweepSpec, kind: str) -> submitit.Executor:
    r = spec.resources
    folder = spec.root / ".submitit" / "%j"
    repo_root = str(Path(__file__).resolve().parents[2])
    if kind == "slurm":
        executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=r.max_requeues)
        params: dict[str, Any] = dict(
            job_name=f"fedrun-{spec.name}", time=r.time_min,
            cpus_per_task=r.cpus_per_task, signal_delay_s=r.signal_delay_s,
            array_parallelism=r.array_parallelism, use_srun=False,
            # the job imports fedrun.sweep.submit to unpickle FedrunTask: works without pip install too
            setup=[f"export PYTHONPATH={repo_root}${{PYTHONPATH:+:$PYTHONPATH}}"],
        )
        if r.partition:
            params["partition"] = r.partition
        if r.gpus_per_task:
            params["gpus_per_task"] = r.gpus_per_task
        if r.mem_gb:
            params["mem"] = f"{r.mem_gb}GB" if float(r.mem_gb).is_integer() else f"{int(r.mem_gb * 1024)}MB"
        # --ntasks and --nodes, not submitit's ntasks_per_node and nodes: submitit would expect one result
        # per task (per node), while the ranks are started by FedrunTask's own srun and submitit runs one
        # process per job (these replace submitit's own --nodes=1 line)
        params["additional_parameters"] = {"ntasks": r.tasks, "nodes": r.nodes, **r.extra}
        executor.update_parameters(**params)
        return executor
    if kind == "local":
        # one process per run, which starts its own ranks with mpiexec
        executor = submitit.LocalExecutor(folder=folder, max_num_timeout=r.max_requeues)
        executor.update_parameters(timeout_min=r.time_min, tasks_per_node=1, nodes=1,
                                   cpus_per_task=r.cpus_per_task * r.tasks)
        os.environ.setdefault("PYTHONPATH", repo_root)
        return executor
    raise SweepError(f"executor: expected slurm or local, got {kind!r}")


def base_config_path(spec: SweepSpec) -> str | None:
    if spec.base is not None:
        return str(spec.base.resolve())
    if spec.config is not None:
        path = spec.root / "base_config.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(spec.config, sort_keys=False))
        return str(path.resolve())
    return None


def write_manifest(spec: SweepSpec, runs: list[RunSpec]) -> None:
    spec.root.mkdir(parents=True, exist_ok=True)
    manifest = {
        "name": spec.name, "seed_key": spec.seed_key, "grid": spec.grid, "source": str(spec.source),
        "runs": [{"name": r.name, "point": r.point, "overrides": r.overrides} for r in runs],
    }
    (spec.root / "sweep.json").write_text(json.dumps(manifest, indent=1, default=str) + "\n")
    for r in runs:
        r.dir.mkdir(parents=True, exist_ok=True)
        (r.dir / "sweep_point.json").write_text(json.dumps({"name": r.name, "point": r.point}, default=str))


def submit_sweep(spec: SweepSpec, executor: str = "slurm", dry_run: bool = False,
                 out=print, validate: bool = True, progress=None) -> list[tuple[RunSpec, Any]]:
    """Submit the runs of ``spec`` that are not done or queued; returns ``[(run, submitit job)]``.

    Before anything is written or queued, every run to submit is validated as ``fedrun train`` would
    (config, then model/data fit; :mod:`fedrun.sweep.validate`): any bad run raises
    :class:`SweepTaskError` with one line per bad run, and nothing is submitted.
    ``dry_run`` validates the same way, prints one line per run (status, directory, overrides) and
    submits nothing. ``progress(line)`` (default: stderr) is told what the validation checks, as it goes
    (each model/data check loads a dataset: a sweep can take a minute before anything is submitted).
    """
    spec.root = spec.root.resolve()
    runs = spec.runs()
    status = {run.name: (run_status(run) if run.dir.exists() else "new") for run in runs}
    todo = [run for run in runs if status[run.name] not in ("done", "queued")]
    if validate and todo:
        started = time.monotonic()
        progress = progress or (lambda line: print(line, file=sys.stderr, flush=True))
        progress(f"fedrun sweep: checking {len(todo)} run(s) before submitting (config, then model and data)")
        problems = validate_runs(spec, todo, progress)  # index i in todo = array index i of the submission
        progress(f"fedrun sweep: checked {len(todo)} run(s) in {time.monotonic() - started:.1f} s")
        if problems:
            raise SweepTaskError(problems)
    if dry_run:
        for run in runs:
            out(f"{status[run.name]:8s} {run.dir}  {' '.join(run.overrides[:-1])}")
        out(f"{len(runs)} runs in {spec.root}" + (f"; all {len(todo)} to submit are valid" if validate and todo
                                                     else ""))
        return []
    write_manifest(spec, runs)
    skipped: dict[str, int] = {}
    for run in runs:
        if status[run.name] in ("done", "queued"):
            skipped[status[run.name]] = skipped.get(status[run.name], 0) + 1
    if not todo:
        out(f"nothing to submit: {_counted(skipped)} ({spec.root})")
        return []
    config = base_config_path(spec)
    r = spec.resources
    slots = (str(spec.root / ".submitit" / "slots"), r.array_parallelism) if executor == "local" else None
    tasks = [FedrunTask(spec.program(), config, str(run.dir), run.overrides, tasks=r.tasks,
                        cpus_per_task=r.cpus_per_task, gpus_per_task=r.gpus_per_task, mpi=r.mpi,
                        stop_timeout_s=max(10.0, r.signal_delay_s - 10.0), nodes=r.nodes, slots=slots)
             for run in todo]
    ex = make_executor(spec, executor)
    jobs = []
    with ex.batch():
        for task in tasks:
            jobs.append(ex.submit(task))
    for index, (run, job) in enumerate(zip(todo, jobs, strict=True)):
        (run.dir / "job.json").write_text(json.dumps(
            {"job_id": job.job_id, "executor": executor, "array_index": index, "submitted": time.time(),
             "logs": str(job.paths.stdout), "errors": str(job.paths.stderr)}) + "\n")
    resumed = sum(status[run.name] == "partial" for run in todo)
    out(f"submitted {len(jobs)} runs ({resumed} resuming) as {executor} job {jobs[0].job_id.split('_')[0]}"
        f"; skipped {_counted(skipped)}; sweep dir {spec.root}")
    return list(zip(todo, jobs, strict=True))


def _counted(counts: dict[str, int]) -> str:
    """``2 done, 1 queued`` (``none`` when empty)."""
    return ", ".join(f"{n} {what}" for what, n in sorted(counts.items())) or "none"


# ----------------------------------------------------------------------------------------------- wait

_ERROR_LINE = re.compile(r"fedrun(\[rank \d+\])?: error: ")
RUNNING_STATES = {"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING"}


def task_progress(jobs: list[tuple[RunSpec, Any]]) -> tuple[dict[str, int], list[int]]:
    """Counts of pending, running, done and failed tasks, and the array indices of the failed ones."""
    counts = {"pending": 0, "running": 0, "done": 0, "failed": 0}
    failed = []
    for index, (_, job) in enumerate(jobs):
        if job.done():
            if job.exception() is None:
                counts["done"] += 1
            else:
                counts["failed"] += 1
                failed.append(index)
        elif str(job.state).upper() in RUNNING_STATES:
            counts["running"] += 1
        else:
            counts["pending"] += 1
    return counts, failed


def error_line(job: Any) -> tuple[str, str]:
    """``(line, log path)``: the last line of the task's logs that states its error.

    fedrun's own one-line errors (``fedrun: error: ...``, ``fedrun[rank N]: error: ...``) come first,
    from the .err log (the ranks' stderr) and then the .out log; else the last exception line of a
    traceback; else the last line of the .err log.
    """
    logs = [Path(str(p)) for p in (job.paths.stderr, job.paths.stdout)]
    texts = {p: (p.read_text(errors="replace").splitlines() if p.is_file() else []) for p in logs}
    for path in logs:
        for line in reversed(texts[path]):
            if _ERROR_LINE.search(line):
                return line.strip(), str(path)
    for path in logs:
        for line in reversed(texts[path]):
            if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupted)\b", line.strip()):
                return line.strip(), str(path)
    for path in logs:
        lines = [line for line in texts[path] if line.strip()]
        if lines:
            return lines[-1].strip(), str(path)
    return "(no log written)", str(logs[0])


WAIT_POLL_S = 5.0  # how often --wait asks Slurm (through submitit) for the tasks' states


def wait_sweep(jobs: list[tuple[RunSpec, Any]], out=print, err=None, poll_s: float | None = None) -> int:
    """Wait for every task, printing ``N tasks: P pending, R running, D done, F failed`` whenever the
    counts change; then one line per failed task with the log line holding its error. Returns the
    number of failed tasks."""
    err = err or (lambda s: print(s, file=sys.stderr, flush=True))
    last = None
    while True:
        counts, failed = task_progress(jobs)
        line = (f"fedrun sweep: {len(jobs)} tasks: {counts['pending']} pending, {counts['running']} running, "
                f"{counts['done']} done, {counts['failed']} failed")
        if line != last:
            out(line)
            last = line
        if counts["pending"] + counts["running"] == 0:
            break
        time.sleep(WAIT_POLL_S if poll_s is None else poll_s)
    for index in failed:
        run, job = jobs[index]
        text, path = error_line(job)
        err(f"fedrun sweep: array index {index} ({run.name}, job {job.job_id}) failed: {text}  [{path}]")
    return len(failed)


def sweep_main(argv: list[str]) -> int:
    """``fedrun sweep SWEEP.yaml [--dry-run] [--executor slurm|local] [--root DIR] [--wait]``."""
    parser = argparse.ArgumentParser(prog="fedrun sweep", description="Submit a sweep of fedrun runs.")
    parser.add_argument("sweep", help="sweep file (YAML)")
    parser.add_argument("--dry-run", action="store_true", help="print the expanded grid, submit nothing")
    parser.add_argument("--executor", choices=["slurm", "local"], default=None,
                        help="default: slurm when sbatch is on PATH, else local")
    parser.add_argument("--root", default=None, help="sweep directory (overrides the file's root)")
    parser.add_argument("--wait", action="store_true", help="wait for every job; exit 1 if one failed")
    args = parser.parse_args(argv)
    try:
        spec = load_sweep(args.sweep, root=args.root)
        kind = args.executor or ("slurm" if shutil.which("sbatch") else "local")
        submitted = submit_sweep(spec, executor=kind, dry_run=args.dry_run)
    except SweepTaskError as exc:
        for line in exc.lines:
            print(f"fedrun sweep: {line}", file=sys.stderr)
        print(f"fedrun sweep: {len(exc.lines)} invalid task(s); nothing submitted", file=sys.stderr)
        return EXIT_BAD_INPUT
    except SweepError as exc:
        print(f"fedrun sweep: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        print(f"fedrun sweep: {exc}", file=sys.stderr)
        return 1
    if args.wait and submitted:
        return 1 if wait_sweep(submitted) else 0
    return 0
