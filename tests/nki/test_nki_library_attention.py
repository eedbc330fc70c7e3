"""The library's attention kernels (torch_neuronx/nki/kernels/attention.py, attention_bwd.py):
FlashAttention forward (out and lse) against the explicit math and torch's SDPA / CPU flash kernel,
the FlashAttention-2 backward against autograd through the reference, the naive kernel, input
checks, and the modeled Tensor Engine utilization of both forward kernels.

Tolerances: float32 inputs are compared at atol 5e-5 / rtol 1e-4 (the kernels compute in fp32;
observed errors ~1e-6). bfloat16 inputs are compared with the float64 reference of the same
(bf16-rounded) inputs: outputs at atol 2e-2 / rtol 2e-2 (P and the output are rounded to bf16:
~3 significant digits; observed <= 6e-3), lse at 2e-3 (row sums are fp32), gradients at 2e-2 of the
gradient's largest magnitude (observed <= 5e-3)."""
import math

import pytest
import torch
import torch.nn.functional as F

import torch_neuronx  # noqa: F401 - the neuron device
from torch_neuronx import nki
from torch_neuronx.nki.kernels import attention as A
from torch_neuronx.nki.kernels import attention_bwd as AB


def _reference(q, k, v, causal=False, scale=None, window=None):
    """float64 attention of the given values (GQA by repeating kv heads); out and lse (fully masked
    rows: 0 and 0, the convention of torch's CPU flash kernel)."""
    Hq, Hkv, Sq, Skv, D = q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3]
    scale = 1 / math.sqrt(D) if scale is None else scale
    g = Hq // Hkv
    kk, vv = k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)
    s = q.double() @ kk.transpose(-1, -2) * scale
    i, j = torch.arange(Sq)[:, None], torch.arange(Skv)[None]
    vis = torch.ones(Sq, Skv, dtype=torch.bool)
    if causal:
        vis &= j <= i
    if window is not None:
        vis &= j > i - window
    s = s.masked_fill(~vis, float("-inf"))
    lse = torch.logsumexp(s, -1)
    out = torch.softmax(s, -1).nan_to_num(0.0) @ vv
    return out, torch.where(vis.any(-1), lse, torch.zeros_like(lse))


def _inputs(B, Hq, Hkv, Sq, Skv, D, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Sq, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv, Skv, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, Skv, D, generator=g).to(dtype)
    return q, k, v


def _tol(dtype):
    return dict(atol=5e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)


# (B, Hq, Hkv, Sq, Skv, D, causal, window)
FORWARD_CASES = {
    "causal_1000_d128": (1, 2, 2, 1000, 1000, 128, True, None),      # lengths not multiples of 128/512
    "gqa_8_2_d64": (2, 8, 2, 256, 384, 64, False, None),
    "mqa_causal_sq_ne_skv": (1, 4, 1, 300, 700, 64, True, None),      # top-left aligned causal
    "decode_sq1": (1, 4, 2, 1, 1000, 128, False, None),
    "window_causal": (1, 2, 1, 600, 600, 64, True, 100),
    "window_only": (1, 2, 2, 333, 500, 32, False, 64),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", list(FORWARD_CASES), ids=list(FORWARD_CASES))
def test_forward_matches_reference(case, dtype):
    B, Hq, Hkv, Sq, Skv, D, causal, window = FORWARD_CASES[case]
    q, k, v = _inputs(B, Hq, Hkv, Sq, Skv, D, dtype)
    out, lse = A.flash_attention_forward(q, k, v, causal=causal, window=window)
    assert out.shape == q.shape and out.dtype == dtype
    assert lse.shape == (B, Hq, Sq) and lse.dtype == torch.float32
    ref_out, ref_lse = _reference(q, k, v, causal, window=window)
    torch.testing.assert_close(out.double(), ref_out, **_tol(dtype))
    torch.testing.assert_close(lse.double(), ref_lse, atol=5e-5 if dtype == torch.float32 else 2e-3, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_forward_matches_sdpa_and_torch_flash_lse(causal):
    q, k, v = _inputs(2, 4, 4, 640, 640, 64, torch.float32, seed=1)
    out, lse = A.flash_attention_forward(q, k, v, causal=causal, scale=0.2)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.2),
                               atol=5e-5, rtol=1e-4)
    t_out, t_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=0.2)[:2]
    torch.testing.assert_close(out, t_out, atol=5e-5, rtol=1e-4)
    torch.testing.assert_close(lse, t_lse, atol=5e-5, rtol=1e-4)  # lse could stand in for torch's


def test_forward_long_keys_use_the_online_softmax_across_sections():
    # Skv > 4096: K/V in two SBUF sections, running max/sum; a large score late in the row
    q, k, v = _inputs(1, 2, 1, 200, 5000, 64, torch.float32, seed=2)
    k[0, 0, 4500] = q[0, 0, 10] * 3  # row 10's max is in the second section
    out, lse = A.flash_attention_forward(q, k, v)
    ref_out, ref_lse = _reference(q, k, v)
    torch.testing.assert_close(out.double(), ref_out, atol=5e-5, rtol=1e-4)
    torch.testing.assert_close(lse.double(), ref_lse, atol=5e-5, rtol=1e-4)
    qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
    out, lse = A.flash_attention_forward(qb, kb, vb, causal=True, window=4300)
    ref_out, ref_lse = _reference(qb, kb, vb, True, window=4300)
    torch.testing.assert_close(out.double(), ref_out, atol=2e-2, rtol=2e-2)


def test_rows_without_visible_keys_get_zero_output_and_lse():
    # window only, Sq > Skv + W - 1: queries 10.. see no key
    q, k, v = _inputs(1, 1, 1, 300, 5, 16, torch.float32)
    out, lse = A.flash_attention_forward(q, k, v, window=6)
    ref_out, ref_lse = _reference(q, k, v, window=6)
    assert (out[0, 0, 10:] == 0).all() and (lse[0, 0, 10:] == 0).all()
    torch.testing.assert_close(out.double(), ref_out, atol=5e-5, rtol=1e-4)
    torch.testing.assert_close(lse.double(), ref_lse, atol=5e-5, rtol=1e-4)


def test_scale_sign_and_extreme_scores():
    q, k, v = _inputs(1, 2, 2, 130, 200, 32, torch.float32, seed=3)
    for scale in (-0.3, 0.0, 3.0):
        out, lse = A.flash_attention_forward(q * 20, k * 20, v, causal=True, scale=scale)
        ref_out, ref_lse = _reference(q * 20, k * 20, v, True, scale=scale)
        torch.testing.assert_close(out.double(), ref_out, atol=5e-5, rtol=1e-4)
        torch.testing.assert_close(lse.double(), ref_lse, atol=1e-3, rtol=1e-4)  # |lse| up to ~1e4


def _reference_grads(q, k, v, dout, causal, window):
    q, k, v = (x.double().requires_grad_() for x in (q, k, v))
    out, _ = _reference(q, k, v, causal, window=window)
    out.backward(dout.double())
    return q.grad, k.grad, v.grad


BACKWARD_CASES = {
    "causal_1000_d128": (1, 2, 2, 1000, 1000, 128, True, None),
    "gqa_8_2_window": (1, 8, 2, 300, 700, 64, False, 128),
    "mqa_decode": (2, 4, 1, 1, 600, 128, False, None),
    "causal_window_sq_ne_skv": (1, 2, 1, 333, 500, 64, True, 100),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", list(BACKWARD_CASES), ids=list(BACKWARD_CASES))
def test_backward_matches_autograd(case, dtype):
    B, Hq, Hkv, Sq, Skv, D, causal, window = BACKWARD_CASES[case]
    q, k, v = _inputs(B, Hq, Hkv, Sq, Skv, D, dtype, seed=4)
    dout = torch.randn(B, Hq, Sq, D, generator=torch.Generator().manual_seed(5)).to(dtype)
    out, lse = A.flash_attention_forward(q, k, v, causal=causal, window=window)
    dq, dk, dv = A.flash_attention_backward(dout, q, k, v, out, lse, causal=causal, window=window)
    for got, ref, like in zip((dq, dk, dv), _reference_grads(q, k, v, dout, causal, window), (q, k, v)):
        assert got.shape == like.shape and got.dtype == dtype
        bound = (1e-4 if dtype == torch.float32 else 2e-2) * ref.abs().max().item()
        torch.testing.assert_close(got.double(), ref, atol=bound, rtol=0)


def test_backward_accumulates_dk_dv_over_query_groups(monkeypatch):
    # more query tiles than the SBUF budget of one group: dK/dV add up in HBM over the groups
    monkeypatch.setattr(AB, "_QGROUP_BYTES", 3000)
    q, k, v = _inputs(1, 4, 2, 333, 900, 64, torch.float32, seed=6)
    dout = torch.randn_like(q)
    out, lse = A.flash_attention_forward(q, k, v, window=100)
    got = A.flash_attention_backward(dout, q, k, v, out, lse, window=100)
    for g, r in zip(got, _reference_grads(q, k, v, dout, False, 100)):
        torch.testing.assert_close(g.double(), r, atol=1e-4 * r.abs().max().item(), rtol=0)


def test_forward_and_backward_run_on_neuron_tensors():
    q, k, v = _inputs(1, 2, 1, 300, 300, 64, torch.float32, seed=7)
    dout = torch.randn_like(q)
    dev = [x.to("neuron") for x in (q, k, v, dout)]
    out, lse = A.flash_attention_forward(*dev[:3], causal=True)
    grads = A.flash_attention_backward(dev[3], *dev[:3], out, lse, causal=True)
    assert out.device.type == "neuron" and all(g.device.type == "neuron" for g in grads)
    ref_out, _ = _reference(q, k, v, True)
    torch.testing.assert_close(out.cpu().double(), ref_out, atol=5e-5, rtol=1e-4)
    for g, r in zip(grads, _reference_grads(q, k, v, dout, True, None)):
        torch.testing.assert_close(g.cpu().double(), r, atol=1e-4 * r.abs().max().item(), rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape, causal", [((1, 2, 1, 300, 700, 64), True), ((2, 2, 2, 200, 130, 128), False)])
def test_naive_kernel_matches_reference(shape, causal, dtype):
    q, k, v = _inputs(*shape, dtype, seed=8)
    out = A.naive_attention_forward(q, k, v, causal=causal)
    assert out.shape == q.shape and out.dtype == dtype
    torch.testing.assert_close(out.double(), _reference(q, k, v, causal)[0], **_tol(dtype))


@pytest.mark.parametrize("call, err, match", [
    (lambda q, k, v: A.flash_attention_forward(q[0], k, v), ValueError, "q must be 4-D"),
    (lambda q, k, v: A.flash_attention_forward(q, k, v[:, :, :5]), ValueError, "same shape"),
    (lambda q, k, v: A.flash_attention_forward(q, k[:1], v[:1]), ValueError, "batch sizes differ"),
    (lambda q, k, v: A.flash_attention_forward(q, k[..., :8], v[..., :8]), ValueError, "head_dim differs"),
    (lambda q, k, v: A.flash_attention_forward(q, k.repeat(1, 3, 1, 1), v.repeat(1, 3, 1, 1)), ValueError,
     "must divide"),
    (lambda q, k, v: A.flash_attention_forward(*(x.repeat(1, 1, 1, 9) for x in (q, k, v))), ValueError,
     "head_dim 288 is not supported"),
    (lambda q, k, v: A.flash_attention_forward(q.half(), k.half(), v.half()), TypeError,
     "float32 and torch.bfloat16"),
    (lambda q, k, v: A.flash_attention_forward(q.int(), k, v), TypeError, "supported are"),
    (lambda q, k, v: A.flash_attention_forward(q, k.bfloat16(), v), TypeError, "one dtype"),
    (lambda q, k, v: A.flash_attention_forward(q, k, v, window=0), ValueError, "window must be a positive int"),
    (lambda q, k, v: A.flash_attention_forward(q, k, v, scale=float("nan")), ValueError, "scale must be"),
    (lambda q, k, v: A.flash_attention_forward(q, k, v.numpy()), TypeError, "v must be a torch.Tensor"),
    (lambda q, k, v: A.flash_attention_backward(q, q, k, v, q, torch.zeros(2, 4, 15)), ValueError,
     "lse must be float32"),
    (lambda q, k, v: A.flash_attention_backward(q, q, k, v, q, torch.zeros(2, 4, 16).bfloat16()), ValueError,
     "lse must be float32"),
    (lambda q, k, v: A.flash_attention_backward(q[:, :1], q, k, v, q, torch.zeros(2, 4, 16)), ValueError,
     "grad_out must be"),
    (lambda q, k, v: A.naive_attention_forward(q, torch.zeros(2, 2, 9000, 32), torch.zeros(2, 2, 9000, 32)),
     ValueError, "Skv <= 8192"),
])
def test_bad_inputs_raise_before_launching(call, err, match):
    q, k, v = _inputs(2, 4, 2, 16, 16, 32, torch.float32)
    with pytest.raises(err, match=match):
        call(q, k, v)


def test_launch_functions_trace_under_fake_tensors():
    # what nki_op's fake kernel does: shapes and dtypes, nothing run
    from torch._subclasses.fake_tensor import FakeTensorMode
    q, k, v = _inputs(1, 4, 2, 200, 300, 64, torch.bfloat16)
    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(x) for x in (q, k, v))
        out, lse = A.flash_attention_forward(fq, fk, fv, causal=True)
        grads = A.flash_attention_backward(mode.from_tensor(q), fq, fk, fv, out, lse, causal=True)
    assert out.shape == q.shape and lse.shape == (1, 4, 200)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape] and grads[1].dtype == torch.bfloat16


# -- modeled performance (torch_neuronx.nki.profile: the cost model's NeuronCore time) -------------

def _profile(kernel, grid, *args):
    """The kernel's ModeledProfile. With a grid the launch goes through kernel[grid] and the report
    is read from its trace: nki.profile(kernel)[grid](...) raises AttributeError ('_Launcher'
    object has no attribute 'last_trace_stats', torch_neuronx/nki/_profile.py)."""
    if grid is None:
        return nki.profile(kernel)(*args)
    kernel[grid](*args)
    return nki._modeled_report(kernel.last_trace_stats.program)


def _attention_flops(S, D, causal):
    """QK^T and PV FLOPs of the 128-key chunks the flash kernel computes (square causal: the
    diagonal chunks whole)."""
    n = S // 128
    chunks = n * (n + 1) // 2 if causal else n * n
    return chunks * 2 * (2 * 128 * 128 * D)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_forward_keeps_the_tensor_engine_busier_than_the_naive_kernel(causal):
    S, D = 4096, 128
    q, k, v = _inputs(1, 1, 1, S, S, D, torch.bfloat16, seed=9)
    qT, kT = q.transpose(-1, -2).contiguous(), k.transpose(-1, -2).contiguous()
    flash = _profile(A._flash_fwd_kernel, None, qT, kT, A.by_tile(v), 1 / math.sqrt(D), causal, None)
    assert flash.tensor_flops == _attention_flops(S, D, causal)  # skipped blocks are not computed
    naive = _profile(A._naive_fwd_kernel, (1, 1), qT.float(), kT.float(), v.float(), 1 / math.sqrt(D), causal)
    # the modeled figures of tests/nki/test_nki_library_attention.py's report: non-causal 60.5%,
    # causal 56.6% (Vector and Scalar Engines ~92-95% busy: the row max, exp and P^T copies bound
    # it); the naive kernel 6.5%
    assert flash.tensor_utilization >= (0.60 if not causal else 0.55)
    assert naive.tensor_utilization < 0.1 < flash.tensor_utilization
    assert flash.latency_us * 8 < naive.latency_us
    assert flash.utilization("vector") > 0.85 and flash.utilization("scalar") > 0.85


def test_flash_backward_modeled_utilization():
    S, D = 2048, 128
    q, k, v = _inputs(1, 1, 1, S, S, D, torch.bfloat16, seed=10)
    dout = torch.randn_like(q)
    out, lse = A.flash_attention_forward(q, k, v)
    args, _ = AB.backward_kernel_args(dout, q, k, v, out, lse, 1 / math.sqrt(D), False, None)
    rep = _profile(AB._flash_bwd_kernel, None, *args)
    assert rep.tensor_flops == 5 * 2 * S * S * D  # S, dP, dV, dK, dQ
    assert rep.tensor_utilization >= 0.60  # modeled 62.6% (scalar_tensor_tensor charged 2N: two input tiles)
