"""The compiler's layout pass: convolution graphs run channels-last (torch_neuronx/compile/layout.py)."""
import copy
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_neuronx  # noqa: F401
from helpers import compiled_tier_test
from torch_neuronx.compile import compile_metrics, layout
from torch_neuronx.testing.models import SmallCNN

CL = torch.channels_last


@pytest.fixture(autouse=True)
def fresh(tmp_path_factory, monkeypatch, request):
    yield from compiled_tier_test(tmp_path_factory, monkeypatch, request)


def _step(model, x, y):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return loss


def _data(batch, size, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, size, size, generator=g), torch.randint(0, 10, (batch,), generator=g)


def _step_against_cpu(net, x, y):
    """One compiled training step of a copy of ``net`` on neuron against CPU eager run
    channels-last (the layout the compiled graph runs): the loss and gradients match, and each
    gradient has its parameter's layout."""
    dev = copy.deepcopy(net).to("neuron")
    ref_model = copy.deepcopy(net).to(memory_format=CL)
    ref = _step(ref_model, x.contiguous(memory_format=CL), y)
    got = _step(torch.compile(dev, backend="neuron"), x.to("neuron"), y.to("neuron"))
    torch.testing.assert_close(got.cpu(), ref, rtol=1e-5, atol=1e-5)
    _compare_grads(ref_model, dev)
    return ref_model, dev


def _compare_grads(cpu_model, dev_model):
    for (name, p), q in zip(cpu_model.named_parameters(), dev_model.parameters()):
        assert q.grad.stride() == q.stride(), name  # the parameter's layout, not the pass's
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-4, atol=1e-4, msg=name)


def test_cnn_training_step_runs_channels_last_and_matches_cpu():
    # The benchmark's CNN at batch 16, 64x64 (2M-element activations). The compiled step's
    # convolutions (3 forward, 3 backward) read channels-last inputs, the forward's saved
    # activations reach the backward channels-last, and what the user sees (loss, gradients,
    # running stats) matches CPU eager run in the same layout (the summation order a layout
    # implies differs between NCHW and NHWC kernels).
    torch.manual_seed(0)
    ref_model, dev = _step_against_cpu(SmallCNN().train(), *_data(16, 64))
    for a, b in zip(ref_model.buffers(), dev.buffers()):
        torch.testing.assert_close(b.cpu(), a, rtol=1e-5, atol=1e-6)
    m = compile_metrics()
    assert m["channels_last_convolutions"] == 6, m
    # The forward's saved activations reach the backward channels-last, all of them.
    assert m["channels_last_saved"] == m["channels_last_received"] >= 3, m
    assert m["library_calls"].get("aten::convolution_backward") == 3, m["library_calls"]


def test_feature_maps_returned_keep_the_traced_layout():
    # A model returning a convolution's feature map: the user gets the strides eager gives
    # (contiguous), in inference and in a training forward, though the graph ran channels-last.
    torch.manual_seed(0)
    conv = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 8, 3, padding=1))
    x = torch.randn(4, 3, 48, 48)
    dev = copy.deepcopy(conv).to("neuron")
    f = torch.compile(dev, backend="neuron")
    with torch.no_grad():
        out = f(x.to("neuron"))
    ref = conv(x)
    assert out.stride() == ref.stride()
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4)
    out = f(x.to("neuron"))
    assert out.stride() == ref.stride() and out.requires_grad
    out.square().sum().backward()
    conv(x).square().sum().backward()
    for (name, p), q in zip(conv.named_parameters(), dev.parameters()):
        assert q.grad.stride() == p.grad.stride(), name
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-3, atol=1e-3, msg=name)
    assert compile_metrics()["channels_last_convolutions"] >= 2 + 2 + 2


def test_a_flatten_traced_on_contiguous_strides_reads_a_copy_back():
    # nn.Flatten after the last convolution is a view traced on NCHW strides, which a
    # channels-last feature map cannot take: the pass copies the map back for it (and only it).
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, padding=1),
                        nn.ReLU(), nn.Flatten(), nn.Linear(8 * 16 * 16, 10))
    _step_against_cpu(net, *_data(8, 32, seed=2))
    assert compile_metrics()["channels_last_convolutions"] == 4  # the pass ran on both graphs


def test_backward_left_as_traced_still_reads_channels_last_activations(monkeypatch):
    # If the pass leaves a backward as traced, the channels-last activations its forward saved
    # are copied back into the layout the backward was traced with before anything reads them.
    real = layout._rewrite

    def forward_only(gm, kind, *args):
        return None if kind == "backward" else real(gm, kind, *args)

    monkeypatch.setattr(layout, "_rewrite", forward_only)
    torch.manual_seed(0)
    _step_against_cpu(SmallCNN(widths=(8, 16)).train(), *_data(4, 32, seed=1))
    m = compile_metrics()
    assert m["channels_last_convolutions"] == 2, m  # the forward's only
    assert m["channels_last_saved"] == m["channels_last_received"] >= 2, m


def test_random_ops_after_a_convolution_draw_as_eager():
    # Random ops draw in memory order: given a channels-last input, rand_like's draws would land
    # on other elements than eager's. Seeded ops read their inputs in the traced layout.
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 16, 3, padding=1).to("neuron")

    def noisy(x):
        y = conv(x)
        return y * (torch.rand_like(y) > 0.5)

    x = torch.randn(4, 3, 24, 24).to("neuron")
    torch.neuron.manual_seed(3)
    eager = noisy(x)
    torch.neuron.manual_seed(3)
    compiled = torch.compile(noisy, backend="neuron")(x)
    assert torch.equal(compiled.cpu() == 0, eager.cpu() == 0)  # the same draws on the same elements
    torch.testing.assert_close(compiled.cpu(), eager.cpu(), rtol=1e-4, atol=1e-5)
    assert compile_metrics()["channels_last_convolutions"] == 2  # forward and backward


def test_as_strided_of_a_feature_map_reads_the_traced_layout():
    # as_strided reads the strides it was traced with: it gets the map in the traced layout.
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3, padding=1)
    x = torch.randn(2, 3, 12, 12)

    def patches(conv, x):
        y = conv(x)
        n, c, h, w = y.shape
        return y.as_strided((n, c, h - 1, w - 1, 2, 2), (c * h * w, h * w, w, 1, w, 1)).sum((4, 5))

    dev = copy.deepcopy(conv).to("neuron")
    with torch.no_grad():
        ref = patches(conv, x)
        got = torch.compile(lambda x: patches(dev, x), backend="neuron")(x.to("neuron"))
    torch.testing.assert_close(got.cpu(), ref, rtol=1e-4, atol=1e-4)
    assert compile_metrics()["channels_last_convolutions"] == 1


def test_dynamic_shapes_keep_the_traced_layout():
    # Sizes known only at run time: the pass leaves the graph as traced.
    conv = nn.Conv2d(3, 4, 3)
    f = torch.compile(copy.deepcopy(conv).to("neuron"), backend="neuron", dynamic=True)
    for n in (2, 3):
        x = torch.randn(n, 3, 10, 10)
        with torch.no_grad():
            torch.testing.assert_close(f(x.to("neuron")).cpu(), conv(x), rtol=1e-4, atol=1e-4)
    assert compile_metrics()["channels_last_convolutions"] == 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))


@pytest.mark.parametrize("layout", ["input", "weights", "both"])
def test_channels_last_models_return_the_layout_eager_returns(layout):
    # A channels-last input or model (model.to(memory_format=torch.channels_last)): the compiled
    # model's output and every gradient have the strides eager neuron gives them (CPU's rule: a
    # 2-d convolution returns channels-last when its input or weight is), not the NCHW that
    # PyTorch's fake convolution assumes for devices it does not know.
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(16, 4, 1))
    x = torch.randn(4, 8, 20, 20)
    if layout in ("input", "both"):
        x = x.contiguous(memory_format=CL)
    if layout in ("weights", "both"):
        net = net.to(memory_format=CL)
    eager, dev = copy.deepcopy(net).to("neuron"), copy.deepcopy(net).to("neuron")
    xe, xc = x.to("neuron").requires_grad_(), x.to("neuron").requires_grad_()
    ye = eager(xe)
    yc = torch.compile(dev, backend="neuron")(xc)
    assert ye.is_contiguous(memory_format=CL) and yc.stride() == ye.stride()
    ye.square().sum().backward()
    yc.square().sum().backward()
    assert xc.grad.stride() == xe.grad.stride()
    torch.testing.assert_close(yc.cpu(), ye.cpu(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(xc.grad.cpu(), xe.grad.cpu(), rtol=1e-4, atol=1e-4)
    for (name, p), q in zip(eager.named_parameters(), dev.parameters()):
        assert q.grad.stride() == p.grad.stride(), name
        torch.testing.assert_close(q.grad.cpu(), p.grad.cpu(), rtol=1e-3, atol=1e-3, msg=name)
