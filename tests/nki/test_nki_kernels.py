"""Kernels written like the public NKI tutorials (torch_neuronx.nki.samples) against torch
references, at the sizes such kernels run at, on NumPy arrays and on neuron tensors."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torch_neuronx
from torch_neuronx import nki
from torch_neuronx.nki import samples as S


def _neuron(*ts):
    return [t.to("neuron") for t in ts]


def test_tensor_add_spmd_grid_numpy_and_neuron():
    a, b = np.random.rand(512, 2048).astype(np.float32), np.random.rand(512, 2048).astype(np.float32)
    out = nki.simulate_kernel(S.tensor_add[4, 4], a, b)
    assert isinstance(out, np.ndarray) and np.array_equal(out, a + b)
    ta, tb = _neuron(torch.from_numpy(a), torch.from_numpy(b))
    r = S.tensor_add[4, 4](ta, tb)
    assert r.device.type == "neuron" and torch.equal(r.cpu(), torch.from_numpy(a + b))
    # 16 instances, each 2 loads, 1 add, 1 store
    counts = S.tensor_add.last_trace_stats.counts
    assert counts["load"] == 32 and counts["tensor_tensor"] == 16 and counts["store"] == 16


def test_tensor_add_logical_cores_share_the_output():
    a, b = torch.randn(256, 1024), torch.randn(256, 1024)
    from torch_neuronx.nki import language as nl
    r = S.tensor_add[nl.spmd_dim(nl.nc(2), 1), 2](*_neuron(a, b))
    assert torch.equal(r.cpu(), a + b)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
def test_tiled_matmul_accumulates_in_psum(dtype, tol):
    torch.manual_seed(0)
    lhsT, rhs = torch.randn(1024, 512, dtype=dtype), torch.randn(1024, 1024, dtype=dtype)
    r = S.matmul(*_neuron(lhsT, rhs)).cpu()
    ref = lhsT.float().T @ rhs.float()
    assert r.dtype == dtype
    torch.testing.assert_close(r.float(), ref, atol=tol * 32, rtol=tol)
    counts = S.matmul.last_trace_stats.counts
    assert counts["nc_matmul"] == 2 * 4 * 2 * 8  # 4x2 output blocks, 8 K-slices each, matmul + accumulate


def test_softmax_with_masked_partial_tile():
    x = torch.randn(300, 1000)
    out = nki.simulate_kernel(S.softmax, x.numpy())
    np.testing.assert_allclose(out, torch.softmax(x, -1).numpy(), atol=1e-6, rtol=1e-5)


def test_rmsnorm():
    a, g = torch.randn(1000, 512), torch.rand(512)
    r = S.rmsnorm(*_neuron(a, g), 1e-6).cpu()
    ref = a * torch.rsqrt((a * a).mean(-1, keepdim=True) + 1e-6) * g
    torch.testing.assert_close(r, ref, atol=1e-5, rtol=1e-5)


def test_layernorm_with_bn_stats_over_chunks():
    x = torch.randn(512, 1100) * 3 + 1
    r = S.layernorm(x.to("neuron"), 1e-5).cpu()
    torch.testing.assert_close(r, F.layer_norm(x, (1100,), eps=1e-5), atol=1e-5, rtol=1e-5)
    assert S.layernorm.last_trace_stats.counts["bn_stats"] == 4 * 3


def test_transpose2d():
    x = torch.randn(384, 512)
    r = S.transpose2d(x.to("neuron")).cpu()
    assert torch.equal(r, x.T)


@pytest.mark.parametrize("S_len", [512, 1024])
def test_flash_attention_matches_sdpa(S_len):
    torch.manual_seed(1)
    d = 64
    q, k, v = torch.randn(S_len, d), torch.randn(S_len, d), torch.randn(S_len, d)
    o = S.flash_attention(q.T.contiguous().to("neuron"), k.T.contiguous().to("neuron"), v.to("neuron"), d ** -0.5)
    ref = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]
    torch.testing.assert_close(o.cpu(), ref, atol=1e-5, rtol=1e-4)
    # key blocks past the diagonal are skipped: causal work only
    blocks = sum((qi * 128 + 128 + 511) // 512 for qi in range(S_len // 128))
    assert S.flash_attention.last_trace_stats.counts["affine_select"] == blocks


def test_kernel_is_one_task_on_the_current_stream():
    a, b = _neuron(torch.randn(256, 1024), torch.randn(256, 1024))
    S.tensor_add[2, 2](a, b)  # first call of the signature runs inline
    torch.neuron.synchronize()
    torch_neuronx.reset_metrics()
    s = torch.neuron.Stream()
    s.wait_stream(torch.neuron.current_stream())
    with torch.neuron.stream(s):
        torch.neuron._sleep(300)
        r = S.tensor_add[2, 2](a, b)
    assert torch_neuronx.metrics()["ops"]["nki::launch"] == {"async": 1}
    assert not s.query()  # queued behind the sleep: the call returned at once
    s.synchronize()
    assert torch.equal(r.cpu(), a.cpu() + b.cpu())


def test_trace_is_cached_per_signature():
    a, b = np.random.rand(128, 512).astype(np.float32), np.random.rand(128, 512).astype(np.float32)
    k = nki.jit(S.tensor_add.func)
    k[1, 1](a, b)
    first = k.last_trace_stats
    k[1, 1](a, b)
    assert k.last_trace_stats is first
    k[1, 1](np.random.rand(128, 1024).astype(np.float32), np.random.rand(128, 1024).astype(np.float32))
    assert k.last_trace_stats is not first


def test_numpy_inputs_written_by_the_kernel_are_updated_in_place():
    import torch_neuronx.nki.language as nl

    @nki.jit
    def scale_inplace(a):
        t = nl.load(a)
        nl.store(a, value=nl.multiply(t, 2.0))
        return a

    a = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    ref = a * 2
    nki.simulate_kernel(scale_inplace, a)
    assert np.array_equal(a, ref)
