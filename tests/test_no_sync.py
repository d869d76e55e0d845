"""No host-device synchronization inside a client's local steps (fedrun.training.local.run_local).

On a GPU a read of a tensor by the host (``.item()``, ``float()``, ``bool()``, ``.cpu()``, ``.tolist()``,
``.numpy()``, boolean-mask indexing, ``nonzero``) waits for every queued kernel, so the host stops queueing
the next steps. No GPU is needed to find such reads: :class:`HostReads` counts them on a CPU, the aten ops
that read a value back (seen by a TorchDispatchMode, also under vmap and autograd) and the Python-level
conversions (which dispatch nothing), while real runs train with ``sequential`` and ``batched``.
"""

from __future__ import annotations

from collections import Counter
from contextlib import ExitStack

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import fedrun
from fedrun.training import local_strategy

# aten ops whose CUDA kernels copy a value to the host (or size an output by data the host must read)
READING_OPS = {"aten._local_scalar_dense.default", "aten.is_nonzero.default", "aten.nonzero.default",
               "aten.masked_select.default", "aten.unique_consecutive.default", "aten._unique2.default",
               "aten.repeat_interleave.Tensor", "aten.equal.default"}
# conversions done in Python, without an aten op
PY_READS = ("item", "tolist", "cpu", "numpy", "__array__", "__bool__", "__float__", "__int__", "__index__")


class HostReads(TorchDispatchMode):
    """Counts, by name, the tensor reads by the host made while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self._stack = ExitStack()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name in READING_OPS:
            self.counts[name] += 1
        elif name.startswith("aten.index.") and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else ())):
            self.counts["boolean-mask indexing"] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        for attr in PY_READS:
            original = getattr(torch.Tensor, attr)

            def counted(tensor, *a, _original=original, _attr=attr, **kw):
                self.counts[f"Tensor.{_attr}"] += 1
                return _original(tensor, *a, **kw)

            self._stack.enter_context(_patched(torch.Tensor, attr, counted))
        return super().__enter__()

    def __exit__(self, *exc):
        out = super().__exit__(*exc)
        self._stack.close()
        return out


class _patched:
    def __init__(self, owner, attr, value) -> None:
        self.owner, self.attr, self.value = owner, attr, value

    def __enter__(self):
        self.saved = getattr(self.owner, self.attr)
        setattr(self.owner, self.attr, self.value)

    def __exit__(self, *exc):
        setattr(self.owner, self.attr, self.saved)


def test_host_reads_are_counted():
    """The counter sees each kind of read it claims to (else a zero below would prove nothing)."""
    t = torch.arange(4.0)
    with HostReads() as reads:
        t.sum().item()
        float(t[0])
        bool(t[1] > 0)
        t[t > 1].sum()
        t.tolist()
        t.cpu()
        t.numpy()
        torch.func.vmap(lambda r: r * 2)(t.view(2, 2)).sum().item()
    assert reads.counts["aten._local_scalar_dense.default"] == 4
    assert reads.counts["boolean-mask indexing"] == 1
    assert all(reads.counts[f"Tensor.{a}"] >= 1 for a in ("item", "tolist", "cpu", "numpy", "__float__", "__bool__"))


BASE = {"run": {"rounds": 1, "seed": 5, "device": "cpu"},
        "data": {"name": "synthetic", "num_clients": 6, "partition": "iid",
                 "synthetic": {"shape": [1, 28, 28], "examples_per_client": 10}},
        "local": {"steps": 2, "batch_size": 4, "lr": 0.05},
        "participation": {"pattern": "uniform", "clients_per_round": 4}, "eval": {"every": 0}}


@pytest.mark.parametrize("model, shape, strategy, local", [
    ("cnn_mnist", [1, 28, 28], "sequential", {}),  # dropout: the per-client seeding of every step
    ("cnn_mnist", [1, 28, 28], "batched", {}),  # dropout in the batched block: every row's noise from the host plan
    ("cnn_femnist", [1, 8, 8], "batched", {"momentum": 0.9}),  # vmap on padded chunks, optimizer state
    ("cnn_femnist", [1, 8, 8], "sequential", {"epochs": 1, "grad_clip": 1.0}),  # ragged steps, clipping
])
def test_local_steps_read_nothing_back(monkeypatch, model, shape, strategy, local):
    seen: list[Counter] = []

    def watched(solver):
        def solve(*args, **kwargs):
            with HostReads() as reads:
                out = solver(*args, **kwargs)
            seen.append(reads.counts)
            return out
        return solve

    for solver in ("run_local", "run_chunked"):  # the strategies' solvers
        monkeypatch.setattr(local_strategy, solver, watched(getattr(local_strategy, solver)))
    cfg = {**BASE, "model": {"name": model}, "local": {**BASE["local"], "strategy": strategy, **local},
           "data": {**BASE["data"], "synthetic": {**BASE["data"]["synthetic"], "shape": shape}}}
    if "epochs" in local:
        cfg["local"].pop("steps")
    fedrun.run(cfg, write_files=False)
    assert len(seen) == 1  # one block, one round
    assert all(not counts for counts in seen), seen
