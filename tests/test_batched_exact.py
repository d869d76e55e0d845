"""The ``batched`` strategy is exact (docs/design.md): a client trained alone gives the same bits as the
same client at any position of a chunk of other clients, in the first or a later chunk, full or padded,
float32 and float64, for every built-in model it may train on a CPU (the others: bench/gpu.py) and every kind
of local rule (plain SGD,
momentum, corrected and scaled gradients with weight decay, clipping and a proximal term, AMSGrad,
client Adam, FAFED's two-gradient STORM step); whole runs with the default ``auto`` give the same bits
on 1, 2 and 3 real MPI ranks."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import config_dict, federation, final_models

from fedrun.algorithms.fadamgc import AMSGrad
from fedrun.algorithms.fafed import Storm
from fedrun.algorithms.fedcada import ClientAdam
from fedrun.config import LocalConfig
from fedrun.data.client_block import Batches
from fedrun.models import build_model, uses_randomness
from fedrun.models.linear import Logistic
from fedrun.models.resnet import ResNet18
from fedrun.protocol import LocalPlan
from fedrun.training import gradients
from fedrun.training.classes_first import same_bits
from fedrun.training.dropout import DropoutSeeds
from fedrun.training.flat_model import FlatModel
from fedrun.training.gemm_conv import GemmConv2d, batched_module
from fedrun.training.gradients import FIT, FITTED_CHUNK, TAIL, Chunks, chunk_size, fitted_chunks
from fedrun.training.local_strategy import Vmap, local_strategy
from fedrun.training.losses import cross_entropy, half_squared_error
from fedrun.training.strategy import EXACT_BATCHED

EXAMPLES, STEPS, BATCH = 6, 2, 4
TARGET = 5  # the client whose bits are compared; it takes short batches (3 and 2 examples)
SHAPES = {"linear": (16,), "logistic": (16,), "cnn_mnist": (1, 28, 28), "resnet18": (3, 8, 8)}


def places(real: int) -> list[list[int]]:
    """Blocks that hold TARGET first in a full chunk, in its middle, at its last real row, and in a padded
    second chunk (chunks of ``real`` clients)."""
    others = [c for c in range(real + 6) if c != TARGET]
    half = real // 2
    return [[TARGET, *others[:real - 1]], [*others[:half], TARGET, *others[half:real - 1]],
            [*others[:real - 1], TARGET], [*others[:real + 3], TARGET]]


def probe_batches(x: torch.Tensor, y: torch.Tensor) -> Batches:
    """One client's batch over examples ``x``, ``y``: what fitted_chunks draws its probe clients' examples from."""
    return Batches(index=torch.zeros(1, 1, BATCH, dtype=torch.int64), mask=torch.ones(1, 1, BATCH, dtype=torch.bool),
                   sizes=np.full((1, 1), BATCH), steps=np.ones(1), x=x, y=y, slots=BATCH)


class Block:
    """A model, its flat vector and chunk-and-a-bit of clients of synthetic data with their per-client inputs."""

    def __init__(self, name: str, dtype: torch.dtype) -> None:
        torch.manual_seed(0)
        shape, classes = SHAPES[name], 10
        # resnet18 narrowed to width 2: the same 8 blocks, strides, projections and GroupNorms, 11,420 parameters
        # (a chunk of the 11.2M-parameter network does not fit this machine's test budget)
        module = ResNet18(shape[0], classes, width=2) if name == "resnet18" else build_model(name, shape, classes)
        self.model = FlatModel(module.to(dtype))
        self.x0 = self.model.initial_vector(dtype, torch.device("cpu"))
        d = self.model.dim
        self.loss = half_squared_error if name == "linear" else cross_entropy
        fixed = Chunks.of(chunk_size(torch.device("cpu"), d), d)
        # the chunks batched training uses: fitted (fedrun.training.gradients.fitted_chunks) where this CPU's
        # kernels allow it for the model, on an example set like the one below
        count = (FITTED_CHUNK + 6) * EXAMPLES
        targets = torch.zeros(count, dtype=dtype if name == "linear" else torch.int64)
        probe = probe_batches(torch.randn(count, *shape, dtype=dtype), targets)
        self.chunks = fitted_chunks(self.model, self.loss, probe, fixed) or fixed
        self.real = self.chunks.real
        clients = self.real + 6
        count = clients * EXAMPLES
        self.x = torch.randn(count, *shape, dtype=dtype)
        self.y = torch.randn(count, dtype=dtype) if name == "linear" else torch.randint(0, classes, (count,))
        rng = torch.Generator().manual_seed(1)
        self.index = torch.stack([torch.randint(c * EXAMPLES, (c + 1) * EXAMPLES, (STEPS, BATCH), generator=rng)
                                  for c in range(clients)])
        self.sizes = torch.full((clients, STEPS), BATCH)
        self.sizes[TARGET] = torch.tensor([3, 2])
        self.sizes[2, 1] = 0  # a client that skips its last step (epochs mode)
        self.correction = 1e-2 * torch.randn(clients, d, generator=rng).to(dtype)
        self.scale = torch.rand(clients, generator=rng).to(dtype) + 0.5
        self.moments = {k: 1e-3 * torch.rand(clients, d, generator=rng).to(dtype) for k in ("m", "v")}

    def plan(self, rule: str, rows: torch.Tensor) -> tuple[LocalPlan, LocalConfig]:
        start = self.x0.expand(len(rows), -1)
        cfg = LocalConfig(steps=STEPS, batch_size=BATCH)
        if rule == "momentum":
            return LocalPlan(start=start), LocalConfig(steps=STEPS, batch_size=BATCH, momentum=0.9)
        if rule == "corrected":  # SCAFFOLD's and FedSUM's corrections, FedSUM's per-client scale, FedProx
            cfg = LocalConfig(steps=STEPS, batch_size=BATCH, weight_decay=1e-3, grad_clip=1.0)
            return LocalPlan(start=start, correction=self.correction[rows], lr_scale=self.scale[rows],
                             prox=0.1), cfg
        if rule == "amsgrad":
            return LocalPlan(start=start, correction=self.correction[rows], optimizer=AMSGrad()), cfg
        if rule == "client_adam":
            adam = ClientAdam(0.9, 0.99, 1e-8, first_step=3, a_m=0.0, a_v=0.0)
            return LocalPlan(start=start, optimizer=adam,
                             optimizer_state={k: v[rows] for k, v in self.moments.items()}), cfg
        if rule == "storm":
            storm = Storm(a=torch.ones_like(self.x0), alpha=0.5, beta=0.9, ext=1.0, restart=True)
            return LocalPlan(start=start, optimizer=storm, optimizer_state={"v": self.moments["v"][rows]}), cfg
        return LocalPlan(start=start), cfg

    def trained(self, rows: list[int], rule: str, strategy: str = "batched", fixed: bool = False) -> torch.Tensor:
        """The end points of clients ``rows`` trained as one block by ``strategy`` (``fixed``: batched in fixed
        chunks, never fitted); a model with dropout draws client c's masks from the stream of global client
        100 + c, round 3 (as fedrun's trainer does)."""
        rows_t = torch.as_tensor(rows)
        sizes = self.sizes[rows_t]
        batches = Batches(index=self.index[rows_t], mask=torch.arange(BATCH) < sizes[:, :, None], sizes=sizes,
                          steps=np.full(len(rows), STEPS), x=self.x, y=self.y, slots=BATCH)
        seeds = DropoutSeeds(np.asarray(rows) + 100, 7, 3) if uses_randomness(self.model.module) else None
        plan, cfg = self.plan(rule, rows_t)
        trainer = local_strategy(strategy, self.model, self.loss, self.x.device)
        if fixed:  # the check never runs: the chunks stay fixed
            trainer.fitting_checked = True
        return trainer.train(plan, batches, 0.05, cfg, seeds).x_end


def check_places(name: str, dtype: torch.dtype, rule: str) -> None:
    block = Block(name, dtype)
    alone = block.trained([TARGET], rule)[0]
    assert not torch.equal(alone, block.x0)  # training moved the client: the comparison is not vacuous
    for rows in places(block.real):
        together = block.trained(rows, rule)[rows.index(TARGET)]
        assert torch.equal(together, alone), (rule, rows.index(TARGET), (together - alone).abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("rule", ["sgd", "momentum", "corrected", "amsgrad", "client_adam", "storm"])
@pytest.mark.parametrize("name", ["linear", "logistic"])
def test_dense_models_give_a_client_the_same_bits_at_any_position(name, rule, dtype):
    check_places(name, dtype, rule)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("rule", ["sgd", "momentum", "corrected", "amsgrad", "client_adam", "storm"])
@pytest.mark.parametrize("name", ["linear", "logistic"])
def test_a_block_of_any_size_gives_a_client_the_fixed_chunks_bits(name, rule, dtype):
    """Whatever chunks the check chose (fitted here, where the kernels allow: a block's last call only as large as
    its clients need), a client trained in blocks of 1 to more than a chunk of clients, so in calls of every
    size class, has the bits it has in fixed chunks of 64 rows: so a run has the same bits on any number of
    ranks (whose blocks differ in size)."""
    block = Block(name, dtype)
    others = [c for c in range(block.real + 6) if c != TARGET]
    for count in (1, 2, 9, 40, 63, 64, 70, block.real, block.real + 5):
        rows = [*others[:count - 1], TARGET]
        fitted, fixed = (block.trained(rows, rule, fixed=f)[-1] for f in (False, True))
        assert torch.equal(fitted, fixed), (rule, count, block.chunks)


def test_every_call_of_fitted_chunks_ends_with_the_padding_rows():
    """A fitted chunk's last call holds its clients and at least the fixed chunks' padding rows (no client's
    values in a vectorized loop's scalar remainder), rounded up to FIT rows; every client has one row."""
    for dim in (1, 10, 330):
        chunks = Chunks.of(FITTED_CHUNK, dim, fitted=True)
        pad = chunks.size - chunks.real
        assert pad * dim >= TAIL
        for count in range(1, 3 * FITTED_CHUNK):
            calls = chunks.groups(count)
            assert sum(clients for _, clients in calls) == count
            assert all(rows - clients >= pad and rows % FIT == 0 or rows == chunks.size for rows, clients in calls)
            source, live = chunks.layout(count)
            assert np.array_equal(source[live], np.arange(count)) and len(source) == sum(r for r, _ in calls)


class SizeDependent(Logistic):
    """A written-out model whose outputs depend on how many clients share the call (a kernel that picks its
    algorithm by batch size would do the same, more subtly)."""

    def batched_forward(self, params: dict[str, torch.Tensor], inputs: torch.Tensor) -> torch.Tensor:
        return super().batched_forward(params, inputs) * (1 + 1e-6 * (inputs.shape[0] % 3))


def test_fitted_chunks_only_where_the_kernels_give_the_same_bits_at_any_size():
    """The check is not vacuous: it refuses a model whose results follow the call's size, and every vmapped
    model (its kernels may follow the batch); it admits the linear models where this CPU's kernels allow."""
    data = torch.randn(600, 16)
    batches = probe_batches(data, torch.randint(0, 10, (600,)))
    fixed = Chunks.of(64, 170)
    assert fitted_chunks(FlatModel(SizeDependent(16, 10)), cross_entropy, batches, fixed) is None
    assert fitted_chunks(FlatModel(Vmapped(Logistic(16, 10))), cross_entropy, batches, fixed) is None
    chunks = fitted_chunks(FlatModel(Logistic(16, 10)), cross_entropy, batches, fixed)
    if chunks is None:
        pytest.skip("this CPU's kernels give the logistic model other bits in calls of other sizes: fixed chunks")
    assert chunks.fitted and [rows for rows, _ in chunks.groups(100)] == [104]
    assert [rows for rows, _ in chunks.groups(300)] == [128, 128, 48]


def test_fitted_chunks_of_large_examples_keep_the_fixed_chunks_size(monkeypatch):
    """Where a call of 128 clients would gather more than FITTED_BYTES of examples (large inputs, long batches),
    fitted chunks keep the fixed chunks' 64 rows: the memory of a call does not grow, its last call is fitted."""
    monkeypatch.setattr(gradients, "FITTED_BYTES", 1000)
    batches = probe_batches(torch.randn(600, 16), torch.randint(0, 10, (600,)))
    chunks = fitted_chunks(FlatModel(Logistic(16, 10)), cross_entropy, batches, Chunks.of(64, 170))
    if chunks is None:
        pytest.skip("this CPU's kernels give the logistic model other bits in calls of other sizes: fixed chunks")
    assert chunks.fitted and chunks.groups(100) == [(64, 63), (40, 37)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", ["cnn_mnist", "resnet18"])
def test_models_with_dropout_or_groupnorm_give_a_client_the_same_bits_at_any_position(name, dtype):
    """cnn_mnist (Dropout2d and Dropout): each client's masks come from its own stream, drawn outside the
    batched call. resnet18 (GroupNorm; narrowed, see Block): its block computes convolutions as unfold and
    batched matrix products (fedrun.training.gemm_conv). Either way a client's bits do not depend on its
    place in a chunk or its neighbours. In float64 the batched block also trains like the one-client loop
    to rounding: the same masks (one mask drawn otherwise moves a weight by ~1e-2) and the same
    convolutions; whether those bits are equal depends on the kernels, so that is not asserted."""
    check_places(name, dtype, "momentum")
    if name == "resnet18":  # the block called the products, not vmap's grouped convolution
        layers = list(batched_module(Block(name, dtype).model.module).modules())
        assert any(isinstance(m, GemmConv2d) for m in layers) and not any(isinstance(m, torch.nn.Conv2d)
                                                                          for m in layers)
    if dtype == torch.float64:
        block = Block(name, dtype)
        alone = block.trained([TARGET], "momentum")[0]
        loop = block.trained([TARGET], "momentum", "sequential")[0]
        torch.testing.assert_close(alone, loop, rtol=0, atol=1e-13)


class Vmapped(torch.nn.Module):
    """A model without ``batched_forward``: the same parameters in the same order, batched by vmap."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.inner(inputs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", ["linear", "logistic"])
def test_the_written_out_batched_forward_gives_vmaps_bits(name, dtype):
    """The linear models' ``batched_forward`` replaces vmap for speed only: every client's gradient and loss
    are the bits vmap gives, so no run's result depends on which of the two computed it."""
    block = Block(name, dtype)
    rows = torch.arange(block.real)
    x = block.x0 + 0.1 * torch.randn(len(rows), block.model.dim, dtype=dtype)
    batches = Batches(index=block.index[rows], mask=torch.arange(BATCH) < block.sizes[rows][:, :, None],
                      sizes=block.sizes[rows], steps=np.full(len(rows), STEPS), x=block.x, y=block.y, slots=BATCH)
    vmapped = FlatModel(Vmapped(block.model.module))
    assert hasattr(block.model.module, "batched_forward") and not hasattr(vmapped.module, "batched_forward")
    for k in range(STEPS):
        written, reference = (Vmap(m, block.loss, x.device).oracle(batches)(x, slice(0, len(rows)), k)
                              for m in (block.model, vmapped))
        assert torch.count_nonzero(written[0]) > 0
        assert torch.equal(written[0], reference[0]) and torch.equal(written[1], reference[1]), k


class ForwardOnly(Vmapped):
    """A model with ``batched_forward`` but no ``batched_backward``: its batched gradient is autograd's."""

    def batched_forward(self, params: dict[str, torch.Tensor], inputs: torch.Tensor) -> torch.Tensor:
        inner = {name.removeprefix("inner."): value for name, value in params.items()}
        return self.inner.batched_forward(inner, inputs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", ["linear", "logistic"])
def test_the_written_out_backward_gives_autograds_bits(name, dtype):
    """``batched_backward`` (with the loss's own gradient, fedrun.training.losses.loss_and_grad) replaces
    autograd for speed only: on W2's shapes (a chunk of 64 clients x 50 example slots, enough rows for the
    classes-first cross-entropy where this CPU admits it), some clients short or empty, every gradient and loss
    is the bits of autograd through ``batched_forward`` and of vmap."""
    torch.manual_seed(1)
    features, clients, steps, slots = 32, 64, 2, 50
    task_loss = cross_entropy if name == "logistic" else half_squared_error
    model = FlatModel(build_model(name, (features,), 10).to(dtype))
    x_data = torch.randn(clients * slots, features, dtype=dtype)
    y_data = (torch.randint(0, 10, (clients * slots,)) if name == "logistic"
              else torch.randn(clients * slots, dtype=dtype))
    sizes = torch.full((clients, steps), slots)
    sizes[3], sizes[40] = torch.tensor([17, 0]), torch.tensor([0, 1])
    batches = Batches(index=torch.randint(0, clients * slots, (clients, steps, slots)),
                      mask=torch.arange(slots) < sizes[:, :, None], sizes=sizes.numpy(),
                      steps=np.full(clients, steps), x=x_data, y=y_data, slots=slots)
    x = model.initial_vector(dtype, torch.device("cpu")) + 0.3 * torch.randn(clients, model.dim, dtype=dtype)
    models = [model, FlatModel(ForwardOnly(model.module)), FlatModel(Vmapped(model.module))]
    for k in range(steps):
        (g, loss), *references = (Vmap(m, task_loss, x.device).oracle(batches)(x, slice(0, clients), k)
                                  for m in models)
        assert torch.count_nonzero(g) > 0 and torch.count_nonzero(g[40]) == (k == 1) * model.dim
        for g_ref, loss_ref in references:
            assert same_bits(g, g_ref) and same_bits(loss, loss_ref), k


# The LEAF models and the CIFAR-shaped CNNs are batched by `auto` on CUDA only (on a CPU, where a batched block
# is slower than the loop, they train one client at a time: tests/test_strategies.py). A block of 64 of them
# took 3-8 GiB and minutes a case here, so their positions are checked where they are batched: bench/gpu.py's
# part 4 (GPU_CHECKED), run on the lent GPU. cnn_mnist and a narrowed resnet18 are checked here too (on a
# GPU the masks come from CUDA's dropout kernel, the products from cuBLAS).
GPU_CHECKED = {"lstm_shakespeare_unrolled", "cnn_femnist", "cnn_cifar10", "cnn_svhn", "cnn_mnist", "resnet18"}


def test_the_verified_models_are_the_ones_tested():
    tested = {"linear", "logistic", "cnn_mnist", "resnet18"}
    assert EXACT_BATCHED == tested | GPU_CHECKED
    sys.path.insert(0, str(Path(__file__).parents[1]))
    from bench import gpu

    assert set(gpu.BATCHED_MODELS) == GPU_CHECKED  # bench/gpu.py's part 'batched' checks each on the GPU


BASE = ["data.name=synthetic", "data.synthetic.shape=[12]", "data.synthetic.examples_per_client=15",
        "model.name=logistic", "data.num_clients=40", "participation.clients_per_round=29", "run.rounds=4",
        "eval.every=0", "local.batch_size=8", "local.steps=3", "data.partition=dirichlet"]
RUNS = {"fedavg": BASE, "momentum": [*BASE, "local.momentum=0.9"],
        "scaffold": [*BASE, "algorithm.name=scaffold"], "fedsum": [*BASE, "algorithm.name=fedsum"],
        "fadamgc": [*BASE, "algorithm.name=fadamgc"], "float64": [*BASE, "run.dtype=float64"],
        "linear": [*BASE, "model.name=linear", "data.name=least_squares", "data.partition=natural"],
        # dropout: batched on CPU only when forced (auto batches cnn_mnist on CUDA), 9 of 12 clients a round
        "dropout": [*BASE, "model.name=cnn_mnist", "data.synthetic.shape=[1,28,28]", "local.strategy=batched",
                    "data.num_clients=12", "participation.clients_per_round=9", "run.rounds=2", "local.steps=2",
                    "local.batch_size=4"]}


def test_auto_batches_dense_models_on_cpu_and_keeps_convolutions_and_dropout_sequential():
    cfg = {"run": {"rounds": 1, "device": "cpu"}, "model": {"name": "logistic"}, "eval": {"every": 0},
           "participation": {"pattern": "full"},
           "data": {"name": "synthetic", "num_clients": 4, "synthetic": {"shape": [12]}}}
    assert federation(cfg).strategy == "batched"
    cnn = {**cfg, "model": {"name": "cnn_cifar10"},
           "data": {"name": "synthetic", "num_clients": 4, "synthetic": {"shape": [3, 32, 32]}}}
    assert federation(cnn).strategy == "channels_last"
    dropout = {**cnn, "model": {"name": "cnn_mnist"},
               "data": {"name": "synthetic", "num_clients": 4, "synthetic": {"shape": [1, 28, 28]}}}
    assert federation(dropout).strategy == "channels_last"


@pytest.mark.mpi
def test_default_runs_are_the_same_bits_on_one_two_and_three_ranks(tmp_path):
    """29 of 40 clients a round: on 2 and 3 ranks every chunk holds other clients at other positions; the
    dropout run's clients draw their masks from their own streams wherever they train."""
    one = final_models(0, tmp_path, {**RUNS, "init": [*BASE, "local.lr=0"]})
    two = final_models(2, tmp_path, RUNS)
    three = final_models(3, tmp_path, RUNS)
    for name in RUNS:
        assert np.array_equal(two[name], one[name]), name
        assert np.array_equal(three[name], one[name]), name
    assert np.abs(one["fedavg"] - one["init"]).max() > 1e-3
    # what the same bits rest on: these runs took the batched block (whether its bits also equal the
    # one-client-at-a-time loop's depends on the CPU's kernels, so that is not asserted either way)
    for name, overrides in RUNS.items():
        assert federation(config_dict(overrides)).strategy == "batched", name
