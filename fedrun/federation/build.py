"""Build a run once: everything a rank holds that no round changes (:class:`Setup`), and the initial
:class:`RunState`, which the rounds advance and a checkpoint saves.

Construction, in order (the order fixes the random streams, so it is part of the behaviour): the data
and its partition into N clients (an on-demand dataset comes as N clients, docs/scale.md), the client
blocks of the ranks, the algorithm's declaration, the placement and this rank's client data, the model
and x^(0) (``torch.manual_seed(run.seed)`` first), the test shard, the schedule, the client store (with
the rows the schedule holds uploads in) and the server state, the flat layouts and the first downlink
broadcast, and the local-training strategy. With ``data.client_test_fraction`` > 0 every client's test
examples are split off its partition first (its training examples are the rest).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedrun.algorithms import get_algorithm
from fedrun.algorithms.contract import CheckedAlgorithm
from fedrun.config import Config, StateConfig
from fedrun.data import open_dataset
from fedrun.data.builtin import least_squares_x0
from fedrun.data.client_block import ClientBlock
from fedrun.data.client_source import ArraySource, ClientSource
from fedrun.data.dataset import TaskData
from fedrun.data.partition import partition, split_client_tests
from fedrun.data.sizes import available_bytes, check_memory, model_bytes
from fedrun.errors import ConfigError
from fedrun.federation.blocks import BlockPlacement, Placement, WorkPlacement, assign_blocks, round_work
from fedrun.federation.client_eval import ClientEval
from fedrun.federation.client_trainer import ClientTrainer, Learner
from fedrun.federation.corruption import Corruption
from fedrun.federation.delay import DelayTracker
from fedrun.federation.evaluation import Evaluation
from fedrun.federation.exchange import Exchange, check_gathered_memory
from fedrun.federation.participation.registry import make_participation
from fedrun.federation.rounds import Round, RoundFacts
from fedrun.federation.run_state import RunState
from fedrun.federation.schedule import Schedule, make_schedule, schedule_type
from fedrun.models import build_model, uses_randomness
from fedrun.preflight import check_model_fits_data, parameter_count
from fedrun.privacy.mechanism import Privacy, RunShape
from fedrun.protocol import Declaration, Entry, Vector
from fedrun.runtime.world import World
from fedrun.state.choice import StorePlan, choose, disk_share
from fedrun.state.disk import DiskStore
from fedrun.state.rows import ClientRows
from fedrun.state.store import ClientStore, init_server
from fedrun.training.flat_model import FlatModel
from fedrun.training.local_strategy import local_strategy
from fedrun.training.losses import loss_for, loss_kernel
from fedrun.training.strategy import applicable_strategies, check_strategy, reproducible_strategy, time_strategies


@dataclass
class Setup:
    """What a rank holds for one run and no round changes: the round with its collaborators (``round``,
    :class:`~fedrun.federation.rounds.Round`), and the run's fixed facts the loop, its start-up lines and the
    checkpoint read: where the clients are (``placement``), the model (``learner``), the exchange."""

    cfg: Config
    world: World
    run_dir: Path | None
    dtype: torch.dtype
    num_clients: int  # N
    dim: int  # d
    placement: Placement
    learner: Learner
    decl: Declaration  # the algorithm's declaration
    exchange: Exchange
    round: Round
    strategy_timings: dict[str, float]
    strategy_reason: str  # why local.strategy resolved as it did (runtime.json)
    client_eval: ClientEval | None = None  # per-client evaluation (per-client test data: docs/evaluation.md)
    privacy: Privacy | None = None  # its budget, start-up lines and resume checks (also in round.transforms)
    store_choice: str = ""  # where the client state lives and why (the start-up line)
    loss_kernel: str = ""  # what computes the loss (runtime.json; fedrun.training.losses.loss_kernel)


def build(cfg: Config, world: World, run_dir: Path | None) -> tuple[Setup, RunState]:
    """Construct the run on this rank (collective: every rank calls it)."""
    dtype = torch.float64 if cfg.run.dtype == "float64" else torch.float32
    seed = cfg.run.seed
    check_memory(cfg)  # before anything is allocated
    source = client_data(cfg, seed, world.size)
    task = source.task
    num_clients = source.num_clients
    sizes = source.num_examples
    blocks = assign_blocks(sizes, world.size)
    # every rule's result is checked against the declaration, every round (fedrun.algorithms.contract)
    algorithm = CheckedAlgorithm(get_algorithm(cfg.algorithm.name)(cfg.algorithm.hparams), cfg.algorithm.name)
    decl = algorithm.declare()
    if "x" not in decl.down:
        raise ConfigError(f"algorithm.name={cfg.algorithm.name}: the algorithm's downlink must contain 'x'")
    if decl.gathered() and cfg.run.skip_nonfinite_clients:
        raise ConfigError(f"run.skip_nonfinite_clients: algorithm {cfg.algorithm.name} gathers its uploads "
                          f"({', '.join(sorted(decl.gathered()))}), whose rows a dropped client would leave "
                          "empty; expected false")
    corruption = None
    if cfg.corruption.kind != "none":
        corruption = Corruption(cfg.corruption, decl, cfg.algorithm.name, num_clients, seed)
    mode = _placement(cfg.run.placement, cfg.algorithm.name, decl, world, schedule_type(cfg))
    work = None
    if mode == "work":  # every rank can train every client: its block is all of them
        first, stop = 0, num_clients
        work = round_work(sizes, cfg.local.batch_size, cfg.local.steps, cfg.local.epochs)
    else:
        first, stop = blocks[world.rank]
    block = ClientBlock(source, first, stop, world.device, dtype)

    torch.manual_seed(seed)
    module = build_model(cfg.model.name, task.input_shape, task.num_classes, cfg.model.settings)
    model = FlatModel(module.to(device=world.device, dtype=dtype))
    x0 = model.initial_vector(dtype, world.device)
    ls_x0 = least_squares_x0(cfg.data)
    if ls_x0 is not None:
        x0 = torch.as_tensor(ls_x0, dtype=dtype, device=world.device)
    # this rank's share of the test set: whole batches of eval.batch_size (a batch is the same on any number of
    # ranks, and so is each example's loss: a convolution's output can depend on its batch)
    batch = cfg.eval.batch_size
    share = np.array_split(np.arange(-(-len(task.y_test) // batch)), world.size)[world.rank]
    test_rows = slice(int(share[0]) * batch, (int(share[-1]) + 1) * batch) if len(share) else slice(0, 0)

    schedule = make_schedule(cfg, num_clients, dtype, world.device)
    privacy = None
    if cfg.privacy.mode != "none":  # the pattern's fresh copy plans the rounds for a calibration of sigma
        shape = RunShape(cfg.algorithm.name, num_clients, cfg.run.rounds, seed, cfg.asynchrony.enabled)
        privacy = Privacy(cfg.privacy, shape, decl, schedule.participation,
                          None if cfg.asynchrony.enabled else
                          make_participation(cfg.participation, num_clients, seed, cfg.run.rounds), world)
    entries = (*decl.client, *schedule.held_entries(decl.up))
    directory = Path(cfg.state.dir).expanduser() if cfg.state.dir else (run_dir or Path(tempfile.gettempdir()))
    plan = _store_plan(entries, block.num_clients, x0, cfg.run.rounds * schedule.cohort)
    clients, store_choice = _client_store(cfg.state, world, directory, entries, x0, plan)
    server = init_server(decl.server, x0) if world.is_root else {}
    exchange = Exchange(decl, model.dim, world, dtype, cfg.run.skip_nonfinite_clients)
    exchange.publish(server)
    if exchange.gathered:
        check_gathered_memory(len(exchange.gathered), schedule.max_consumed(), model.dim, dtype, world,
                              f"algorithm.name={cfg.algorithm.name}")
    learner = Learner(model=model, random_model=uses_randomness(module), loss_fn=loss_for(task.task),
                      classification=task.task == "classification",
                      test_x=_to_device(task.x_test[test_rows], world.device, dtype),
                      test_y=_to_device(task.y_test[test_rows], world.device, dtype), num_test=len(task.y_test))
    name, timings, reason = _choose_strategy(cfg, world, learner, block, x0, schedule.cohort)
    strategy = local_strategy(name, learner.model, learner.loss_fn, world.device)  # built once; no round asks its name
    client_eval = ClientEval(cfg, world, source, blocks, learner, block) if source.test_examples is not None \
        else None
    placement = WorkPlacement(blocks, block, world.rank, world.size, work) if mode == "work" else \
        BlockPlacement(blocks, block, world.rank, world.size)
    transforms = [t for t in (corruption, privacy) if t is not None]  # applied in this order (upload_transform.py)
    trainer = ClientTrainer(algorithm=algorithm, decl=decl, learner=learner, block=block, local=cfg.local, seed=seed,
                            transforms=transforms)
    facts = RoundFacts(num_clients=num_clients, dim=model.dim, total_examples=float(sizes.sum()),
                       rounds=cfg.run.rounds, local_steps=cfg.local.steps,
                       skip_nonfinite=cfg.run.skip_nonfinite_clients)
    round_ = Round(trainer=trainer, exchange=exchange, evaluation=Evaluation(learner, world, cfg.eval, cfg.run.rounds,
                                                                             client_eval),
                   placement=placement, world=world, facts=facts, transforms=transforms)
    setup = Setup(cfg=cfg, world=world, run_dir=run_dir, dtype=dtype, num_clients=num_clients, dim=model.dim,
                  placement=placement, learner=learner, decl=decl, exchange=exchange, round=round_,
                  strategy_timings=timings, strategy_reason=reason, client_eval=client_eval, store_choice=store_choice,
                  privacy=privacy, loss_kernel=loss_kernel(task.task, dtype, task.num_classes, world.device))
    state = RunState(next_round=0, server=server, clients=clients, schedule=schedule,
                     delay=DelayTracker(num_clients), strategy=strategy,
                     privacy=None if privacy is None else privacy.state)
    return setup, state


def _store_plan(entries: tuple[Entry, ...], num_clients: int, x0: Tensor, touched_rows: int) -> StorePlan:
    """The client state of ``entries`` for ``num_clients`` rows of vectors like ``x0``, ``touched_rows`` of
    them written over the run (T times the cohort)."""
    vectors = [e for e in entries if isinstance(e, Vector)]
    return StorePlan(rows=num_clients, dim=x0.numel(), vectors=len(vectors), scalars=len(entries) - len(vectors),
                     itemsize=x0.element_size(), touched_rows=touched_rows)


def _client_store(section: StateConfig, world: World, directory: Path, entries: tuple[Entry, ...], x0: Tensor,
                  plan: StorePlan) -> tuple[ClientRows, str]:
    """The store ``state.store`` asks for (``auto``: :func:`fedrun.state.choice.choose`) in ``directory``
    (``state.dir``; default: the run directory, else the temporary directory), and where it keeps the state
    and why."""
    choice: tuple[str, str] | str = ""
    try:  # the ranks sharing a disk share its free space: rank 0 sums their rows per disk
        shares = world.allgather_object(disk_share(directory, plan.disk_bytes) if section.store != "memory"
                                        else None)
    except OSError as exc:  # the nearest existing parent of state.dir cannot be examined
        raise ConfigError(f"state.dir={directory}: {exc.strerror or exc}") from None
    if world.is_root:  # one choice for every rank (a checkpoint streams every rank's rows alike)
        try:
            choice = choose(section.store, plan, directory, available_bytes(),
                            None if None in shares else shares)
        except ConfigError as err:
            choice = str(err)
    choice = world.broadcast_object(choice)
    if isinstance(choice, str):
        raise ConfigError(choice)
    kind, why = choice
    if kind == "memory":
        return ClientStore(entries, plan.rows, x0), f"in memory ({why})"
    return DiskStore(entries, plan.rows, x0, directory, f"rank{world.rank}"), f"on disk ({why})"


def client_data(cfg: Config, seed: int, ranks: int = 1) -> ClientSource:
    """The run's clients: an on-demand source as it is, or an in-memory dataset loaded, checked against the
    model (its memory on ``ranks`` ranks first, then one example through it), partitioned into N clients
    and, with ``data.client_test_fraction`` > 0, split into per-client training and test examples."""
    data = open_dataset(cfg.data, seed)
    if isinstance(data, ClientSource):
        check_model_memory(cfg, data.task, data.num_clients, ranks)
        check_model_fits_data(cfg, data.task)
        return data
    task = data
    check_model_memory(cfg, task, cfg.data.num_clients, ranks)
    check_model_fits_data(cfg, task)  # one line naming model and shapes, before any allocation or timing
    parts = partition(task, cfg.data, seed)
    tests = None
    if cfg.data.client_test_fraction > 0:
        parts, tests = split_client_tests(task, parts, cfg.data, seed)
    return ArraySource(task, parts, tests)


def check_model_memory(cfg: Config, task: TaskData, num_clients: int, ranks: int) -> None:
    """Before the model is built: its size d (counted on the meta device) with the algorithm's entries and
    the client state of a rank's N / ranks clients, together with the data's planned bytes, against the
    memory available (:func:`fedrun.data.sizes.model_bytes`; one line naming the largest part)."""
    dim = parameter_count(cfg.model.name, task.input_shape, task.num_classes, cfg.model.settings)
    if dim is None:
        return
    decl = get_algorithm(cfg.algorithm.name)(cfg.algorithm.hparams).declare()

    def vectors(entries: Any) -> int:
        return sum(isinstance(e, Vector) for e in entries)

    counts = {"server": vectors(decl.server), "down": vectors(decl.down_entries()), "up": vectors(decl.up),
              "client": vectors(decl.client)}
    check_memory(cfg, extra=model_bytes(cfg, dim, 8 if cfg.run.dtype == "float64" else 4, counts,
                                        len(decl.client) - counts["client"], num_clients // ranks))


def _placement(requested: str, algorithm: str, decl: Declaration, world: World, schedule: type[Schedule]) -> str:
    """``run.placement`` (``requested``) resolved for ``algorithm`` (``algorithm.name``): ``work`` needs an
    algorithm without per-client state (that state lives on its owner rank) and a schedule that holds no
    uploads in client rows across steps (those live there too); ``auto`` takes it on CPU with more than one
    rank (on a GPU every rank would hold all clients' data)."""
    stateful, holds = bool(decl.client), bool(schedule.held_entries(decl.up))
    if requested == "work" and holds:
        raise ConfigError(f"run.placement=work: the {schedule.description} keeps in-flight uploads on the clients' "
                          "owner ranks; expected blocks or auto")
    if requested == "work" and stateful:
        names = ", ".join(e.name for e in decl.client)
        raise ConfigError(f"run.placement=work: algorithm {algorithm} keeps per-client state "
                          f"({names}) on its owner rank; expected blocks or auto")
    if requested == "auto":
        usable = not stateful and not holds and world.size > 1 and world.device.type == "cpu"
        return "work" if usable else "blocks"
    return requested


def _choose_strategy(cfg: Config, world: World, learner: Learner, block: ClientBlock, x0: Tensor,
                     cohort: int) -> tuple[str, dict[str, float], str]:
    """``local.strategy``: for ``auto`` the fastest exact strategy of the model on this device (by rule), for
    ``fastest`` the fastest on rank 0's timing (the same on every rank); and why (runtime.json)."""
    requested, model, random_model = cfg.local.strategy, learner.model, learner.random_model
    check_strategy(requested, model, block, random_model, cfg.model.name)
    if requested == "auto":
        strategy, reason = reproducible_strategy(model, block, cfg.model.name, world.device)
        return strategy, {}, f"auto on {world.device.type}: {reason}"
    if requested != "fastest":
        return requested, {}, f"local.strategy={requested} in the config"
    timings: dict[str, float] = {}
    if world.is_root:
        timings = time_strategies(model, learner.loss_fn, block, x0, cfg.local, -(-cohort // world.size), cfg.run.seed,
                                  applicable_strategies(model, block, random_model))
    timings = world.broadcast_object(timings)
    return min(timings, key=timings.get), timings, "local.strategy=fastest: the least time of the timed strategies"


def _to_device(array: np.ndarray, device: torch.device, dtype: torch.dtype) -> Tensor:
    """Floating arrays in the run's dtype, integer labels unchanged."""
    t = torch.from_numpy(np.ascontiguousarray(array))
    return (t.to(dtype) if t.is_floating_point() else t).to(device)
