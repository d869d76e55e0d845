"""The bare loop: the minimal single-process PyTorch FedAvg that does the benchmark's arithmetic.

Per round: take the cohort from the shared schedule; for each client in order, load the global weights,
run ``local_steps`` torch.optim.SGD steps over its batches (stored order), and add its delta
``w_local - w_global`` to a running sum; then the uniform mean delta ``d`` becomes the pseudo-gradient
``-d`` of a server torch.optim.SGD step with ``server_lr`` (1.0: the new global is the clients' average).
Central evaluation after every ``eval_every`` rounds and after the last. Nothing else: this is the floor
for a sequential design.

    python bench/bare_loop.py --workload W1 [--partition iid] [--rounds 3]

Prints one JSON line (format in bench/common.py).

On a GPU (``bench/gpu.py``) the same floor takes two forms over examples resident on the device: the
cohort trained one client at a time with torch.optim.SGD (:func:`resident_round`), and the cohort stacked
into one model per client and trained by ``torch.func.vmap`` (:func:`stacked_round`), which bounds what any
batching of clients can reach.
"""

from __future__ import annotations

import os
import sys
import time

os.environ["OMP_NUM_THREADS"] = "1"  # before torch is imported
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import common  # noqa: E402  (PROCESS_START is taken here)


def run(workload: str = "W1", partition: str = "dirichlet", log=None, **wl_overrides) -> str:
    """Run the bare loop; returns the JSON result line."""
    common.one_thread()
    import numpy as np
    import torch

    from bench import workloads

    wl = workloads.get_workload(workload, **wl_overrides)
    clients, (x_test, y_test) = workloads.client_data(wl, partition)
    schedule = workloads.cohort_schedule(wl)
    torch.manual_seed(workloads.MODEL_SEED)
    model = workloads.make_model(wl)
    params = list(model.parameters())
    global_w = [p.detach().clone() for p in params]
    server_opt = torch.optim.SGD(params, lr=wl.server_lr)
    loss_fn = torch.nn.CrossEntropyLoss()

    round_times: list[float] = []
    acc_by_round: dict[int, float] = {}
    for r in range(wl.rounds):
        t0 = time.perf_counter()
        delta_sum = [torch.zeros_like(w) for w in global_w]
        for cid in schedule[r]:
            x, y = clients[int(cid)]
            with torch.no_grad():
                for p, w in zip(params, global_w, strict=True):
                    p.copy_(w)
            opt = torch.optim.SGD(params, lr=wl.local_lr)
            for _ in range(wl.local_epochs):
                for i in range(0, len(y), wl.local_batch):
                    xb = torch.from_numpy(np.array(x[i:i + wl.local_batch]))  # copy out of the mmap
                    yb = torch.from_numpy(np.array(y[i:i + wl.local_batch]))
                    opt.zero_grad(set_to_none=True)
                    loss_fn(model(xb), yb).backward()
                    opt.step()
            with torch.no_grad():
                for s, p, w in zip(delta_sum, params, global_w, strict=True):
                    s.add_(p - w)
        # server step: grad = -mean delta, from the global weights
        with torch.no_grad():
            for p, w, s in zip(params, global_w, delta_sum, strict=True):
                p.copy_(w)
                p.grad = s.div_(-len(schedule[r]))
        server_opt.step()
        server_opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for w, p in zip(global_w, params, strict=True):
                w.copy_(p)
        rnd = r + 1
        if common.is_eval_round(rnd, wl.rounds, wl.eval_every):
            acc_by_round[rnd] = common.evaluate(model, x_test, y_test)
        round_times.append(time.perf_counter() - t0)
        if log:
            log(f"round {rnd}: {round_times[-1]:.3f} s" + (f" acc {acc_by_round[rnd]:.4f}"
                                                          if rnd in acc_by_round else ""))
    total = time.perf_counter() - common.PROCESS_START
    return common.result_line("bare", wl.name, partition, round_times, total,
                              acc_by_round[wl.rounds], acc_by_round, threads=torch.get_num_threads())


def resident_round(module, x, y, index, lr: float) -> None:
    """One FedAvg round of the bare GPU loop, in place on ``module``: clients one at a time (client c's step k
    on the examples ``x[index[c, k]]``, which live on the device like the indices), torch.optim.SGD, and the
    new global model the mean of the clients' end points."""
    import torch

    params = list(module.parameters())
    start = [p.detach().clone() for p in params]
    total = [torch.zeros_like(p) for p in params]
    opt = torch.optim.SGD(params, lr=lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    for c in range(index.shape[0]):
        with torch.no_grad():
            for p, w in zip(params, start, strict=True):
                p.copy_(w)
        for k in range(index.shape[1]):
            rows = index[c, k]
            opt.zero_grad(set_to_none=True)
            loss_fn(module(x[rows]), y[rows]).backward()
            opt.step()
        with torch.no_grad():
            for t, p in zip(total, params, strict=True):
                t.add_(p)
    with torch.no_grad():
        for p, t in zip(params, total, strict=True):
            p.copy_(t.div_(index.shape[0]))


def stacked_round(module, x, y, index, lr: float) -> None:
    """The same round with the cohort stacked: one copy of the parameters per client, every client's step k
    in one ``torch.func.vmap`` of the gradient (dropout masks differ per client), plain SGD by hand."""
    import torch
    from torch.func import functional_call, grad, vmap

    clients = index.shape[0]
    stacked = {n: p.detach().unsqueeze(0).repeat(clients, *([1] * p.dim())) for n, p in module.named_parameters()}

    def loss(params, inputs, targets):
        return torch.nn.functional.cross_entropy(functional_call(module, params, (inputs,)), targets)

    gradient = vmap(grad(loss), randomness="different")
    for k in range(index.shape[1]):
        rows = index[:, k]
        g = gradient(stacked, x[rows], y[rows])
        for name, value in stacked.items():
            value.sub_(g[name], alpha=lr)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(stacked[name].mean(dim=0))


def main(argv=None) -> None:
    p = common.base_parser(__doc__.splitlines()[0])
    p.add_argument("-v", "--verbose", action="store_true", help="per-round progress on stderr")
    args = p.parse_args(argv)
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if args.verbose else None
    print(run(args.workload, args.partition, log=log, **common.overrides(args)), flush=True)


if __name__ == "__main__":
    main()
