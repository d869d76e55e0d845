"""pfl peer: the benchmark's FedAvg on Apple pfl 0.6.0 (SimulatedBackend + FederatedAveraging, PyTorch).

Runs in bench/.envs/pfl (see bench/setup_peers.sh):

    bench/.envs/pfl/bin/python bench/peer_pfl.py --workload W1 [--workers 2] [--partition iid] [--rounds 3]

Workers. pfl's PyTorch multi-worker mode is one process per worker with a torch.distributed process group
(gloo on CPU), launched by torchrun: pfl.internal.ops.pytorch_ops creates the group when it sees
TORCHELASTIC_RUN_ID (Horovod is only needed for its TensorFlow path). With ``--workers N > 1`` this script
re-launches itself under ``python -m torch.distributed.run --standalone --nproc_per_node N``; each worker
trains its share of the cohort and pfl's SumAggregator all-reduces the summed deltas. Rank 0 prints the
result; total_s is measured from the launcher's start.

How it is kept equal to the other systems:
- Same arrays, model (fedrun.models, wrapped with the ``loss``/``metrics`` methods pfl requires), initial
  weights, hyperparameters. Local: torch.optim.SGD (``local_optimizer_create``) over the client's
  batches in stored order (pfl's Dataset.iter does not shuffle). Central: torch.optim.SGD with
  ``server_lr`` applied by pfl to the averaged delta (every delta has weight 1: uniform mean).
- Cohorts: pfl asks its ``user_sampler`` for one user id per call, in order, and worker ``r`` of ``N``
  takes calls ``r, r+N, ...``; the sampler here returns the shared schedule's ids in order, so round
  ``t`` trains exactly the schedule's clients (cohorts are even, so rounds stay aligned across workers).
- Evaluation: pfl's CentralEvaluationCallback evaluates after 0-based iterations ``i % frequency == 0``
  (i.e. after rounds 11, 21, ...), so a subclass evaluates after rounds ``eval_every, 2*eval_every, ...``
  and the last, with pfl's distributed evaluation. ``evaluation_frequency`` of the algorithm is set
  beyond the last round; pfl still evaluates every user before and after local training in iteration
  0 (``0 % f == 0``), which only slows round 1 (outside the rounds 4..end median).
- Round times: a timing callback placed after the evaluation callback stamps the end of every iteration.

Prints one JSON line (format in bench/common.py).
"""

from __future__ import annotations

import os
import sys
import time

os.environ["OMP_NUM_THREADS"] = "1"  # before torch is imported
os.environ.setdefault("PFL_PYTORCH_DEVICE", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import common  # noqa: E402  (PROCESS_START is taken here)

LAUNCH_T0_ENV = "FEDRUN_BENCH_LAUNCH_T0"  # wall-clock start of the launcher, for total_s under torchrun


def _relaunch_under_torchrun(workers: int, argv: list[str]) -> int:
    import subprocess

    t0 = time.time() - (time.perf_counter() - common.PROCESS_START)  # this process's start, wall clock
    env = dict(os.environ, **{LAUNCH_T0_ENV: repr(t0)})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={workers}",
           os.path.abspath(__file__), *argv]
    return subprocess.call(cmd, env=env)


def run(workload: str = "W1", partition: str = "dirichlet", log=None, **wl_overrides) -> str | None:
    common.one_thread()
    import numpy as np
    import torch
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.callback.central_evaluation import CentralEvaluationCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.internal.ops.selector import get_default_framework_module
    from pfl.metrics import StringMetricName, Weighted
    from pfl.model.pytorch import PyTorchModel

    from bench import workloads

    wl = workloads.get_workload(workload, **wl_overrides)
    clients, (x_test, y_test) = workloads.client_data(wl, partition)
    schedule = workloads.cohort_schedule(wl)
    dist = get_default_framework_module().distributed
    rank, world = dist.global_rank, dist.world_size
    if wl.cohort % world:
        raise ValueError(f"cohort {wl.cohort} is not a multiple of {world} workers: rounds would misalign")

    class PflNet(torch.nn.Module):
        """The workload's model plus the ``loss`` and ``metrics`` methods pfl's PyTorchModel requires."""

        def __init__(self, net):
            super().__init__()
            self.net = net
            self.ce = torch.nn.CrossEntropyLoss()

        def forward(self, x):
            return self.net(x)

        def loss(self, x, y, eval=False):  # noqa: A002  (pfl's keyword)
            self.eval() if eval else self.train()
            return self.ce(self(x), y)

        @torch.no_grad()
        def metrics(self, x, y, eval=True):  # noqa: A002
            self.eval() if eval else self.train()
            out = self(x)
            n = len(y)
            return {
                "loss": Weighted(float(self.ce(out, y)) * n, n),
                "accuracy": Weighted(float((out.argmax(1) == y).sum()), n),
            }

    torch.manual_seed(workloads.MODEL_SEED)
    net = PflNet(workloads.make_model(wl))
    model = PyTorchModel(
        model=net,
        local_optimizer_create=torch.optim.SGD,
        central_optimizer=torch.optim.SGD(net.parameters(), lr=wl.server_lr),
    )

    class ScheduleSampler:
        """pfl user sampler: the shared cohort schedule's ids, in order."""

        def __init__(self):
            self._ids = iter(schedule.reshape(-1).tolist())

        def __call__(self):
            return next(self._ids)

    def make_dataset(uid):
        x, y = clients[uid]
        # torch tensors (copied out of the mmap): pfl would turn numpy labels into float32 tensors
        return Dataset(raw_data=[torch.from_numpy(np.array(x)), torch.from_numpy(np.array(y))], user_id=uid)

    train_data = FederatedDataset(make_dataset, ScheduleSampler())
    backend = SimulatedBackend(training_data=train_data, val_data=train_data)
    eval_params = NNEvalHyperParams(local_batch_size=500)
    acc_name = StringMetricName("Central val | accuracy")
    acc_by_round: dict[int, float] = {}

    class RoundEval(CentralEvaluationCallback):
        def on_train_begin(self, *, model):
            return super(CentralEvaluationCallback, self).on_train_begin(model=model)  # no eval at start

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            rnd = central_iteration + 1
            if not common.is_eval_round(rnd, wl.rounds, wl.eval_every):
                return False, type(aggregate_metrics)()
            _, metrics = self._eval(model)
            acc_by_round[rnd] = float(metrics[acc_name].overall_value)
            return False, metrics

    stamps: list[float] = []

    class Stopwatch(TrainingProcessCallback):
        def on_train_begin(self, *, model):
            stamps.append(time.perf_counter())
            return super().on_train_begin(model=model)

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            stamps.append(time.perf_counter())
            if log and rank == 0:
                rnd = central_iteration + 1
                extra = f" acc {acc_by_round[rnd]:.4f}" if rnd in acc_by_round else ""
                log(f"round {rnd}: {stamps[-1] - stamps[-2]:.3f} s{extra}")
            return False, type(aggregate_metrics)()

    algorithm_params = NNAlgorithmParams(
        central_num_iterations=wl.rounds,
        evaluation_frequency=10**9,  # no per-user evaluation (except pfl's iteration 0, see above)
        train_cohort_size=wl.cohort,
        val_cohort_size=None,
    )
    train_params = NNTrainHyperParams(
        local_num_epochs=wl.local_epochs, local_learning_rate=wl.local_lr, local_batch_size=wl.local_batch)

    test_set = Dataset(raw_data=[torch.from_numpy(np.array(x_test)), torch.from_numpy(np.array(y_test))])
    FederatedAveraging().run(
        algorithm_params=algorithm_params, backend=backend, model=model,
        model_train_params=train_params, model_eval_params=eval_params,
        callbacks=[RoundEval(test_set, eval_params),
                   Stopwatch()],
        send_metrics_to_platform=False,
    )
    if rank != 0:
        return None
    round_times = [b - a for a, b in zip(stamps[:-1], stamps[1:], strict=True)]
    if LAUNCH_T0_ENV in os.environ:  # under torchrun: from the launcher's start
        total = time.time() - float(os.environ[LAUNCH_T0_ENV])
    else:
        total = stamps[-1] - common.PROCESS_START
    import pfl

    return common.result_line(f"pfl-{world}workers", wl.name, partition, round_times, total,
                              acc_by_round[wl.rounds], acc_by_round, pfl_version=pfl.__version__,
                              workers=world, cohort="shared schedule")


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    p = common.base_parser(__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=1,
                   help="pfl worker processes (torchrun + gloo when > 1)")
    p.add_argument("-v", "--verbose", action="store_true", help="per-round progress on stderr")
    args = p.parse_args(argv)
    if args.workers > 1 and "TORCHELASTIC_RUN_ID" not in os.environ:
        sys.exit(_relaunch_under_torchrun(args.workers, argv))
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if args.verbose else None
    line = run(args.workload, args.partition, log=log, **common.overrides(args))
    if line is not None:
        print(line, flush=True)


if __name__ == "__main__":
    main()
