"""ResNet-18 (GroupNorm / BatchNorm), the LEAF FEMNIST CNN and the Shakespeare character LSTM."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from fedrun.models import MODELS, build_model, uses_randomness
from fedrun.models.leaf import CharLSTM


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name, shape, classes, batch, out, params", [
    ("resnet18", (3, 32, 32), 10, torch.rand(2, 3, 32, 32), (2, 10), 11_173_962),
    ("resnet18_bn", (3, 32, 32), 10, torch.rand(2, 3, 32, 32), (2, 10), 11_173_962),
    ("resnet18", (3, 64, 64), 200, torch.rand(1, 3, 64, 64), (1, 200), 11_173_962 - 5130 + 102_600),
    ("cnn_femnist", (1, 28, 28), 62, torch.rand(3, 1, 28, 28), (3, 62), 6_603_710),
    ("lstm_shakespeare", (80,), 81, torch.randint(0, 81, (3, 80)), (3, 81), 820_185),
])
def test_forward_shape_and_parameter_count(name, shape, classes, batch, out, params):
    assert name in MODELS
    torch.manual_seed(0)
    model = build_model(name, shape, classes)
    assert n_params(model) == params
    with torch.no_grad():
        assert model(batch).shape == out
    assert not uses_randomness(model)


def test_groupnorm_resnet_has_no_buffers_batchnorm_has_running_stats():
    gn = build_model("resnet18", (3, 32, 32), 10)
    assert list(gn.buffers()) == []
    norms = [m for m in gn.modules() if isinstance(m, nn.GroupNorm)]
    assert len(norms) == 20 and all(m.num_groups == 2 for m in norms)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in gn.modules())
    bn = build_model("resnet18_bn", (3, 32, 32), 10)
    assert any(name.endswith("running_mean") for name, _ in bn.named_buffers())
    # the CIFAR stem: a 3x3 stride-1 convolution and no max-pool
    assert gn.stem[0].kernel_size == (3, 3) and gn.stem[0].stride == (1, 1)
    assert not any(isinstance(m, nn.MaxPool2d) for m in gn.modules())


def test_leaf_models_have_no_buffers():
    assert list(build_model("cnn_femnist", (1, 28, 28), 62).buffers()) == []
    assert list(build_model("lstm_shakespeare", (80,), 81).buffers()) == []


def test_resnet_trains_one_step():
    torch.manual_seed(0)
    model = build_model("resnet18", (3, 32, 32), 10)
    x, y = torch.rand(2, 3, 16, 16), torch.tensor([0, 3])
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_unrolled_lstm_matches_fused_lstm():
    torch.manual_seed(0)
    fused = build_model("lstm_shakespeare", (80,), 81)
    unrolled = build_model("lstm_shakespeare_unrolled", (80,), 81)
    unrolled.load_state_dict(fused.state_dict())  # same parameter names
    x = torch.randint(0, 81, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(unrolled(x), fused(x), rtol=1e-4, atol=1e-5)


def test_unrolled_lstm_vectorizes_over_clients():
    torch.manual_seed(0)
    model = CharLSTM(81, 81, hidden=16, unrolled=True)
    clients = 2
    params = {k: torch.stack([v.detach() + 0.01 * c for c in range(clients)])
              for k, v in model.named_parameters()}
    x = torch.randint(0, 81, (clients, 4, 6))
    y = torch.randint(0, 81, (clients, 4))

    def loss(p, xb, yb):
        return nn.functional.cross_entropy(functional_call(model, p, (xb,)), yb)

    grads = vmap(grad(loss))(params, x, y)
    for c in range(clients):
        one = grad(loss)({k: v[c] for k, v in params.items()}, x[c], y[c])
        for k in params:
            torch.testing.assert_close(grads[k][c], one[k], rtol=1e-4, atol=1e-6)
