"""Copies between host and neuron and between neuron devices, compared bitwise with CPU."""
import subprocess
import sys
import textwrap

import pytest
import torch

DEV = torch.device("neuron")
TWO_DEVICES = torch.neuron.device_count() >= 2

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]


def make(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=g)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    lo, hi = (0, 200) if dtype == torch.uint8 else (-100, 100)
    return torch.randint(lo, hi, shape, generator=g, dtype=dtype)


def assert_bitwise(actual, expected):
    """Same dtype, shape and bytes (NaN-safe) as the CPU tensor."""
    assert actual.device.type == "cpu"
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    a = actual.contiguous().reshape(-1)
    e = expected.contiguous().reshape(-1)
    if a.numel() == 0:
        return
    if a.dtype == torch.bool:
        assert torch.equal(a, e)
    else:
        assert torch.equal(a.view(torch.uint8), e.view(torch.uint8))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_roundtrip_bitwise(dtype):
    x = make((5, 7), dtype)
    d = x.to(DEV)
    assert d.device.type == "neuron" and d.dtype == dtype and d.shape == x.shape
    assert_bitwise(d.cpu(), x)


def test_roundtrip_special_float_values():
    x = torch.tensor([float("nan"), float("inf"), float("-inf"), -0.0, 0.0, 1e-45, 3.4e38, -1.5])
    assert_bitwise(x.to(DEV).cpu(), x)
    x64 = torch.tensor([float("nan"), -0.0, 5e-324, 1.7e308], dtype=torch.float64)
    assert_bitwise(x64.to(DEV).cpu(), x64)


def test_h2d_copy_into_existing():
    x = make((4, 6), torch.float32)
    d = torch.empty(4, 6, device=DEV)
    r = d.copy_(x)
    assert r is d
    assert_bitwise(d.cpu(), x)


def test_d2h_copy_into_existing():
    x = make((4, 6), torch.float32)
    d = x.to(DEV)
    h = torch.full((4, 6), -1.0)
    h.copy_(d)
    assert_bitwise(h, x)


def test_d2d_same_device():
    x = make((8, 3), torch.float32)
    a = x.to(DEV)
    b = torch.zeros(8, 3, device=DEV)
    b.copy_(a)
    assert b.data_ptr() != a.data_ptr()
    a.add_(1)  # later write to the source does not reach the copy
    assert_bitwise(b.cpu(), x)
    assert_bitwise(a.cpu(), x + 1)
    c = a.clone()
    assert c.data_ptr() != a.data_ptr()
    assert_bitwise(c.cpu(), x + 1)


@pytest.mark.skipif(not TWO_DEVICES, reason="needs two neuron devices")
def test_d2d_across_devices():
    x = make((16, 5), torch.float64)
    a = x.to("neuron:0")
    b = a.to("neuron:1")
    assert b.device == torch.device("neuron:1")
    assert_bitwise(b.cpu(), x)
    # copy_ into an existing tensor on the other device, after queued work on the source
    a.mul_(3)
    c = torch.empty(16, 5, dtype=torch.float64, device="neuron:1")
    c.copy_(a)
    assert_bitwise(c.cpu(), x * 3)
    # and back again, with a transposed destination
    back = torch.empty(5, 16, dtype=torch.float64, device="neuron:0").t()
    back.copy_(c)
    assert_bitwise(back.cpu(), x * 3)


@pytest.mark.skipif(not TWO_DEVICES, reason="needs two neuron devices")
def test_d2d_across_devices_then_compute():
    x = make((6, 6), torch.float32)
    b = x.to("neuron:0").to("neuron:1")
    y = (b @ b).cpu()
    assert_bitwise(y, x @ x)


def test_noncontiguous_sources():
    x = make((6, 8), torch.float32)
    d = x.to(DEV)
    for f in (lambda t: t.t(), lambda t: t[:, ::2], lambda t: t[1:5, 2:7], lambda t: t.unsqueeze(0).expand(3, 6, 8),
              lambda t: t.t()[::3]):
        src = f(d)
        assert not src.is_contiguous()
        assert_bitwise(src.cpu(), f(x))
        # h2d from non-contiguous host source
        hd = f(x).to(DEV)
        assert_bitwise(hd.cpu(), f(x))


def test_transposed_destination_h2d():
    x = make((5, 9), torch.float32)
    dst = torch.zeros(9, 5, device=DEV).t()
    assert not dst.is_contiguous()
    dst.copy_(x)
    assert_bitwise(dst.cpu(), x)
    assert_bitwise(dst.t().contiguous().cpu(), x.t().contiguous())


def test_transposed_destination_d2h():
    x = make((5, 9), torch.int64)
    d = x.to(DEV)
    h = torch.zeros(9, 5, dtype=torch.int64).t()
    h.copy_(d)
    assert_bitwise(h, x)
    # transposed device source into transposed host destination
    h2 = torch.zeros(5, 9, dtype=torch.int64).t()
    h2.copy_(d.t())
    assert_bitwise(h2, x.t())


def test_strided_destination_d2d():
    x = make((4, 10), torch.float32)
    base = torch.zeros(4, 20, device=DEV)
    base[:, ::2].copy_(x.to(DEV))
    expected = torch.zeros(4, 20)
    expected[:, ::2] = x
    assert_bitwise(base.cpu(), expected)


def test_broadcasting_copy():
    row = torch.arange(5, dtype=torch.float32)
    d = torch.empty(3, 5, device=DEV)
    d.copy_(row)  # host -> device, broadcast
    assert_bitwise(d.cpu(), row.expand(3, 5))
    e = torch.empty(4, 5, device=DEV)
    e.copy_(d[0])  # device -> device, broadcast
    assert_bitwise(e.cpu(), row.expand(4, 5))


CONVERSIONS = [
    (torch.float32, torch.float64), (torch.float64, torch.float32), (torch.float32, torch.float16),
    (torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32), (torch.float32, torch.int32),
    (torch.int64, torch.float32), (torch.int32, torch.int8), (torch.float32, torch.bool),
    (torch.bool, torch.float32), (torch.float32, torch.complex64), (torch.complex64, torch.complex128),
    (torch.int64, torch.uint8),
]


@pytest.mark.parametrize("src_dtype,dst_dtype", CONVERSIONS, ids=lambda d: str(d).replace("torch.", ""))
def test_dtype_converting_copies(src_dtype, dst_dtype):
    x = make((6, 4), src_dtype, seed=3)
    if src_dtype.is_floating_point and not dst_dtype.is_floating_point and not dst_dtype.is_complex \
            and dst_dtype != torch.bool:
        x = x * 20  # meaningful integer parts; stay in range of int8/int32
    expected = x.to(dst_dtype)
    # h2d converting (Tensor.to with device and dtype)
    assert_bitwise(x.to(DEV, dst_dtype).cpu(), expected)
    # h2d copy_ into a device tensor of another dtype
    d = torch.empty(6, 4, dtype=dst_dtype, device=DEV)
    d.copy_(x)
    assert_bitwise(d.cpu(), expected)
    # d2d converting
    src_d = x.to(DEV)
    assert_bitwise(src_d.to(dst_dtype).cpu(), expected)
    e = torch.empty(6, 4, dtype=dst_dtype, device=DEV)
    e.copy_(src_d)
    assert_bitwise(e.cpu(), expected)
    # d2h converting
    assert_bitwise(src_d.to("cpu", dst_dtype), expected)
    h = torch.empty(6, 4, dtype=dst_dtype)
    h.copy_(src_d)
    assert_bitwise(h, expected)


def test_non_blocking_pinned_h2d_then_synchronize():
    x = make((256, 64), torch.float32)
    p = x.pin_memory()
    assert p.is_pinned()
    d = p.to(DEV, non_blocking=True)
    torch.neuron.synchronize()
    assert_bitwise(d.cpu(), x)


def test_non_blocking_pinned_d2h_then_synchronize():
    x = make((128, 33), torch.float64)
    d = x.to(DEV) * 2
    out = torch.empty(128, 33, dtype=torch.float64).pin_memory()
    out.copy_(d, non_blocking=True)
    torch.neuron.synchronize()
    assert_bitwise(out, x * 2)
    # Tensor.to(cpu, non_blocking) followed by synchronize
    h = (d + 1).to("cpu", non_blocking=True)
    torch.neuron.synchronize()
    assert_bitwise(h, x * 2 + 1)


def test_non_blocking_pageable_is_correct_without_sync():
    x = make((64, 64), torch.float32)
    d = x.to(DEV, non_blocking=True)  # pageable: the copy waits, data is safe
    x2 = x.clone()
    x.zero_()
    assert_bitwise(d.cpu(), x2)


def test_pinned_source_reuse_after_sync():
    p = torch.empty(1000).pin_memory()
    results = []
    for i in range(4):
        p.fill_(float(i))
        d = p.to(DEV, non_blocking=True)
        torch.neuron.synchronize()
        results.append(d)
    for i, d in enumerate(results):
        assert_bitwise(d.cpu(), torch.full((1000,), float(i)))


def test_copy_into_slice_of_neuron_tensor():
    base_cpu = make((6, 6), torch.float32)
    base = base_cpu.to(DEV)
    src = make((2, 3), torch.float32, seed=7)
    base[1:3, 2:5].copy_(src)
    base_cpu[1:3, 2:5].copy_(src)
    assert_bitwise(base.cpu(), base_cpu)
    # copy from device into a column view (non-contiguous)
    col = make((6,), torch.float32, seed=8)
    base[:, 4].copy_(col.to(DEV))
    base_cpu[:, 4].copy_(col)
    assert_bitwise(base.cpu(), base_cpu)
    # setitem through python indexing
    base[0] = 42.0
    base_cpu[0] = 42.0
    base[-1, ::2] = torch.tensor([1.0, 2.0, 3.0])
    base_cpu[-1, ::2] = torch.tensor([1.0, 2.0, 3.0])
    assert_bitwise(base.cpu(), base_cpu)


def test_copy_into_view_of_view():
    base_cpu = torch.zeros(4, 5, 6)
    base = base_cpu.to(DEV)
    v = base.permute(2, 0, 1)[1:4].select(2, 3)  # shape (3, 4)
    vc = base_cpu.permute(2, 0, 1)[1:4].select(2, 3)
    src = make((3, 4), torch.float32)
    v.copy_(src)
    vc.copy_(src)
    assert_bitwise(base.cpu(), base_cpu)
    assert_bitwise(v.cpu(), src)


def test_to_cpu_neuron_methods():
    x = make((3, 4), torch.float32)
    d = x.neuron()
    assert d.is_neuron and d.device.type == "neuron" and d.device.index == torch.neuron.current_device()
    assert_bitwise(d.cpu(), x)
    assert d.cpu().device.type == "cpu"
    assert d.to(DEV) is d  # no copy when already there
    assert d.neuron() is d
    assert x.cpu() is x
    assert_bitwise(d.to(torch.float64).cpu(), x.double())
    assert d.to(torch.float64).device.type == "neuron"
    assert_bitwise(x.to("neuron:0").cpu(), x)
    c = d.to(DEV, copy=True)
    assert c is not d and c.data_ptr() != d.data_ptr()
    assert_bitwise(c.cpu(), x)
    other = torch.empty(0, dtype=torch.float16, device=DEV)
    assert_bitwise(x.to(other).cpu(), x.half())
    assert x.to(other).device.type == "neuron"


@pytest.mark.skipif(not TWO_DEVICES, reason="needs two neuron devices")
def test_neuron_method_device_index():
    x = make((3, 4), torch.float32)
    d1 = x.neuron(1)
    assert d1.device == torch.device("neuron:1")
    assert_bitwise(d1.cpu(), x)
    d0 = d1.neuron(0)
    assert d0.device == torch.device("neuron:0")
    assert_bitwise(d0.cpu(), x)


@pytest.mark.parametrize("shape", [(0,), (0, 5), (3, 0, 2)])
def test_empty_tensors(shape):
    x = torch.empty(shape)
    d = x.to(DEV)
    assert d.shape == x.shape and d.device.type == "neuron"
    assert d.cpu().shape == x.shape
    e = torch.empty(shape, device=DEV)
    e.copy_(x)
    h = torch.empty(shape)
    h.copy_(e)
    assert h.shape == x.shape
    assert d.to(torch.int64).cpu().dtype == torch.int64


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool, torch.complex64,
                                   torch.bfloat16], ids=str)
def test_zero_dim(dtype):
    x = make((), dtype, seed=5)
    d = x.to(DEV)
    assert d.dim() == 0 and d.shape == torch.Size([])
    assert_bitwise(d.cpu(), x)
    assert d.item() == x.item()
    e = torch.empty((), dtype=dtype, device=DEV)
    e.copy_(x)
    assert_bitwise(e.cpu(), x)


def test_zero_dim_host_scalar_into_device_tensor_broadcast():
    d = torch.zeros(3, 3, device=DEV)
    d.copy_(torch.tensor(2.5))
    assert_bitwise(d.cpu(), torch.full((3, 3), 2.5))


def run_isolated(code):
    """Runs code in a fresh interpreter so that a crash fails this test instead of the whole session."""
    r = subprocess.run([sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"exit code {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_complex_conj_and_views(dtype):
    run_isolated(f"""
        import torch
        x = torch.randn(4, 3, dtype=torch.{dtype}, generator=torch.Generator().manual_seed(0))
        d = x.to("neuron")
        def same(a, e):
            assert a.device.type == "cpu" and a.dtype == e.dtype and a.shape == e.shape, (a, e)
            assert torch.equal(a.resolve_conj(), e.resolve_conj()), (a, e)
        same(torch.view_as_real(d).cpu(), torch.view_as_real(x))
        same(d.real.cpu(), x.real)
        same(d.imag.cpu(), x.imag)
        same(x.conj().to("neuron").cpu(), x.conj())       # host conj-bit tensor to device
        same(d.conj().resolve_conj().cpu(), x.conj())     # materialized on device
        same(d.conj().cpu(), x.conj())                     # conj bit carried to host
        same((d.conj() * 1).cpu(), x.conj())
        same(torch._neg_view(d).cpu(), -x)                # neg bit carried to host
    """)


def test_bool_copy_and_conversion():
    x = torch.tensor([[True, False, True], [False, False, True]])
    d = x.to(DEV)
    assert_bitwise(d.cpu(), x)
    assert_bitwise(d.to(torch.uint8).cpu(), x.to(torch.uint8))
    f = torch.tensor([0.0, -0.0, 0.5, float("nan"), -2.0])
    assert_bitwise(f.to(DEV).bool().cpu(), f.bool())


def test_copy_after_queued_ops_observes_results():
    # copies are stream-ordered after queued compute
    x = make((64, 64), torch.float32)
    d = x.to(DEV)
    expected = x.clone()
    for _ in range(20):
        d = d * 1.01 + 0.5
        expected = expected * 1.01 + 0.5
    assert_bitwise(d.cpu(), expected)


def test_source_host_tensor_mutated_after_copy_does_not_change_device():
    x = make((32,), torch.float32)
    d = torch.empty(32, device=DEV)
    d.copy_(x)
    keep = x.clone()
    x.fill_(0)
    assert_bitwise(d.cpu(), keep)


def test_large_copy():
    x = torch.arange(3 * 1024 * 1024, dtype=torch.float32)
    assert_bitwise(x.to(DEV).cpu(), x)


def test_copy_shape_mismatch_raises():
    d = torch.empty(3, 4, device=DEV)
    with pytest.raises(RuntimeError):
        d.copy_(torch.ones(5, 4))


def test_non_blocking_d2h_pageable_is_synchronous():
    x = make((128, 16), torch.float32)
    d = x.to(DEV)
    for _ in range(5):
        d = d * 2
    h = torch.empty(128, 16)
    assert not h.is_pinned()
    h.copy_(d, non_blocking=True)  # pageable destination: the copy completes before returning
    assert_bitwise(h, x * 32)
    # Tensor.to("cpu", non_blocking=True) allocates a pinned destination (as for CUDA): valid after a sync
    p = (d + 1).to("cpu", non_blocking=True)
    assert p.is_pinned()
    torch.neuron.synchronize()
    assert_bitwise(p, x * 32 + 1)


@pytest.mark.skipif(not TWO_DEVICES, reason="needs two neuron devices")
def test_second_device_host_copies_from_current_device_0():
    assert torch.neuron.current_device() == 0
    x = make((40, 3), torch.int32)
    p = x.pin_memory()
    d = p.to("neuron:1", non_blocking=True)
    assert d.device == torch.device("neuron:1")
    torch.neuron.synchronize(1)
    assert_bitwise(d.cpu(), x)
    out = torch.empty(40, 3, dtype=torch.int32).pin_memory()
    out.copy_(d + 1, non_blocking=True)
    torch.neuron.synchronize(1)
    assert_bitwise(out, x + 1)
    with torch.neuron.device(1):
        e = torch.empty(40, 3, dtype=torch.int32, device="neuron")
        assert e.device == torch.device("neuron:1")
        e.copy_(x)
    assert_bitwise(e.cpu(), x)


def test_copy_same_tensor_is_noop():
    x = make((5,), torch.float32)
    d = x.to(DEV)
    d.copy_(d)
    assert_bitwise(d.cpu(), x)


def test_requires_grad_copy_to_device_tracks_autograd():
    x = make((3,), torch.float32).requires_grad_()
    d = x.to(DEV)
    assert d.requires_grad and d.grad_fn is not None
    assert_bitwise(d.detach().cpu(), x.detach())


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16,
                                   torch.uint32, torch.uint64, torch.bool])
def test_integer_copies_to_device_of_every_dtype(dtype):
    # Integer copies to the device note the values written (for index checks): every integer
    # dtype must still copy, including those CPU's aminmax does not cover (uint16/32/64).
    src = torch.arange(6).to(dtype) if dtype != torch.bool else torch.tensor([True, False] * 3)
    dev = src.to("neuron")
    assert dev.dtype == dtype and torch.equal(dev.cpu(), src)
    into = torch.zeros(6, dtype=torch.int64, device="neuron").copy_(src)
    assert torch.equal(into.cpu(), src.to(torch.int64))
