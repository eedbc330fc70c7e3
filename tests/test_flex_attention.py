"""Eager FlexAttention on neuron: forward against CPU's flex_attention, backward against the same
attention computed densely on CPU in float64 (CPU's flex_attention has no backward), with and
without torch.autocast("neuron")."""
import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import torch_neuronx  # noqa: F401

DEV = torch.device("neuron")
B, H, S, D = 2, 4, 256, 32

pytestmark = pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")


def bias(score, b, h, q_idx, kv_idx):
    return score + (q_idx - kv_idx) * 0.01


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def dense(q, k, v, masked, hkv):
    """The attention flex_attention computes with `bias` and `causal`, as plain ops."""
    rep = q.shape[1] // hkv
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    i = torch.arange(q.shape[2])
    s = s + (i[:, None] - i[None, :]) * 0.01
    if masked:
        s = s.masked_fill(~(i[:, None] >= i[None, :]), float("-inf"))
    return s.softmax(-1) @ v


def inputs(hkv):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, S, D, generator=g)
    k, v = (torch.randn(B, hkv, S, D, generator=g) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("masked", [True, False], ids=["block_mask", "no_mask"])
@pytest.mark.parametrize("hkv", [H, 2], ids=["mha", "gqa"])
def test_forward_equals_cpu_and_backward_equals_dense(masked, hkv):
    q, k, v = inputs(hkv)
    kw = dict(score_mod=bias, enable_gqa=hkv != H)
    ref = flex_attention(q, k, v, block_mask=create_block_mask(causal, B, H, S, S, device="cpu") if masked else None,
                         **kw)
    qd, kd, vd = (t.to(DEV).requires_grad_() for t in (q, k, v))
    out = flex_attention(qd, kd, vd, block_mask=create_block_mask(causal, B, H, S, S, device=DEV) if masked else None,
                         **kw)
    assert out.device.type == "neuron"
    torch.testing.assert_close(out.detach().cpu(), ref, rtol=1e-5, atol=1e-5)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    out.backward(grad.to(DEV))
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    dense(q64, k64, v64, masked, hkv).backward(grad.double())
    for name, got, want in (("q", qd, q64), ("k", kd, k64), ("v", vd, v64)):
        torch.testing.assert_close(got.grad.cpu(), want.grad.float(), rtol=1e-4, atol=1e-4, msg=name)


def test_under_autocast_forward_and_backward():
    q, k, v = inputs(H)
    qd, kd, vd = (t.to(DEV).requires_grad_() for t in (q, k, v))
    block_mask = create_block_mask(causal, B, H, S, S, device=DEV)
    with torch.autocast("neuron", dtype=torch.bfloat16):
        out = flex_attention(qd, kd, vd, score_mod=bias, block_mask=block_mask)
    assert out.dtype == torch.bfloat16  # q, k, v were cast as AutocastCUDA casts them
    # The same attention on inputs cast by hand, without autocast.
    want = flex_attention(*(t.detach().bfloat16() for t in (qd, kd, vd)), score_mod=bias, block_mask=block_mask)
    torch.testing.assert_close(out.detach(), want, rtol=0, atol=0)
    out.float().sum().backward()
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    dense(q64, k64, v64, True, H).sum().backward()
    for got, ref in ((qd, q64), (kd, k64), (vd, v64)):
        assert got.grad.dtype == torch.float32
        torch.testing.assert_close(got.grad.cpu(), ref.grad.float(), rtol=0.05, atol=0.05)
