"""The kernel library's fused projections (torch_neuronx.nki.kernels.mlp): ``rms_norm(x) @ W.T`` and
the SwiGLU (Llama) MLP forward and backward, on ``neuron`` tensors against torch on CPU (the same
input values in float32, gradients by autograd), at row counts that are not multiples of the
128-row tile and sizes that are not multiples of 128 / 512.

Tolerances, relative to the reference's largest magnitude (matmul outputs have no useful
element-wise relative error near zero): float32 within 1e-5 (fp32 matmuls, fp32 accumulation);
bfloat16 within 1.5e-2 (bf16 operands, fp32 accumulation, one bf16 rounding of the on-chip
intermediate and of each result; observed 3e-3..6e-3)."""
import math

import pytest
import torch
import torch.nn.functional as F

from torch_neuronx import nki
from torch_neuronx.nki.kernels import mlp, norms

DTYPES = [torch.float32, torch.bfloat16]


def _close(out, ref, dtype):
    out = out.detach().cpu().float()
    assert out.shape == ref.shape
    tol = (1e-5 if dtype == torch.float32 else 1.5e-2) * ref.abs().max().item()
    torch.testing.assert_close(out, ref, atol=tol, rtol=0)


def _randn(*shape, scale=1.0, gen, dtype):
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


def _dev(*ts):
    return [None if t is None else t.to("neuron") for t in ts]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,H,O", [(1000, 1024, 640), (300, 4096, 384), ((2, 257), 768, 1000), (77, 200, 96)])
def test_rms_norm_linear_matches_torch(rows, H, O, dtype):
    gen = torch.Generator().manual_seed(0)
    lead = rows if isinstance(rows, tuple) else (rows,)
    x = _randn(*lead, H, scale=2, gen=gen, dtype=dtype)
    g = (1 + _randn(H, scale=0.2, gen=gen, dtype=torch.float32)).to(dtype)
    w = _randn(O, H, scale=H ** -0.5, gen=gen, dtype=dtype)
    y = mlp.rms_norm_linear_forward(*_dev(x, g), 1e-6, w.to("neuron"))
    assert y.device.type == "neuron" and y.dtype == dtype and y.shape == (*lead, O)
    ref = F.linear(F.rms_norm(x.float(), (H,), g.float(), 1e-6), w.float())
    _close(y, ref, dtype)
    assert norms.rms_norm_linear_forward is not None  # the lead's ops call it through norms
    _close(norms.rms_norm_linear_forward(*_dev(x, g), 1e-6, w.to("neuron")), ref, dtype)


def test_rms_norm_linear_without_norm_weight_and_default_eps():
    gen = torch.Generator().manual_seed(1)
    x = _randn(200, 384, gen=gen, dtype=torch.bfloat16)
    w = _randn(256, 384, scale=0.05, gen=gen, dtype=torch.bfloat16)
    y = mlp.rms_norm_linear_forward(x.to("neuron"), None, None, w.to("neuron"))
    ref = F.linear(F.rms_norm(x.float(), (384,), None, torch.finfo(torch.bfloat16).eps), w.float())
    _close(y, ref, torch.bfloat16)


def _mlp_inputs(rows, H, I, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    lead = rows if isinstance(rows, tuple) else (rows,)
    x = _randn(*lead, H, gen=gen, dtype=dtype)
    wg = _randn(I, H, scale=H ** -0.5, gen=gen, dtype=dtype)
    wu = _randn(I, H, scale=H ** -0.5, gen=gen, dtype=dtype)
    wd = _randn(H, I, scale=I ** -0.5, gen=gen, dtype=dtype)
    gy = _randn(*lead, H, gen=gen, dtype=dtype)
    return x, wg, wu, wd, gy


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,H,I", [(1000, 1024, 1536), (300, 4096, 1024), ((2, 257), 768, 2000), (77, 200, 96)])
def test_swiglu_forward_and_backward_match_torch(rows, H, I, dtype):
    x, wg, wu, wd, gy = _mlp_inputs(rows, H, I, dtype, seed=2)
    xn, wgn, wun, wdn, gyn = _dev(x, wg, wu, wd, gy)
    y = mlp.swiglu_forward(xn, wgn, wun, wdn)
    assert y.device.type == "neuron" and y.dtype == dtype and y.shape == x.shape
    leaves = [t.float().requires_grad_() for t in (x, wg, wu, wd)]
    xf, wgf, wuf, wdf = leaves
    ref = F.linear(F.silu(F.linear(xf, wgf)) * F.linear(xf, wuf), wdf)
    ref.backward(gy.float())
    _close(y, ref.detach(), dtype)
    grads = mlp.swiglu_backward(gyn, xn, wgn, wun, wdn)
    for got, leaf, like in zip(grads, leaves, (x, wg, wu, wd)):
        assert got.dtype == dtype and got.shape == like.shape and got.device.type == "neuron"
        _close(got, leaf.grad, dtype)


def test_swiglu_keeps_the_intermediate_on_chip():
    N, H, I = 300, 512, 1536
    x, wg, wu, wd, _ = _mlp_inputs(N, H, I, torch.bfloat16, seed=3)
    p = _profile_swiglu(x, wg, wu, wd)
    counts = mlp._swiglu_fwd_kernel.last_trace_stats.counts
    # the only stores are y's: one per row tile and 512 output columns (no [N, I] round trip)
    assert counts["store"] == math.ceil(N / 128) * math.ceil(H / 512)
    # the DMAs move x in and y out, and the three weights once per block of row tiles
    rb, _ = mlp._swiglu_config(H, I, 2, False, "")
    assert p.dma_bytes == 2 * N * H * 2 + math.ceil(N / (rb * 128)) * 3 * H * I * 2


def _profile_swiglu(x, wg, wu, wd):
    I, H = wg.shape
    kp = mlp._kper(H, x.element_size())
    packed = (mlp._pack(wg.t(), 128, kp), mlp._pack(wu.t(), 128, kp), mlp._pack(wd.t(), 512, mlp.G))
    return nki.profile(mlp._swiglu_fwd_kernel)(x.reshape(-1, H), *packed, I)


def test_fused_kernels_keep_the_tensor_engine_busy():
    # modeled: 94% for both at these sizes (the rest is the first DMAs and the last stores)
    x, wg, wu, wd, _ = _mlp_inputs(512, 1024, 2816, torch.bfloat16, seed=4)
    p = _profile_swiglu(x, wg, wu, wd)
    assert p.tensor_utilization > 0.9, p
    N, H, O = 1024, 2048, 3072
    x = torch.randn(N, H).bfloat16()
    w = (torch.randn(O, H) * 0.02).bfloat16()
    _, ow = mlp._rms_linear_config(H, 2)
    p = nki.profile(mlp._rms_linear_kernel)(x, torch.ones(H).bfloat16(), mlp._pack(w.t(), ow), O, 1e-6)
    assert p.tensor_utilization > 0.9, p


def test_bad_inputs_raise_before_launch():
    x = torch.randn(130, 256, device="neuron")
    wg = torch.randn(384, 256, device="neuron")
    wd = torch.randn(256, 384, device="neuron")
    with pytest.raises(TypeError, match="w_up has dtype torch.bfloat16 but x has torch.float32"):
        mlp.swiglu_forward(x, wg, wg.bfloat16(), wd)
    with pytest.raises(ValueError, match=r"w_gate must be a 2-D \[out_features, 256\]"):
        mlp.swiglu_forward(x, wg.t(), wg, wd)
    with pytest.raises(ValueError, match=r"w_down must be \[256, 384\]"):
        mlp.swiglu_forward(x, wg, wg, wd.t())
    with pytest.raises(ValueError, match="w_up .* must have w_gate's shape"):
        mlp.swiglu_forward(x, wg, wg[:128], wd)
    with pytest.raises(TypeError, match="dtype torch.int64"):
        mlp.swiglu_forward(x.long(), wg, wg, wd)
    with pytest.raises(ValueError, match="different devices"):
        mlp.swiglu_forward(x, wg, wg, wd.cpu())
    with pytest.raises(ValueError, match="grad_y"):
        mlp.swiglu_backward(x[:, :128], x, wg, wg, wd)
    with pytest.raises(ValueError, match="linear_weight must be a 2-D"):
        mlp.rms_norm_linear_forward(x, None, 1e-6, torch.randn(64, 128, device="neuron"))
    with pytest.raises(ValueError, match=r"norm_weight must have shape \(256,\)"):
        mlp.rms_norm_linear_forward(x, torch.ones(3, device="neuron"), 1e-6, wg)
    # sizes whose buffers cannot fit in SBUF: a clear error, not an allocation failure mid-trace
    big = torch.empty(4, 65536)
    with pytest.raises(ValueError, match="bytes of SBUF per partition"):
        mlp.swiglu_forward(big, torch.empty(128, 65536), torch.empty(128, 65536), torch.empty(65536, 128))
