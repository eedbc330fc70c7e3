"""Max-pooling before ReLU (torch_neuronx/compile/relu_pool.py) and results written in place:
``max_pool(relu(y))`` runs as ``relu(max_pool(y))`` with the same values and gradients, bit for
bit; channels-last results go straight into the caller's tensors."""
import copy

import pytest
import torch
import torch.nn.functional as F

import torch_neuronx  # noqa: F401
from helpers import compiled_tier_test
from torch_neuronx.compile import compile_metrics
from torch_neuronx.testing.models import SmallCNN

CL = torch.channels_last


@pytest.fixture(autouse=True)
def fresh(tmp_path_factory, monkeypatch, request):
    yield from compiled_tier_test(tmp_path_factory, monkeypatch, request)


def _hard_input(shape, seed):
    """Feature maps with the windows where the two forms could part: every value negative (batch
    0), zeros tied with negatives (batch 1), a NaN (batch 2), and ordinary values."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    x[0] -= 10
    x[1, :, :6, :6] = -x[1, :, :6, :6].abs()
    x[1, :, :6:2, :6:2] = 0.0
    x[2, 1, 3, 3] = float("nan")
    return x


def _exact(a, b):
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("window", [(2, 2, 0), (3, 2, 1)], ids=["disjoint", "overlapping"])
def test_pooling_before_relu_gives_eager_values_and_gradients_bit_for_bit(window):
    k, s, p = window

    def f(x):
        return F.max_pool2d(F.relu(x), k, s, p) * 3

    x = _hard_input((4, 8, 24 + k, 24 + k), seed=k)
    g = torch.randn(f(x).shape, generator=torch.Generator().manual_seed(1))
    xr = x.clone().requires_grad_()
    ref = f(xr)
    ref.backward(g)
    xd = x.to("neuron").requires_grad_()
    got = torch.compile(f, backend="neuron")(xd)
    got.backward(g.to("neuron"))
    _exact(got.cpu(), ref.detach())
    _exact(xd.grad.cpu(), xr.grad)
    m = compile_metrics()
    assert m["relu_pool_swaps"] == 1, m
    # Inference: the same rewrite, the same values.
    with torch.no_grad():
        _exact(torch.compile(f, backend="neuron")(x.to("neuron")).cpu(), ref.detach())
    assert compile_metrics()["relu_pool_swaps"] == 2


def test_relu_read_elsewhere_or_indices_returned_are_left_alone():
    # ReLU's output also feeds the result, or the user takes the window indices (which the
    # rewrite would change for windows of non-positive values): traced as written.
    def both(x):
        r = F.relu(x)
        return F.max_pool2d(r, 2).sum() + r.mean()

    def indices(x):
        return F.max_pool2d(F.relu(x), 2, return_indices=True)

    x = _hard_input((3, 4, 14, 14), seed=3)
    x[2, 1, 3, 3] = 0.5
    xr, xd = x.clone().requires_grad_(), x.to("neuron").requires_grad_()
    ref, got = both(xr), torch.compile(both, backend="neuron")(xd)
    ref.backward()
    got.backward()
    torch.testing.assert_close(got.cpu(), ref.detach())
    _exact(xd.grad.cpu(), xr.grad)
    with torch.no_grad():
        vals, idx = torch.compile(indices, backend="neuron")(x.to("neuron"))
    ref_vals, ref_idx = indices(x)
    _exact(vals.cpu(), ref_vals)
    assert torch.equal(idx.cpu(), ref_idx)  # all-negative windows point at their first zero
    assert compile_metrics()["relu_pool_swaps"] == 0


def test_cnn_forward_saves_no_relu_output():
    # The benchmark's CNN at batch 8, 64x64: each of its three ReLU + 2x2 max-pool pairs is
    # rewritten, the step matches CPU eager (channels-last, as the compiled graph runs), and the
    # device holds less between forward and backward than before the rewrite (the three full-size
    # ReLU outputs, 8x(32x64x64 + 64x32x32 + 128x16x16) floats = 7 MiB, are not kept).
    torch.manual_seed(0)
    net = SmallCNN().train()
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(8, 3, 64, 64, generator=g), torch.randint(0, 10, (8,), generator=g)
    dev = copy.deepcopy(net).to("neuron")
    ref_model = copy.deepcopy(net).to(memory_format=CL)
    ref = F.cross_entropy(ref_model(x.contiguous(memory_format=CL)), y)
    ref.backward()
    f = torch.compile(dev, backend="neuron")
    xd, yd = x.to("neuron"), y.to("neuron")
    torch.neuron.synchronize()
    before = torch.neuron.memory_allocated()
    out = f(xd)
    torch.neuron.synchronize()
    held = torch.neuron.memory_allocated() - before
    loss = F.cross_entropy(out, yd)
    loss.backward()
    torch.testing.assert_close(loss.cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(ref_model.named_parameters(), dev.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-4, atol=1e-4, msg=name)
    assert compile_metrics()["relu_pool_swaps"] == 3
    # Saved: conv inputs and outputs (batch norm's input), pooled values and indices, stats.
    relu_outputs = 8 * (32 * 64 * 64 + 64 * 32 * 32 + 128 * 16 * 16) * 4
    conv_outputs = relu_outputs
    assert held < conv_outputs + relu_outputs, held


def test_channels_last_results_are_written_in_place():
    # A channels-last feature map's ReLU, pooled values and window indices, all returned: each is
    # written by its kernel straight into the tensor the caller gets (ReLU through CPU's own
    # kernel, clamp_min's out=; pooling through its out= with two results), none copied there at
    # the end of the run.
    def f(x):
        r = F.relu(x)
        v, i = F.max_pool2d(r, 2, return_indices=True)
        return r, v, i

    x = torch.randn(4, 16, 40, 40).contiguous(memory_format=CL)
    with torch.no_grad():
        got = torch.compile(f, backend="neuron")(x.to("neuron"))
    for a, b in zip(got, f(x)):
        assert a.stride() == b.stride()
        torch.testing.assert_close(a.cpu(), b, rtol=0, atol=0)
    m = compile_metrics()
    assert m["output_copies"] == 0 and m["out_calls"] >= 2, m


def _output_copies_run(fn, *args):
    """Runs ``fn`` once under torch.profiler: its results and the device's end-of-run copies."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as p:
        out = fn(*args)
        torch.neuron.synchronize()
    return out, sum(1 for e in p.events() if e.name == "neuron::output_copy")


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, CL], ids=["nchw", "channels_last"])
def test_returned_convolution_is_computed_in_the_callers_tensor(memory_format):
    # A convolution has no out= kernel (ATen's convolution.out computes and copies): the graph's
    # returned feature maps (16x64x48x48: 9 MiB) are computed straight into the tensors the
    # caller gets, through memory lent to the op's allocation; nothing is copied at the end.
    torch.manual_seed(0)
    w = torch.randn(64, 32, 3, 3) * 0.1
    x = torch.randn(16, 32, 48, 48).contiguous(memory_format=memory_format)

    def f(x, w):
        return F.conv2d(x, w, padding=1), F.conv2d(x, w, padding=2, dilation=2)

    cf = torch.compile(f, backend="neuron")
    xd, wd = x.to("neuron"), w.to("neuron")
    cf(xd, wd)
    torch.neuron.synchronize()
    placed = torch_neuronx.metrics()["kernel_scratch"]["placed"]
    got, copies = _output_copies_run(cf, xd, wd)
    for a, b in zip(got, f(x, w)):
        assert a.stride() == b.stride()
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-4)
    assert copies == 0
    assert torch_neuronx.metrics()["kernel_scratch"]["placed"] - placed == 2
    assert compile_metrics()["output_copies"] == 0


def test_results_of_equal_size_from_one_kernel_stay_apart():
    # var_mean's two results have one size: the memory lent for the first must not end up under
    # the second too (each result checked against CPU, bit for bit, over several calls).
    x = torch.randn(8, 65536)
    cf = torch.compile(lambda x: torch.var_mean(x, dim=0), backend="neuron")
    xd = x.to("neuron")
    for k in range(3):
        var, mean = cf(xd * (k + 1))
        ref_var, ref_mean = torch.var_mean(x * (k + 1), dim=0)
        assert torch.equal(var.cpu(), ref_var) and torch.equal(mean.cpu(), ref_mean)
    assert compile_metrics()["output_copies"] <= 1
