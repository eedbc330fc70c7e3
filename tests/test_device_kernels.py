"""Device kernels that run in place of an op's CPU kernel (csrc/backend/device_kernels.h):
max_pool2d_with_indices over (N)CHW inputs gives CPU's values and indices bit for bit, its backward
over disjoint windows CPU's gradients, eager and compiled, and each is counted where it ran.
(bernoulli's kernel: tests/test_rng.py.)"""
import pytest
import torch
import torch.nn.functional as F

import torch_neuronx

OP = "aten::max_pool2d_with_indices"
BACKWARD = "aten::max_pool2d_with_indices_backward"


def calls(op=OP):
    torch.neuron.synchronize()  # (counted when the kernel ran)
    return torch_neuronx.metrics()["ops"].get(op, {}).get("device_kernel", 0)


def activations(shape, dtype=torch.float32, seed=0):
    """Values with ties (small integers), NaNs and -inf, as pooling meets them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-4, 4, shape, generator=g).to(dtype)
    x.view(-1)[::97] = float("nan")
    x.view(-1)[11::89] = -float("inf")
    return x


def same_bits(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    ints = {4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.view(ints), b.view(ints))


CASES = {  # name: (input shape, max_pool2d arguments)
    "cnn_2x2": ((32, 32, 64, 64), dict(kernel_size=2)),
    "resnet_stem_3x3_s2_p1": ((8, 64, 112, 112), dict(kernel_size=3, stride=2, padding=1)),
    "rectangular_ceil": ((4, 3, 17, 19), dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 0), ceil_mode=True)),
    "dilated": ((2, 5, 40, 41), dict(kernel_size=3, stride=1, padding=1, dilation=2)),
    "unbatched": ((9, 31, 33), dict(kernel_size=2, stride=2, ceil_mode=True)),
    "odd_2x2": ((3, 4, 7, 9), dict(kernel_size=2)),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_max_pool_device_kernel_gives_cpus_values_and_indices(case, dtype):
    shape, kw = CASES[case]
    x = activations(shape, dtype)
    before = calls()
    ref, ref_idx = F.max_pool2d(x, return_indices=True, **kw)
    out, idx = F.max_pool2d(x.to("neuron"), return_indices=True, **kw)
    assert calls() == before + 1
    assert torch.equal(idx.cpu(), ref_idx) and same_bits(out.cpu(), ref)


def test_channels_last_and_bfloat16_take_cpus_kernel_with_the_same_results():
    x = activations((4, 8, 16, 16))
    for t in (x.contiguous(memory_format=torch.channels_last), x.bfloat16()):
        before = calls()
        ref, ref_idx = F.max_pool2d(t, 2, return_indices=True)
        out, idx = F.max_pool2d(t.to("neuron"), 2, return_indices=True)
        assert calls() == before
        assert torch.equal(idx.cpu(), ref_idx) and torch.equal(out.cpu().isnan(), ref.isnan())
        assert torch.equal(out.cpu().nan_to_num(), ref.nan_to_num())


def test_pooling_gradients_and_a_compiled_cnn_step_match_cpu():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                              torch.nn.Conv2d(16, 8, 3, padding=1), torch.nn.MaxPool2d(3, 2, 1), torch.nn.Flatten(),
                              torch.nn.Linear(8 * 8 * 8, 10))
    x = torch.randn(16, 3, 32, 32)
    grads = {}
    for device, compiled in (("cpu", False), ("neuron", False), ("neuron", True)):
        m = torch.nn.Sequential(*[layer for layer in net]).to(device) if device == "cpu" else \
            __import__("copy").deepcopy(net).to(device)
        f = torch.compile(m, backend="neuron") if compiled else m
        before, before_bw = calls(), calls(BACKWARD)
        f(x.to(device)).square().sum().backward()
        if device == "neuron":
            # Eager: both pools forward (NCHW), the 2x2 one's backward. Compiled: the graph runs
            # channels-last (the layout pass), where ATen's pooling is vectorized; the 2x2
            # backward is ours in either layout.
            assert calls() >= before + (0 if compiled else 2), compiled
            assert calls(BACKWARD) == before_bw + 1, compiled
        grads[device, compiled] = [p.grad.cpu() for p in m.parameters()]
        m.zero_grad(set_to_none=True)
    for a, b in zip(grads["cpu", False], grads["neuron", False]):
        assert torch.equal(a, b)  # eager: the same kernels (and the same pooling indices) as CPU
    for a, b in zip(grads["cpu", False], grads["neuron", True]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


BACKWARD_CASES = {  # name: (input shape, window); stride = window
    "cnn_2x2": ((32, 32, 64, 64), 2),
    "odd_2x2_floor": ((3, 4, 7, 9), 2),
    "odd_3x3_ceil": ((2, 5, 10, 11), 3),
    "unbatched_2x2": ((9, 31, 33), 2),
}


@pytest.mark.parametrize("case,layout", [(c, lay) for c in sorted(BACKWARD_CASES) for lay in ("nchw", "channels_last")
                                         if lay == "nchw" or len(BACKWARD_CASES[c][0]) == 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_max_pool_backward_device_kernel_gives_cpus_gradients(case, layout, dtype):
    shape, k = BACKWARD_CASES[case]
    ceil = case.endswith("ceil")
    x = activations(shape, dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    out, idx = F.max_pool2d(x, k, return_indices=True, ceil_mode=ceil)
    go = activations(out.shape, dtype, seed=1)
    go.view(-1)[5::13] = -0.0  # (ATen adds into zeros: -0 comes back +0)
    if layout == "channels_last":
        go = go.contiguous(memory_format=torch.channels_last)
    args = ([k, k], [k, k], [0, 0], [1, 1], ceil)
    ref = torch.ops.aten.max_pool2d_with_indices_backward(go, x, *args, idx)
    before = calls(BACKWARD)
    got = torch.ops.aten.max_pool2d_with_indices_backward(go.to("neuron"), x.to("neuron"), *args, idx.to("neuron"))
    assert calls(BACKWARD) == before + 1
    assert got.stride() == ref.stride() and same_bits(got.cpu(), ref)


def test_max_pool_backward_with_foreign_indices_takes_cpus_kernel():
    # Indices that are not the forward's (one points outside its window): ATen's scatter is the
    # definition, so ours steps aside and the result is CPU's.
    x = activations((2, 3, 8, 8))
    out, idx = F.max_pool2d(x, 2, return_indices=True)
    idx = idx.clone()
    idx[0, 0, 0, 0] = 63  # the last element of the plane, in another window
    go = torch.randn(out.shape)
    args = ([2, 2], [2, 2], [0, 0], [1, 1], False)
    ref = torch.ops.aten.max_pool2d_with_indices_backward(go, x, *args, idx)
    before = calls(BACKWARD)
    got = torch.ops.aten.max_pool2d_with_indices_backward(go.to("neuron"), x.to("neuron"), *args, idx.to("neuron"))
    assert calls(BACKWARD) == before
    assert torch.equal(got.cpu(), ref)


def test_max_pool_backward_with_an_empty_window_grid_raises_cpus_error():
    # A 1x1 plane under a 2x2 window: no window fits. ATen's check raises; so must we.
    x, go, idx = torch.randn(1, 2, 1, 1), torch.randn(1, 2, 0, 0), torch.zeros(1, 2, 0, 0, dtype=torch.long)
    args = ([2, 2], [2, 2], [0, 0], [1, 1], False)
    with pytest.raises(RuntimeError, match="Output size is too small"):
        torch.ops.aten.max_pool2d_with_indices_backward(go, x, *args, idx)
    with pytest.raises(RuntimeError, match="Output size is too small"):
        torch.ops.aten.max_pool2d_with_indices_backward(go.to("neuron"), x.to("neuron"), *args, idx.to("neuron"))
        torch.neuron.synchronize()
