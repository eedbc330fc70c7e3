"""The kernel library's norms (torch_neuronx.nki.kernels.norms): RMSNorm and LayerNorm over the last
dimension, forward and backward, on ``neuron`` tensors against torch on CPU (``F.rms_norm`` /
``F.layer_norm`` and autograd, run in float32 on the same input values), at row counts that are
not multiples of the 128-row tile and a hidden size that is not a multiple of 128.

Tolerances. float32: outputs, statistics and gradients within 2e-5 of the reference's largest
magnitude plus 1e-5 relative (the kernels compute in fp32, only the summation order differs).
bfloat16: each result is computed in fp32 and rounded once to bf16 (relative error <= 2^-9), so
outputs and dx are checked at 8e-3 relative plus 1e-3 of the largest magnitude; weight and bias
gradients (fp32 sums over all rows, rounded once) at 8e-3 relative plus 1e-3 of the largest."""
import pytest
import torch
import torch.nn.functional as F

from torch_neuronx import nki
from torch_neuronx.nki.kernels import norms

SHAPES = [(1000, 1024), (300, 4096), ((2, 257), 768), (77, 1000)]
DTYPES = [torch.float32, torch.bfloat16]


def _close(out, ref, dtype):
    out = out.detach().cpu().float()
    scale = ref.abs().max().item()
    if dtype == torch.float32:
        torch.testing.assert_close(out, ref, atol=2e-5 * scale, rtol=1e-5)
    else:
        torch.testing.assert_close(out, ref, atol=1e-3 * scale, rtol=8e-3)


def _inputs(rows, H, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    lead = rows if isinstance(rows, tuple) else (rows,)
    x = (torch.randn(*lead, H, generator=g) * 2 + 0.5).to(dtype)
    w = (1 + 0.3 * torch.randn(H, generator=g)).to(dtype)
    b = (0.5 * torch.randn(H, generator=g)).to(dtype)
    gy = torch.randn(*lead, H, generator=g).to(dtype)
    return x, w, b, gy


def _dev(*ts):
    return [None if t is None else t.to("neuron") for t in ts]


def _leaf(t):
    return None if t is None else t.float().requires_grad_()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,H", SHAPES)
@pytest.mark.parametrize("affine", [True, False])
def test_rms_norm_forward_and_backward_match_torch(rows, H, dtype, affine):
    x, w, _, gy = _inputs(rows, H, dtype)
    w = w if affine else None
    xn, wn, gn = _dev(x, w, gy)
    y, rstd = norms.rms_norm_forward(xn, wn, 1e-6)
    assert y.device.type == "neuron" and y.dtype == dtype and y.shape == x.shape
    xr, wr = _leaf(x), _leaf(w)
    ref = F.rms_norm(xr, (H,), wr, 1e-6)
    ref.backward(gy.float())
    _close(y, ref.detach(), dtype)
    N = x.numel() // H
    assert rstd.dtype == torch.float32 and rstd.shape == (N,)
    ref_rstd = torch.rsqrt(x.float().pow(2).mean(-1) + 1e-6).reshape(N)
    torch.testing.assert_close(rstd.cpu(), ref_rstd, rtol=1e-5, atol=0)
    dx, dw = norms.rms_norm_backward(gn, xn, wn, rstd)
    assert dx.dtype == dtype and dx.shape == x.shape
    _close(dx, xr.grad, dtype)
    if affine:
        assert dw.dtype == dtype and dw.shape == (H,)
        _close(dw, wr.grad, dtype)
    else:
        assert dw is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,H", SHAPES)
@pytest.mark.parametrize("params", ["weight+bias", "weight", "bias", "none"])
def test_layer_norm_forward_and_backward_match_torch(rows, H, dtype, params):
    x, w, b, gy = _inputs(rows, H, dtype, seed=1)
    w = w if "weight" in params else None
    b = b if "bias" in params else None
    xn, wn, bn, gn = _dev(x, w, b, gy)
    y, mean, rstd = norms.layer_norm_forward(xn, wn, bn, 1e-5)
    assert y.dtype == dtype and y.shape == x.shape
    xr, wr, br = _leaf(x), _leaf(w), _leaf(b)
    ref = F.layer_norm(xr, (H,), wr, br, 1e-5)
    ref.backward(gy.float())
    _close(y, ref.detach(), dtype)
    xf = x.float().reshape(-1, H)
    torch.testing.assert_close(mean.cpu(), xf.mean(-1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rstd.cpu(), torch.rsqrt(xf.var(-1, unbiased=False) + 1e-5), atol=0, rtol=1e-4)
    dx, dw, db = norms.layer_norm_backward(gn, xn, wn, mean, rstd)
    _close(dx, xr.grad, dtype)
    if w is not None:
        assert dw.dtype == dtype
        _close(dw, wr.grad, dtype)
    else:
        assert dw is None
    # dbias is always the row sum of grad_y (fp32 when there is no weight to take the dtype of)
    _close(db, gy.float().reshape(-1, H).sum(0), dtype)
    if b is not None:
        _close(db, br.grad, dtype)


def test_float32_parameters_with_bfloat16_rows_and_default_eps():
    x, w, b, gy = _inputs(300, 512, torch.bfloat16, seed=2)
    w32, b32 = w.float() * 1.001, b.float()
    xn, wn, bn, gn = _dev(x, w32, b32, gy)
    y, rstd = norms.rms_norm_forward(xn, wn, None)  # eps=None: the dtype's epsilon, as F.rms_norm
    _close(y, F.rms_norm(x.float(), (512,), w32, torch.finfo(torch.bfloat16).eps), torch.bfloat16)
    _, dw = norms.rms_norm_backward(gn, xn, wn, rstd)
    assert dw.dtype == torch.float32
    y, mean, rstd = norms.layer_norm_forward(xn, wn, bn)
    _close(y, F.layer_norm(x.float(), (512,), w32, b32, 1e-5), torch.bfloat16)


@pytest.mark.parametrize("params", ["weight+bias", "none"])
def test_layer_norm_statistics_survive_a_large_mean(params):
    # 1000 + 0.01 * noise: a one-pass E[x^2] - E[x]^2 would lose every digit in fp32
    x = torch.randn(300, 1024, generator=torch.Generator().manual_seed(5)) * 0.01 + 1000
    w, b = (torch.randn(1024), torch.randn(1024)) if params == "weight+bias" else (None, None)
    y, mean, rstd = norms.layer_norm_forward(*_dev(x, w, b), 1e-5)
    exact = F.layer_norm(x.double(), (1024,), *[None if t is None else t.double() for t in (w, b)], 1e-5)
    torch_err = (F.layer_norm(x, (1024,), w, b, 1e-5) - exact).abs().max().item()
    assert (y.cpu().double() - exact).abs().max().item() <= 3 * max(torch_err, 1e-3)
    torch.testing.assert_close(rstd.cpu().double(), 1 / (x.double().var(-1, unbiased=False) + 1e-5).sqrt(),
                               rtol=1e-2, atol=0)


def test_empty_rows_launch_nothing():
    x = torch.empty(0, 256, device="neuron")
    y, rstd = norms.rms_norm_forward(x, None, 1e-6)
    assert y.shape == (0, 256) and rstd.shape == (0,)
    y, mean, rstd = norms.layer_norm_forward(x, None, None)
    dx, dw, db = norms.layer_norm_backward(x, x, torch.ones(256, device="neuron"), mean, rstd)
    assert dx.shape == (0, 256) and torch.equal(dw.cpu(), torch.zeros(256)) and torch.equal(db.cpu(), torch.zeros(256))


def test_bad_inputs_raise_before_launch():
    x = torch.randn(130, 256, device="neuron")
    w = torch.ones(256, device="neuron")
    with pytest.raises(TypeError, match="dtype torch.int32"):
        norms.rms_norm_forward(x.to(torch.int32), None, 1e-6)
    with pytest.raises(TypeError, match="float16"):
        norms.layer_norm_forward(x.half(), None, None)
    with pytest.raises(ValueError, match=r"weight must have shape \(256,\)"):
        norms.rms_norm_forward(x, torch.ones(255, device="neuron"), 1e-6)
    with pytest.raises(TypeError, match="bias has dtype torch.float16"):
        norms.layer_norm_forward(x.bfloat16(), None, torch.ones(256, device="neuron", dtype=torch.float16))
    with pytest.raises(ValueError, match="at least 1 dimension"):
        norms.rms_norm_forward(torch.tensor(1.0, device="neuron"), None, 1e-6)
    with pytest.raises(ValueError, match="eps must be a non-negative"):
        norms.rms_norm_forward(x, w, -1.0)
    with pytest.raises(ValueError, match="different devices"):
        norms.rms_norm_forward(x, torch.ones(256), 1e-6)
    y, rstd = norms.rms_norm_forward(x, w, 1e-6)
    with pytest.raises(ValueError, match="grad_y"):
        norms.rms_norm_backward(torch.randn(130, 128, device="neuron"), x, w, rstd)
    with pytest.raises(ValueError, match="rstd must hold one float32 value per row"):
        norms.rms_norm_backward(x, x, w, rstd[:-1])
    with pytest.raises(TypeError, match="rstd has dtype"):
        norms.rms_norm_backward(x, x, w, rstd.double())


def _copy_kernel_time(x):
    """Modeled time of a kernel that only loads and stores x in 128-row tiles (the DMA floor)."""
    import torch_neuronx.nki.language as nl

    @nki.jit
    def copy(t):
        out = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
        for i in range(0, t.shape[0], 128):
            nl.store(out[i:i + 128, :], value=nl.load(t[i:i + 128, :]))
        return out
    return nki.profile(copy)(x).latency_us


def test_rms_norm_forward_is_bound_by_its_data_movement():
    x = torch.randn(1024, 4096).bfloat16()
    w = torch.randn(4096).bfloat16()
    p = nki.profile(norms._rms_fwd_kernel)(x, w, 1e-6)
    # the statistics and the scaling overlap the DMAs: within 45% of moving x in and y out
    # (modeled 1.39x; scalar_tensor_tensor's two input tiles cost 2N Vector cycles)
    assert p.latency_us < 1.45 * _copy_kernel_time(x)
    assert p.busy_us["vector"] < p.latency_us and p.busy_us["scalar"] < p.latency_us
