"""``runtime.json`` in the run directory: how and where a run ran, as opposed to what it computed.

Written by rank 0 when the rounds start, again after every checkpoint (its write time and size), and at the
end with every rank's peak memory; nothing in it changes a result.
"""

from __future__ import annotations

import json
import resource
from pathlib import Path
from typing import Any

from fedrun.errors import writing
from fedrun.federation.build import RunState, Setup
from fedrun.privacy.guarantee import guarantee
from fedrun.runtime.provenance import provenance


class RuntimeLog:
    """``runtime.json``: provenance (versions, git commit, hosts, Slurm ids, command line, start time;
    :func:`fedrun.runtime.provenance.provenance`), ranks, device, placement and blocks, the local strategy, why
    it was taken and its timings, what computes the loss, checkpoint write times and sizes, with privacy its
    guarantee (unit, neighbouring relation, the sigma in use, the noise's source, the metrics it does not
    cover), and every rank's peak resident memory at the end."""

    def __init__(self, setup: Setup, state: RunState, run_dir: Path | None, resume_s: float | None) -> None:
        self.world, self.clients = setup.world, state.clients
        self.path = None if run_dir is None or not self.world.is_root else run_dir / "runtime.json"
        self.data: dict[str, Any] = {
            "provenance": provenance(self.world),  # collective: the ranks' host names
            "ranks": self.world.size, "device": str(self.world.device), "backend": self.world.backend,
            "launcher": self.world.launcher, "network": self.world.network,
            "placement": setup.placement.mode, "blocks": setup.placement.blocks, "dim": setup.dim,
            "client_state_bytes_per_rank": state.clients.nbytes, "client_store": setup.store_choice,
            "local_strategy": state.strategy.name, "strategy_timings_s": setup.strategy_timings,
            "strategy_reason": setup.strategy_reason if resume_s is None else "kept from the checkpoint (a resumed "
                                                                              "run keeps its strategy)",
            "loss_kernel": setup.loss_kernel,
            "start_round": state.next_round, "resume_read_s": resume_s, "checkpoints": [],
        }
        if setup.privacy is not None:  # what the epsilon is about (docs/privacy.md)
            self.data["privacy"] = guarantee(setup.privacy)
        self._write()

    def checkpoint_written(self, next_round: int, path: Path | None, seconds: float) -> None:
        size = path.stat().st_size if path is not None and path.exists() else None
        self.data["checkpoints"].append({"round": next_round, "write_s": round(seconds, 4), "bytes": size})
        self._write()

    def finish(self) -> None:
        """Every rank's peak resident memory and on-disk client state (collective: after the last round only)."""
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB -> MiB on Linux
        self.data["peak_rss_mib_per_rank"] = self.world.allgather_object(round(peak, 1))
        self.data["client_state_disk_bytes_per_rank"] = self.world.allgather_object(self.clients.disk_bytes)
        self._write()

    def _write(self) -> None:
        if self.path is not None:
            with writing(self.path):
                self.path.write_text(json.dumps(self.data, indent=1) + "\n")
