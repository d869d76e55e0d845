"""Gathered uploads and the robust aggregators on them (fedmedian, fedtrimmedavg, krum; docs/algorithms.md).

Each rule equals a direct numpy transcription of its definition on random deltas and, round by round, on
the float64 least-squares task (where every client's delta has a closed form); a run gives the same
bits on 2 real ranks as on 1, under both schedules; gathered and summed entries mix in one declaration;
the start-up memory check and the skip_nonfinite_clients combination are refused with one line."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from helpers import (
    LEAST_SQUARES,
    bernoulli_trace,
    config,
    federation,
    final_models,
    local_deltas,
    per_round,
    run_ranks,
)

from fedrun.algorithms import get_algorithm
from fedrun.algorithms.base import Algorithm, Declaration, Scalar, Vector, model_delta

# ------------------------------------------------------------------ the rules, transcribed from their definitions


def median(deltas: np.ndarray) -> np.ndarray:
    return np.median(deltas, axis=0)  # numpy's median: mean of the two middle values for an even count


def trimmed_mean(deltas: np.ndarray, beta: float) -> np.ndarray:
    n = len(deltas)
    k = math.floor(beta * n)
    return np.sort(deltas, axis=0)[k:n - k].mean(axis=0)


def krum(deltas: np.ndarray, f: int, m: int) -> np.ndarray | None:
    n = len(deltas)
    if n <= 2 * f + 2:
        return None
    scores = []
    for i in range(n):
        dist = sorted(float(np.sum((deltas[i] - deltas[j]) ** 2)) for j in range(n) if j != i)
        scores.append(sum(dist[:n - f - 2]))
    best = sorted(sorted(range(n), key=lambda i: scores[i])[:min(m, n - f)])
    return deltas[best].mean(axis=0)


RULES = {
    "fedmedian": ({}, median),
    "fedtrimmedavg": ({"beta": 0.2}, lambda d: trimmed_mean(d, 0.2)),
    "fedtrimmedavg_b0.34": ({"beta": 0.34}, lambda d: trimmed_mean(d, 0.34)),
    "krum": ({"num_malicious": 1}, lambda d: krum(d, 1, 1)),
    "multikrum": ({"num_malicious": 2, "num_keep": 3}, lambda d: krum(d, 2, 3)),
}


def algorithm(case: str) -> Algorithm:
    hparams, _ = RULES[case]
    cls = get_algorithm(case.replace("multikrum", "krum").split("_")[0])
    return cls(cls.Hparams(**hparams))


@pytest.mark.parametrize("case", list(RULES))
def test_each_rule_equals_its_numpy_transcription_on_random_deltas(case):
    rng = np.random.default_rng(sum(map(ord, case)))
    rule = algorithm(case)
    for n in (1, 2, 3, 4, 5, 6, 7, 10, 11):
        deltas = rng.standard_t(df=2, size=(n, 9))  # heavy tails: outliers in every coordinate
        want = RULES[case][1](deltas)
        got = rule.aggregate(torch.from_numpy(deltas))
        if want is None:
            assert got is None, n
        else:
            np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-13, err_msg=f"n={n}")


@pytest.mark.parametrize("case", list(RULES))
def test_every_round_of_a_run_equals_the_transcription(case):
    hparams, rule = RULES[case]
    cfg = config({"name": case.replace("multikrum", "krum").split("_")[0], **hparams}, global_lr=0.7)
    trace = bernoulli_trace(25, 0.7, seed=3)  # empty and small rounds included (Krum's policy)
    fed = federation(cfg, trace)
    x = fed.global_model().numpy().copy()
    for t, x_next in enumerate(per_round(fed, len(trace))):
        active = np.flatnonzero(trace[t])
        step = rule(local_deltas(cfg, x, active)) if len(active) else None
        x = x if step is None else x + 0.7 * step
        np.testing.assert_allclose(x_next, x, rtol=0, atol=1e-12, err_msg=f"round {t + 1}, |S_t|={len(active)}")


@dataclass
class MixedHparams:
    global_lr: float = 1.0


class Mixed(Algorithm):
    """A gathered delta next to a summed delta and a summed count: x <- x + (mean of rows + sum / count) / 2."""

    name = "mixed"
    Hparams = MixedHparams

    def declare(self) -> Declaration:
        return Declaration(server=(Vector("x", "model"),),
                           up=(Vector("sum"), Vector("rows", gather=True), Scalar("count")))

    def client_finish(self, down, state, local, clients, ctx):
        delta = model_delta(local, down)
        return {"sum": delta, "rows": delta, "count": torch.ones(len(delta), dtype=delta.dtype)}, state

    def server_update(self, server, up, ctx):
        if ctx.num_active == 0:
            return server
        assert up["rows"].shape == (ctx.num_active, len(server["x"])) and float(up["count"]) == ctx.num_active
        return {**server, "x": server["x"] + (up["rows"].mean(dim=0) + up["sum"] / up["count"]) / 2}


RANKED = {  # every robust rule, both schedules, uneven blocks (7 clients on 2 ranks), both placements
    "fedmedian": [*LEAST_SQUARES, "data.num_clients=7", "algorithm.name=fedmedian",
                  "participation.pattern=bernoulli", "participation.probability=0.6"],
    "fedtrimmedavg": [*LEAST_SQUARES, "data.num_clients=7", "algorithm.name=fedtrimmedavg", "algorithm.beta=0.3",
                      "participation.pattern=uniform", "participation.clients_per_round=5", "run.placement=blocks"],
    "krum": [*LEAST_SQUARES, "data.num_clients=7", "algorithm.name=krum", "algorithm.num_malicious=1",
             "algorithm.num_keep=2", "participation.pattern=full"],
    "fedmedian_async": [*LEAST_SQUARES, "data.num_clients=7", "algorithm.name=fedmedian", "asynchrony.enabled=true",
                        "asynchrony.buffer_size=3", "asynchrony.concurrency=5"],
    "mixed": [*LEAST_SQUARES, "data.num_clients=7", "algorithm.name=test_robust:Mixed",
              "participation.pattern=uniform", "participation.clients_per_round=4"],
    "krum_gaussian": [*LEAST_SQUARES, "data.num_clients=7", "algorithm.name=krum", "corruption.kind=gaussian",
                       "corruption.clients=[1, 5]", "corruption.scale=10", "participation.pattern=full"],
    "fedavg": [*LEAST_SQUARES, "data.num_clients=7", "participation.pattern=uniform",
               "participation.clients_per_round=4"],
}


@pytest.mark.mpi
def test_gathered_runs_are_rank_count_invariant(tmp_path):
    common = ["run.rounds=12", "local.steps=3"]
    configs = {name: [*overrides, *common] for name, overrides in RANKED.items()}
    one = final_models(0, tmp_path, configs)
    two = final_models(2, tmp_path, configs)
    for name in RANKED:
        if name not in ("fedavg", "mixed"):  # gathered rows arrive exactly; a SUM may differ in its last bits
            assert np.array_equal(one[name], two[name]), name
    # mixed: the gathered mean and the summed mean agree, so the run is FedAvg up to rounding
    for x in (one["mixed"], two["mixed"]):
        np.testing.assert_allclose(x, one["fedavg"], rtol=1e-12, atol=1e-12)
    assert not np.array_equal(one["fedmedian"], one["fedmedian_async"])


def test_memory_check_refuses_a_cohort_that_cannot_fit(tmp_path):
    # ResNet-18 (11.2 M parameters) with 5000 clients in every round: 5000 x 11.2 M floats x 4 copies = 830 GiB
    proc = run_ranks(0, ["-m", "fedrun", "train", "--quiet", f"run.dir={tmp_path / 'run'}", "algorithm.name=krum",
                         "data.name=synthetic", "data.synthetic.examples_per_client=1", "data.num_clients=5000",
                         "data.partition=iid", "model.name=resnet18", "participation.pattern=full"], check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "algorithm.name=krum: gathered uploads hold up to 5000 x 11" in lines[0] and "GiB free" in lines[0]


def test_skip_nonfinite_clients_is_refused_with_gathered_uploads(tmp_path):
    with pytest.raises(Exception, match="^run.skip_nonfinite_clients: algorithm fedmedian gathers its uploads"):
        federation(config("fedmedian", "run.skip_nonfinite_clients=true"))
