"""The config tree: every section together (:class:`Config`), the checks across sections, and the resolved
config as the dict a checkpoint records (``meta/config``) and a resume compares."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedrun.config.data import DataConfig
from fedrun.config.sections import (
    AlgorithmConfig,
    AsyncConfig,
    CheckpointConfig,
    CorruptionConfig,
    EvalConfig,
    LocalConfig,
    MetricsConfig,
    ModelConfig,
    ParticipationConfig,
    RunConfig,
    StateConfig,
)
from fedrun.errors import require, require_path
from fedrun.plugins import digests
from fedrun.privacy.config import PrivacyConfig


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    local: LocalConfig = field(default_factory=LocalConfig)
    participation: ParticipationConfig = field(default_factory=ParticipationConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    state: StateConfig = field(default_factory=StateConfig)
    asynchrony: AsyncConfig = field(default_factory=AsyncConfig)
    corruption: CorruptionConfig = field(default_factory=CorruptionConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)  # differential privacy (fedrun/privacy/)

    def check(self) -> None:
        """Checks across sections (each section has checked its own fields first)."""
        require(self.eval.finetune_steps == 0 or self.data.client_test_fraction > 0, "eval.finetune_steps",
                "0 unless data.client_test_fraction > 0 (personalized models are evaluated on per-client "
                "test data)", self.eval.finetune_steps)
        require(self.eval.clients is None or self.eval.clients <= self.data.num_clients, "eval.clients",
                f"null or an integer in [1, data.num_clients={self.data.num_clients}]", self.eval.clients)
        require(self.state.dir is None or self.state.dir.strip() != "", "state.dir", "a directory path or null "
                "(the run directory)", self.state.dir)
        for name, path in (("run.dir", self.run.dir), ("state.dir", self.state.dir)):
            if path is not None:
                require_path(name, path)
        require(not (self.asynchrony.enabled and self.run.skip_nonfinite_clients), "run.skip_nonfinite_clients",
                "false with asynchrony.enabled (an upload is consumed steps after its client's new state was "
                "stored, so it cannot be dropped)", self.run.skip_nonfinite_clients)

    def run_dir(self) -> Path:
        """``run.dir`` with ``{name}``, ``{seed}`` filled in and a leading ``~`` expanded to the home directory."""
        return Path(self.run.dir.format(name=self.run.name, seed=self.run.seed)).expanduser()

    def to_dict(self) -> dict[str, Any]:
        """The resolved config; with plugins, a derived ``plugins`` section ``{field: "module:Attr@sha256"}``
        (:meth:`plugin_digests`), so that the checkpoint's ``meta/config`` records the plugins' code and
        the resume policy (fedrun.federation.resume) sees a changed plugin as a changed setting."""
        out = dataclasses.asdict(self)
        algo = out.pop("algorithm")
        out["algorithm"] = {"name": algo["name"], **(algo["hparams"] or {})}
        for section in PLUGIN_SETTINGS:  # a plugin's settings are keys of its section, as hparams are
            out[section].update(out[section].pop("settings") or {})
        if self.privacy == PrivacyConfig():  # off: left out, so that checkpoints of older versions still resume
            out.pop("privacy")
        plugins = self.plugin_digests()
        if plugins:
            out["plugins"] = plugins
        return out

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def plugin_digests(self) -> dict[str, str]:
        """``{field: "package.module:Attr@<sha256 of the module's source>"}`` for every registry field that
        names a plugin (fedrun.plugins); a checkpoint records it, a resume compares it."""
        return digests({"algorithm.name": self.algorithm.name, "model.name": self.model.name,
                        "data.name": self.data.name, "participation.pattern": self.participation.pattern})


SECTIONS = frozenset(f.name for f in dataclasses.fields(Config))
PLUGIN_SETTINGS = {"model": "name", "participation": "pattern"}  # sections whose plugin may have ``Settings``
