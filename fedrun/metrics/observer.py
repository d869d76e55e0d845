"""What watches a run's rounds: the :class:`Observer` hooks, and :class:`Observers`, the list the loop calls.

The round loop (:func:`fedrun.federation.loop.train`) owns the rounds and the checkpoints; everything else
a round produces goes to its observers, called on every rank in the list's order:

    on_start(provenance)          once, before the first round this process runs
    on_round_end(record, arrays)  after each round, before its checkpoint; a true answer stops the run
                                  after this round (the checkpoint is written first)
    on_stop(finished)             once, when the rounds end: all done, stopped, or an exception

``record`` is the round's metrics record (a metrics.jsonl line; complete on rank 0), ``arrays`` an
evaluation's per-client arrays (or None). The sinks of rank 0 (metrics.jsonl, clients.h5, TensorBoard,
MLflow, the progress line) are observers built in the module that owns each; on the other ranks they are
built without a run directory and do nothing. The list's order is the order of the writes: metrics.jsonl
holds a round before any other sink sees it, and the user's callback (:class:`UserCallback`) comes last,
so a run it stops has already recorded the round everywhere.

A user's own sinks are observers too: ``metrics.observers`` names classes (``package.module:Class``, loaded by
:func:`observer_types` before the run starts) and ``fedrun.run(observers=[...])`` takes instances; both come
after the built-in sinks and before the progress line and the callback (docs/extending.md, "A metrics sink").
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedrun.plugins import call, load

if TYPE_CHECKING:
    from fedrun.runtime.world import World

Arrays = dict[str, np.ndarray] | None  # an evaluation's per-client arrays, by name
RoundCallback = Callable[[dict[str, Any]], Any]  # a round's record -> true to stop the run


class Observer:
    """The hooks, each a no-op here: an observer overrides the ones it needs."""

    def on_start(self, provenance: dict[str, Any]) -> None:
        """Before the first round this process runs; ``provenance``: runtime.json's record (rank 0; {} elsewhere)."""

    def on_round_end(self, record: dict[str, Any], arrays: Arrays) -> bool | None:
        """After a round; true: stop the run after it."""
        return None

    def on_stop(self, finished: bool) -> None:
        """When the rounds end; ``finished``: all of ``run.rounds`` are done."""


class Observers(Observer):
    """The observers of a run, called in order (None entries are left out: a sink this rank does not have)."""

    def __init__(self, *observers: Observer | None) -> None:
        self.observers = [o for o in observers if o is not None]

    def on_start(self, provenance: dict[str, Any]) -> None:
        for observer in self.observers:
            observer.on_start(provenance)

    def on_round_end(self, record: dict[str, Any], arrays: Arrays) -> bool:
        """Every observer sees the round; the run stops if any of them asks it to."""
        stop = False
        for observer in self.observers:
            stop = bool(observer.on_round_end(record, arrays)) or stop
        return stop

    def on_stop(self, finished: bool) -> None:
        for observer in self.observers:
            observer.on_stop(finished)


EXPECTED = "a subclass of fedrun.metrics.observer.Observer, constructed as Class(run_dir)"


def observer_types(paths: list[str]) -> list[type[Observer]]:
    """The classes ``metrics.observers`` names, imported and checked (one ConfigError line naming the field
    otherwise), so that a sink that cannot be used refuses the run before anything is written."""
    def accept(obj: Any) -> bool:
        return isinstance(obj, type) and issubclass(obj, Observer)

    return [load(path, "metrics.observers", EXPECTED, accept) for path in paths]


def plugin_observers(paths: list[str], types: list[type[Observer]], run_dir: Path | None) -> list[Observer]:
    """One instance of each class of ``metrics.observers`` (``paths``: their names, for messages), on every
    rank: ``Class(run_dir)`` with rank 0's run directory, None elsewhere and when the run writes no files."""
    return [call("metrics.observers", path, EXPECTED, cls, run_dir) for path, cls in zip(paths, types, strict=True)]


class UserCallback(Observer):
    """``callback(record)`` of ``fedrun.run``: asked on rank 0 with a copy of the round's record; its answer
    (true: stop) is broadcast, so that every rank stops after the same round. Every rank must have one."""

    def __init__(self, callback: RoundCallback, world: World) -> None:
        self.callback, self.world = callback, world

    def on_round_end(self, record: dict[str, Any], arrays: Arrays) -> bool:
        return self.world.broadcast_object(bool(self.callback(dict(record))) if self.world.is_root else None)
