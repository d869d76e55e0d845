"""What a per-client evaluation of N on-demand clients costs, and how much of it is their data.

    .venv/bin/python bench/eval_cost.py [--clients 10000] [--repeats 2]

``data.name=synthetic_fedprox`` (generated per client on demand), the logistic model, one process: the CPU time
of a whole per-client evaluation of all N clients (``Evaluation.after_round``: the pooled test set, every
client's test examples generated, evaluated, reduced and summed) against the CPU time of generating the same
clients' test examples alone (``load_test``), per client, measured in turns (CPU time: other processes on the
machine change the wall time, not this). The difference is what the evaluation adds to its data
(docs/evaluation.md).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    import numpy as np

    from fedrun.config import load_config
    from fedrun.federation.build import build
    from fedrun.runtime.world import init_world

    n = args.clients
    cfg = load_config(None, ["data.name=synthetic_fedprox", f"data.num_clients={n}", "model.name=logistic",
                             "run.device=cpu", "local.strategy=sequential", "participation.clients_per_round=10"])
    setup, state = build(cfg, init_world("cpu"), None)
    evaluation, x = setup.round.evaluation, setup.exchange.global_model()
    source = evaluation.clients.source
    whole, data = [], []
    for _ in range(args.repeats):
        started = time.process_time()
        evaluation.after_round(x, 0, state.strategy)
        whole.append((time.process_time() - started) / n)
        started = time.process_time()
        source.load_test(np.arange(n))
        data.append((time.process_time() - started) / n)
    print(f"{n} clients, {int(source.test_examples.sum())} test examples; CPU time per client, best of {args.repeats}:")
    print(f"  the whole per-client evaluation  {1000 * min(whole):.3f} ms")
    print(f"  generating its data alone        {1000 * min(data):.3f} ms")
    print(f"  what the evaluation adds          {1000 * (min(whole) - min(data)):.3f} ms")


if __name__ == "__main__":
    main()
