"""Flower peer: the benchmark's FedAvg on Flower 1.42 (``flwr[simulation]``), run_simulation + Ray.

Runs in bench/.envs/flower (see bench/setup_peers.sh):

    bench/.envs/flower/bin/python bench/peer_flower.py --workload W1 [--partition iid] [--rounds 3]

What it does, and how it is kept equal to the other systems:
- Ray backend with 2 CPUs and ``client_resources={"num_cpus": 1}``: 2 ClientApp actors, each with
  OMP_NUM_THREADS=1 and one torch thread; the ServerApp (aggregation, evaluation) runs in this process.
- Flower's own ``flwr.serverapp.strategy.FedAvg`` (weighted by num-examples; every client has 50, so
  uniform), ``fraction_evaluate=0`` (no federated evaluation), central evaluation on the held-out set
  through ``evaluate_fn``. FedAvg's new global model is the average of the client models, which is the
  server SGD step with lr 1.0 on the mean delta.
- Client selection: the Message API lets the ServerApp address any node, so ``configure_train`` is
  overridden to send round ``r``'s messages to the nodes of the shared cohort schedule instead of
  ``random.sample``. Client id ``k`` is node ``sorted(node_ids)[k]``, and the message's config carries
  ``cid=k``, which selects the data partition the ClientApp trains on (simulated nodes are stateless, so
  this is the partition Flower's node_config would name; it avoids a discovery round over 1000 nodes).
- Local training: torch.optim.SGD from the received weights over the client's batches in stored order.
- Round times: ``evaluate_fn`` is called by the strategy after every round (and before round 1); a round's
  time is the gap between consecutive calls, so it includes sending, training, aggregation and (on eval
  rounds) the central evaluation.

Prints one JSON line (format in bench/common.py).
"""

from __future__ import annotations

import os
import sys
import time

os.environ["OMP_NUM_THREADS"] = "1"  # before torch is imported; Ray workers inherit it
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
_HERE = os.path.dirname(os.path.abspath(__file__))
os.environ.setdefault("FLWR_HOME", os.path.join(_HERE, ".envs", "flwr_home"))
sys.path.insert(0, os.path.dirname(_HERE))

from bench import common  # noqa: E402  (PROCESS_START is taken here)

# ------------------------------------------------------------------------------- client side (actors)

_DATA: dict = {}  # per process: (workload, partition) -> (clients, model)


def _client_state(workload: str, partition: str, overrides_key: tuple):
    key = (workload, partition, overrides_key)
    if key not in _DATA:
        common.one_thread()
        import torch

        from bench import workloads

        wl = workloads.get_workload(workload, **dict(overrides_key))
        clients, _ = workloads.client_data(wl, partition)
        torch.manual_seed(workloads.MODEL_SEED)
        _DATA[key] = (wl, clients, workloads.make_model(wl))
    return _DATA[key]


def client_train(msg, context):
    """ClientApp train function: local SGD on client ``cid`` from the received global weights."""
    import numpy as np
    import torch
    from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

    cfg = msg.content["config"]
    okey = tuple(sorted((k[3:], int(v)) for k, v in cfg.items() if k.startswith("wl_")))
    wl, clients, model = _client_state(str(cfg["workload"]), str(cfg["partition"]), okey)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = clients[int(cfg["cid"])]
    opt = torch.optim.SGD(model.parameters(), lr=wl.local_lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    model.train()
    for _ in range(wl.local_epochs):
        for i in range(0, len(y), wl.local_batch):
            xb = torch.from_numpy(np.array(x[i:i + wl.local_batch]))
            yb = torch.from_numpy(np.array(y[i:i + wl.local_batch]))
            opt.zero_grad(set_to_none=True)
            loss_fn(model(xb), yb).backward()
            opt.step()
    reply = RecordDict({
        "arrays": ArrayRecord(model.state_dict()),
        "metrics": MetricRecord({"num-examples": len(y)}),
    })
    return Message(content=reply, reply_to=msg)


def make_client_app():
    from flwr.clientapp import ClientApp

    app = ClientApp()
    app.train()(client_train)
    return app


# ---------------------------------------------------------------------------------------- server side


def run(workload: str = "W1", partition: str = "dirichlet", actors: int = 2, log=None, **wl_overrides) -> str:
    common.one_thread()
    import torch
    from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
    from flwr.serverapp import ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation

    from bench import workloads

    wl = workloads.get_workload(workload, **wl_overrides)
    schedule = workloads.cohort_schedule(wl)
    _, (x_test, y_test) = workloads.client_data(wl, partition)  # also creates the cache before Ray starts
    torch.manual_seed(workloads.MODEL_SEED)
    model = workloads.make_model(wl)
    initial = ArrayRecord(model.state_dict())
    int_overrides = {f"wl_{k}": int(v) for k, v in wl_overrides.items()}

    class ScheduledFedAvg(FedAvg):
        """Flower's FedAvg, sending round r to the nodes of the shared cohort schedule."""

        def configure_train(self, server_round, arrays, config, grid):
            node_ids = self.node_ids
            messages = []
            for cid in schedule[server_round - 1]:
                cfg = ConfigRecord({"server-round": server_round, "cid": int(cid), "workload": wl.name,
                                    "partition": partition, **int_overrides})
                messages.append(Message(content=RecordDict({"arrays": arrays, "config": cfg}),
                                        message_type=MessageType.TRAIN, dst_node_id=node_ids[int(cid)]))
            return messages

    stamps: list[float] = []
    acc_by_round: dict[int, float] = {}

    def evaluate_fn(server_round: int, arrays):
        if server_round > 0 and common.is_eval_round(server_round, wl.rounds, wl.eval_every):
            model.load_state_dict(arrays.to_torch_state_dict())
            acc_by_round[server_round] = common.evaluate(model, x_test, y_test)
        stamps.append(time.perf_counter())
        if log and server_round > 0:
            extra = f" acc {acc_by_round[server_round]:.4f}" if server_round in acc_by_round else ""
            log(f"round {server_round}: {stamps[-1] - stamps[-2]:.3f} s{extra}")
        if server_round not in acc_by_round:
            return None
        return MetricRecord({"accuracy": acc_by_round[server_round]})

    server_app = ServerApp()

    @server_app.main()
    def _main(grid, context) -> None:
        strategy = ScheduledFedAvg(fraction_evaluate=0.0, min_available_nodes=wl.num_clients)
        # the simulation registers its nodes while the ServerApp starts: wait for all of them
        deadline = time.monotonic() + 300
        while len(node_ids := sorted(grid.get_node_ids())) < wl.num_clients:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(node_ids)} of {wl.num_clients} nodes registered after 300 s")
            time.sleep(0.2)
        strategy.node_ids = node_ids
        strategy.start(grid=grid, initial_arrays=initial, num_rounds=wl.rounds, evaluate_fn=evaluate_fn)

    backend_config = {
        "init_args": {"num_cpus": actors, "num_gpus": 0, "include_dashboard": False,
                      "log_to_driver": True},
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
    }
    run_simulation(server_app=server_app, client_app=make_client_app(), num_supernodes=wl.num_clients,
                   backend_name="ray", backend_config=backend_config)
    if len(stamps) != wl.rounds + 1:
        raise RuntimeError(f"Flower ran {len(stamps) - 1} of {wl.rounds} rounds (see its log above)")
    round_times = [b - a for a, b in zip(stamps[:-1], stamps[1:], strict=True)]
    total = stamps[-1] - common.PROCESS_START
    import flwr

    return common.result_line(f"flower-{actors}actors", wl.name, partition, round_times, total,
                              acc_by_round[wl.rounds], acc_by_round, flwr_version=flwr.__version__,
                              cohort="shared schedule", actors=actors)


def main(argv=None) -> None:
    p = common.base_parser(__doc__.splitlines()[0])
    p.add_argument("--actors", type=int, default=2, help="Ray actors (1 CPU each)")
    p.add_argument("-v", "--verbose", action="store_true", help="per-round progress on stderr")
    args = p.parse_args(argv)
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if args.verbose else None
    line = run(args.workload, args.partition, args.actors, log=log, **common.overrides(args))
    print(line, flush=True)


if __name__ == "__main__":
    # run from the importable module, so Ray pickles the ClientApp functions by reference
    from bench import peer_flower

    peer_flower.main()
