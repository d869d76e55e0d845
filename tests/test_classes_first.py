"""The classes-first cross-entropy (fedrun.training.classes_first) is taken only where it gives
``F.cross_entropy``'s bits: losses and gradients on this machine, alone and inside the batched oracle, and
its self-check refuses a kernel that adds the classes in another order."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch.func import vmap
from torch.nn import functional as F

import fedrun
from fedrun.data.client_block import Batches
from fedrun.models import build_model
from fedrun.training.classes_first import (
    MIN_ROWS,
    PAD,
    classes_first_cross_entropy,
    exact_here,
    matches_reference,
    reference_cross_entropy,
    same_bits,
    uses_classes_first,
    via_autograd,
)
from fedrun.training.flat_model import FlatModel
from fedrun.training.local_strategy import Batched
from fedrun.training.losses import cross_entropy, loss_kernel


def values_and_gradient(loss, logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor):
    x = logits.clone().requires_grad_(True)
    value = loss(x, targets)
    return value.detach(), torch.autograd.grad((value * weights).sum(), x)[0]


def test_w2s_case_takes_the_classes_first_kernel_on_avx512():
    """float32 and 10 classes: on AVX-512 the reference sums each row from left to right (10 < 16 lanes),
    which the classes-first kernel reproduces; elsewhere the self-check decides (and the test below holds)."""
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        pytest.skip("the reference sums 10 classes in a tree on CPUs with narrower vectors")
    assert exact_here(torch.float32, 10)
    assert uses_classes_first(torch.zeros(MIN_ROWS, 10), torch.zeros(MIN_ROWS, dtype=torch.int64))
    # fewer rows (a client's batch under the sequential strategies): the reference, which is faster there
    assert not uses_classes_first(torch.zeros(MIN_ROWS - 1, 10), torch.zeros(MIN_ROWS - 1, dtype=torch.int64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("classes", [2, 10, 15, 16, 40])
def test_the_loss_gives_the_reference_bits(dtype, classes):
    """fedrun's cross_entropy against F.cross_entropy: values and gradients, rows that do and do not fill
    whole vectors, logits from near ties to exp underflow, and an ignored target (-100)."""
    gen = torch.Generator().manual_seed(classes)
    for rows in (1, 7, 50, 3200, 3203):
        spread = torch.logspace(-3, 2.5, rows, dtype=dtype)[:, None]
        logits = torch.randn(rows, classes, generator=gen, dtype=dtype) * spread
        targets = torch.randint(0, classes, (rows,), generator=gen)
        targets[rows // 2] = -100
        weights = torch.rand(rows, generator=gen, dtype=dtype)
        reference = values_and_gradient(reference_cross_entropy, logits, targets, weights)
        # fedrun's loss, and the classes-first kernel itself at every row count wherever the self-check admits it
        for loss in (cross_entropy, *([classes_first_cross_entropy] if exact_here(dtype, classes) else [])):
            ours = values_and_gradient(loss, logits, targets, weights)
            assert same_bits(ours[0], reference[0]) and same_bits(ours[1], reference[1]), (loss, rows)
    assert uses_classes_first(logits, targets) == exact_here(dtype, classes)  # 3,203 rows: at least MIN_ROWS
    assert not uses_classes_first(logits, torch.softmax(logits, 1))  # probabilities: F.cross_entropy's own
    assert not exact_here(dtype, PAD)  # at the widest vector's width every CPU kernel adds a tree


def test_the_self_check_refuses_another_order():
    """A kernel that adds the same exponentials in reverse class order, and one whose last columns fall
    outside a full vector (the scalar exp of log-softmax's remainder loop), are refused."""
    def reversed_sum(outputs, targets):
        return classes_first_cross_entropy(outputs.flip(1), torch.where(targets < 0, targets,
                                                                        outputs.shape[1] - 1 - targets))

    def unpadded(outputs, targets):
        log_p = torch.log_softmax(outputs.t().contiguous(), 0)
        return F.nll_loss(log_p.t(), targets, reduction="none")

    with torch.inference_mode():  # a first call may come from anywhere, evaluation included
        assert matches_reference(via_autograd(reference_cross_entropy), torch.float32, 10)
    assert not matches_reference(via_autograd(reversed_sum), torch.float32, 10)
    assert not matches_reference(via_autograd(unpadded), torch.float32, 10)


def test_transforms_take_the_reference_kernel():
    """Inside torch.func transforms (the vmapped models' oracle, flatness's jvp of grad) the reference runs."""
    seen, labels = [], torch.zeros(MIN_ROWS, dtype=torch.int64)
    vmap(lambda o: seen.append(uses_classes_first(o, labels)) or o.sum())(torch.zeros(2, MIN_ROWS, 10))
    assert seen == [False]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_the_batched_oracle_gives_the_reference_bits(dtype):
    """W2's shapes: a chunk of logistic-regression clients, 50 example slots a step (some short or empty),
    10 classes; every client's gradient and loss are those of the oracle with F.cross_entropy."""
    torch.manual_seed(0)
    features, classes, clients, steps, slots = 24, 10, 70, 2, 50
    model = FlatModel(build_model("logistic", (features,), classes).to(dtype))
    x_data = torch.randn(clients * slots, features, dtype=dtype)
    y_data = torch.randint(0, classes, (clients * slots,))
    index = torch.randint(0, clients * slots, (clients, steps, slots))
    sizes = torch.full((clients, steps), slots)
    sizes[3] = torch.tensor([17, 0])
    batches = Batches(index=index, mask=torch.arange(slots) < sizes[:, :, None], sizes=sizes.numpy(),
                      steps=np.full(clients, steps), x=x_data, y=y_data, slots=slots)
    x = model.initial_vector(dtype, torch.device("cpu")) + 0.3 * torch.randn(clients, model.dim, dtype=dtype)
    oracles = [Batched(model, loss, torch.device("cpu")).oracle(batches) for loss in (cross_entropy,
                                                                                     reference_cross_entropy)]
    for k in range(steps):
        (g, value), (g_ref, value_ref) = (oracle(x[:64], slice(0, 64), k) for oracle in oracles)
        assert torch.count_nonzero(g) > 0
        assert same_bits(g, g_ref) and same_bits(value, value_ref), k


def test_runtime_json_says_what_computes_the_loss(tmp_path):
    """A run records its loss's kernel, the one its (dtype, classes) gets on this CPU."""
    overrides = ["data.name=synthetic", "data.synthetic.shape=[6]", "data.synthetic.num_classes=10",
                 "data.synthetic.examples_per_client=5", "model.name=logistic", "data.num_clients=6",
                 "participation.clients_per_round=3", "run.rounds=1", "eval.every=0", f"run.dir={tmp_path / 'run'}"]
    fedrun.run({}, overrides)
    recorded = json.loads((tmp_path / "run" / "runtime.json").read_text())["loss_kernel"]
    assert recorded == loss_kernel("classification", torch.float32, 10, torch.device("cpu"))
    assert recorded.startswith("classes-first") == exact_here(torch.float32, 10)
