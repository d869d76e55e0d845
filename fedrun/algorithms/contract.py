"""Every rule held to its declaration, every round: what a rule returns has the declared entries, shapes and
dtype, or the run stops with one line before anything is stored or checkpointed.

A rule that breaks its declaration does not fail by itself: a ``server_update`` returning ``x`` as
``[1, d]`` instead of ``[d]`` broadcasts and trains on (the flat buffer does not care), and only its
checkpoints fail ``inspect`` later; a float16 ``x`` runs on with the model rounded every round. So
:class:`CheckedAlgorithm` wraps the algorithm the run uses (built-in or plugin alike) and compares each
result with the declaration (:class:`~fedrun.protocol.Declaration`):

* ``local_plan``: ``start`` (and ``correction``) ``[C, d]``;
* ``client_finish``: the uploads, exactly the declared ``up`` entries; the new client state, declared
  ``client`` entries only; ``[C, d]`` for a Vector, ``[C]`` for a Scalar;
* ``server_update``: exactly the declared ``server`` entries, ``[d]`` or ``[]``;
* ``after_round``: declared ``client`` entries only, ``[C_block, d]`` or ``[C_block]``;

every tensor in the run's dtype (the dtype of the downlink's ``x``). A rule that reads an entry it was
not given (``up["delta_typo"]``) gets its own line too, instead of a bare ``KeyError: 'delta_typo'``.
The check looks at shapes and dtypes only: a few comparisons per entry per round, never the values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

from fedrun.algorithms.base import Algorithm
from fedrun.errors import RuleContractError, brief
from fedrun.protocol import Clients, Declaration, LocalPlan, LocalResult, RoundContext, Vector


class CheckedAlgorithm(Algorithm):
    """``algorithm`` with every rule's result checked against its declaration (module docstring);
    ``label`` names it in messages (``algorithm.name=package.module:Class``)."""

    def __init__(self, algorithm: Algorithm, label: str) -> None:
        super().__init__(algorithm.hp)
        self.inner, self.label = algorithm, label
        self.name = getattr(algorithm, "name", label)
        self.Hparams = type(algorithm).Hparams
        self.decl: Declaration = algorithm.declare()

    def declare(self) -> Declaration:
        return self.decl

    def local_plan(self, down: dict[str, Tensor], state: dict[str, Tensor], clients: Clients,
                   ctx: RoundContext) -> LocalPlan:
        plan = self._call("local_plan", self.inner.local_plan, down, state, clients, ctx)
        if not isinstance(plan, LocalPlan):
            self._fail("local_plan", f"returned {type(plan).__name__}; expected a LocalPlan")
        rows, dtype = len(clients.ids), down["x"].dtype
        for name in ("start", "correction"):
            value = getattr(plan, name)
            if value is not None:
                self._check_tensor("local_plan", f"LocalPlan.{name}", value, (rows, ctx.dim), dtype)
        return plan

    def client_finish(self, down: dict[str, Tensor], state: dict[str, Tensor], local: LocalResult,
                      clients: Clients, ctx: RoundContext) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        out = self._call("client_finish", self.inner.client_finish, down, state, local, clients, ctx)
        if not (isinstance(out, tuple) and len(out) == 2 and all(isinstance(o, dict) for o in out)):
            self._fail("client_finish", f"returned {brief(out)}; expected (uploads, new client state), two dicts")
        up, new_state = out
        rows = len(clients.ids)
        self._check_entries("client_finish", "upload", up, down["x"], (rows,))
        self._check_entries("client_finish", "client state", new_state, down["x"], (rows,), passed=state)
        return up, new_state

    def server_update(self, server: dict[str, Tensor], up: dict[str, Tensor],
                      ctx: RoundContext) -> dict[str, Tensor]:
        new = self._call("server_update", self.inner.server_update, server, up, ctx)
        if not isinstance(new, dict):
            self._fail("server_update", f"returned {type(new).__name__}; expected a dict of server entries")
        self._check_entries("server_update", "server", new, server["x"], ())
        return new

    def defines(self, rule: str) -> bool:
        return self.inner.defines(rule)

    def active_update(self, down_next: dict[str, Tensor], state: dict[str, Tensor],
                      ctx: RoundContext) -> dict[str, Tensor]:
        new = self._call("active_update", self.inner.active_update, down_next, state, ctx)
        if not isinstance(new, dict):
            self._fail("active_update", f"returned {type(new).__name__}; expected a dict of client entries")
        rows = len(next(iter(state.values()))) if state else 0
        self._check_entries("active_update", "client state", new, down_next["x"], (rows,), passed=state)
        return new

    def after_round(self, down_next: dict[str, Tensor], state: dict[str, Tensor], active: Tensor,
                    ctx: RoundContext) -> dict[str, Tensor]:
        new = self._call("after_round", self.inner.after_round, down_next, state, active, ctx)
        if not isinstance(new, dict):
            self._fail("after_round", f"returned {type(new).__name__}; expected a dict of client entries")
        self._check_entries("after_round", "client state", new, down_next["x"], (len(active),), passed=state)
        return new

    # ------------------------------------------------------------------------------------------ checks

    def _call(self, rule: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except KeyError as exc:  # a rule reading an entry it was not given
            key = exc.args[0] if exc.args else "?"
            given = sorted({k for a in args if isinstance(a, dict) for k in a})
            self._fail(rule, f"read entry {brief(key)}, which it was not given (its inputs hold: "
                             f"{', '.join(given) or 'nothing'}); expected a declared entry")

    def _check_entries(self, rule: str, kind: str, values: dict[str, Any], x: Tensor, rows: tuple[int, ...],
                       passed: dict[str, Any] | None = None) -> None:
        """``values`` hold the entries the declaration lists for ``kind`` (``upload``, ``server`` or ``client
        state``), each ``[*rows, d]`` or ``rows`` in the dtype of the model ``x`` (d = its size). A rule that
        was handed no state (``passed`` None) returns every one of them; the entries of ``passed`` (the
        runtime's own rows a rule was handed) may be left out or come back as they were."""
        entries = {"upload": self.decl.up, "server": self.decl.server, "client state": self.decl.client}[kind]
        dim, dtype, complete, passed = x.shape[-1], x.dtype, passed is None, passed or {}
        values = {k: v for k, v in values.items() if not (k in passed and v is passed[k])}
        declared = {e.name: e for e in entries}
        extra = sorted(map(str, set(values) - set(declared)))
        if extra:
            self._fail(rule, f"returned {kind} entry {brief(extra[0])}, which is not declared; expected only "
                             f"{', '.join(declared) or 'no entries'}")
        if complete:
            missing = [name for name in declared if name not in values]
            if missing:
                self._fail(rule, f"did not return {kind} entry {missing[0]!r}; expected every declared "
                                 f"entry ({', '.join(declared)}), got {', '.join(map(str, values)) or 'none'}")
        for name, value in values.items():
            shape = (*rows, dim) if isinstance(declared[name], Vector) else rows
            self._check_tensor(rule, f"{kind} entry {name!r}", value, shape, dtype)

    def _check_tensor(self, rule: str, what: str, value: Any, shape: tuple[int, ...], dtype: Any) -> None:
        if not isinstance(value, Tensor):
            self._fail(rule, f"{what} is {type(value).__name__}; expected a tensor of shape {list(shape)}")
        if tuple(value.shape) != shape or value.dtype != dtype:
            got = f"{list(value.shape)} {str(value.dtype).removeprefix('torch.')}"
            self._fail(rule, f"{what} has shape and dtype {got}; expected {list(shape)} "
                             f"{str(dtype).removeprefix('torch.')}")

    def _fail(self, rule: str, problem: str) -> None:
        raise RuleContractError(f"algorithm.name={self.label}: rule {rule}: {problem} (as declared by "
                                "declare())")
