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
    assert counts["nc_matmul"] == 4 * 2 * 8  # 4x2 output blocks, 8 K-slices each, accumulating in PSUM


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


def test_gen1_compiler_behaviours_public_kernels_rely_on():
    import torch_neuronx.nki.isa as nisa
    import torch_neuronx.nki.language as nl

    @nki.jit
    def k(a, b, idx, s):
        out = nl.ndarray((64, 512), nl.float32, buffer=nl.shared_hbm)
        # a scalar loads as a (1, 1) tile
        scale = nl.load(s[0, 0])
        # indirect rows: out[p] = a[idx[p]] (one index per partition from an SBUF tile)
        i_p = nl.arange(64)[:, None]
        i_f = nl.arange(512)[None, :]
        it = nl.load(idx[i_p])
        rows = nl.load(a[it[i_p, 0], i_f])
        # the first psum += matmul into an uninitialised PSUM tile overwrites it;
        # the transpose's PSUM result feeds the matmul (copied to SBUF by the compiler)
        acc = nl.ndarray((64, 512), nl.float32, buffer=nl.psum)
        for kk in nl.affine_range(2):
            lhsT = nisa.nc_transpose(nl.load(b[0:64, kk * 128:(kk + 1) * 128]))
            acc += nisa.nc_matmul(lhsT, nl.load(a[kk * 128:(kk + 1) * 128, :]))
        total = nl.zeros((64, 512), nl.float32)
        for kk in nl.affine_range(3):
            total[...] = nl.loop_reduce(rows, op=np.add, loop_indices=(kk,))
        res = nl.add(nl.add(acc, total), nl.multiply(rows, 0.0), mask=(1 < 0))  # masked off: assigns nothing
        keep = nl.zeros((64, 512), nl.float32)
        keep[...] = res
        nl.store(out, value=nl.add(nl.add(acc, total), nl.multiply(keep, scale)))
        return out

    a, b = torch.randn(256, 512), torch.randn(64, 256)
    idx = torch.randperm(256)[:64].to(torch.int32)
    out = k(*_neuron(a, b, idx, torch.full((1, 1), 2.0))).cpu()
    ref = b @ a + 3 * a[idx.long()]
    torch.testing.assert_close(out, ref, atol=1e-3, rtol=1e-4)


def test_indirect_index_out_of_bounds():
    import torch_neuronx.nki.isa as nisa
    import torch_neuronx.nki.language as nl

    def gather(skip):
        @nki.jit
        def k(a, idx):
            out = nl.ndarray((64, 512), nl.float32, buffer=nl.shared_hbm)
            nl.store(out, value=nl.zeros((64, 512), nl.float32))
            i_p = nl.arange(64)[:, None]
            it = nl.load(idx[i_p])
            t = nl.ndarray((64, 512), nl.float32)
            nisa.dma_copy(dst=t, src=a[it[i_p, 0], nl.arange(512)[None, :]],
                          oob_mode=nisa.oob_mode.skip if skip else nisa.oob_mode.error)
            nl.store(out, value=t)
            return out
        return k

    a = np.random.rand(128, 512).astype(np.float32)
    idx = np.arange(64, dtype=np.int32) * 2
    idx[5] = 200
    with pytest.raises(IndexError, match="index 102400 is out of bounds for axis 0 with size 65536"):
        nki.simulate_kernel(gather(False), a, idx)
    out = nki.simulate_kernel(gather(True), a, idx)
    keep = np.arange(64) != 5
    assert np.array_equal(out[keep], a[idx[keep]]) and np.isnan(out[5]).all()
    # on neuron the error surfaces at the next synchronization, the device stays usable
    with pytest.raises(IndexError, match="out of bounds"):
        gather(False)(torch.from_numpy(a).to("neuron"), torch.from_numpy(idx).to("neuron")).cpu()
    assert (torch.ones(3, device="neuron") * 2).cpu().tolist() == [2, 2, 2]


@pytest.mark.parametrize("grid", ["nc2", "plain2", "one"])
def test_all_reduce_across_spmd_instances(grid):
    import torch_neuronx.nki.language as nl

    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        me = nl.program_id(0)
        n = nl.num_programs(0)
        rows = x.shape[0] // n
        t = nl.load(x[me * rows:(me + 1) * rows, :])  # (P, F): this instance's block
        i_p = nl.arange(t.shape[0])[:, None]
        s = nl.all_reduce(t, op=np.add, program_axes=0, mask=(i_p < 100))  # rows >= 100 not written
        nl.store(out[me * rows:(me + 1) * rows, :], value=nl.maximum(s, -1e30), mask=(i_p < 100))
        return out
    x = np.random.default_rng(0).standard_normal((256, 512)).astype(np.float32)
    launch = {"nc2": lambda: k[nl.nc(2)](x), "plain2": lambda: k[2](x), "one": lambda: k(x[:128])}[grid]
    out = launch()
    if grid == "one":
        np.testing.assert_array_equal(out[:100], x[:100])
        return
    total = x[:128] + x[128:]
    np.testing.assert_allclose(out[:100], total[:100], rtol=1e-6)
    np.testing.assert_allclose(out[128:228], total[:100], rtol=1e-6)
