"""FlexAttention under torch.compile on neuron: the flex_attention higher-order ops (forward and
backward) lowered to generated kernels with the score_mod and mask_mod inlined
(csrc/compiler/flex_attention.h). Every result is compared with eager flex_attention on neuron
(PyTorch's dense implementation, itself checked against CPU in tests/test_flex_attention.py),
for the masks and score mods users write."""
import functools

import pytest
import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

import torch_neuronx  # noqa: F401
from helpers import compiled_tier_test
from torch_neuronx.compile import compile_metrics, reset_compile_metrics

DEV = torch.device("neuron")

pytestmark = pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")


@pytest.fixture(autouse=True)
def fresh(tmp_path_factory, monkeypatch, request):
    # Every test here is about the compiled tier: a graph that fell back to eager is a failure
    # unless the test says it is about that.
    yield from compiled_tier_test(tmp_path_factory, monkeypatch, request)


def causal(b, h, q, kv):
    return q >= kv


def sliding_window(b, h, q, kv):
    return (q >= kv) & (q - kv <= 64)


def prefix_lm(b, h, q, kv):
    return (kv <= 40) | (q >= kv)


def document_mask(doc):
    def mask(b, h, q, kv):
        return (doc[q] == doc[kv]) & (q >= kv)
    return mask


def alibi(slopes):
    def score(s, b, h, q, kv):
        return s + slopes[h] * (kv - q)
    return score


def soft_cap(s, b, h, q, kv):
    return torch.tanh(s / 20) * 20


def inputs(B, Hq, Hkv, S, D, dtype=torch.float32, seed=0, layout="bhsd"):
    g = torch.Generator().manual_seed(seed)

    def make(h):
        if layout == "bshd":  # the usual projection output, viewed as [B, H, S, D]: not contiguous
            return torch.randn(B, S, h, D, generator=g).to(DEV, dtype).transpose(1, 2).requires_grad_()
        return torch.randn(B, h, S, D, generator=g).to(DEV, dtype).requires_grad_()

    return make(Hq), make(Hkv), make(Hkv)


def compare(q, k, v, tol, **kw):
    """Compiled against eager: the output, the logsumexp and the three gradients."""
    compiled = torch.compile(functools.partial(flex_attention, return_lse=True, **kw), backend="neuron")
    out, lse = compiled(q, k, v)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(DEV, out.dtype)
    grads = torch.autograd.grad(out, (q, k, v), g)
    ref_out, ref_lse = flex_attention(q, k, v, return_lse=True, **kw)
    ref_grads = torch.autograd.grad(ref_out, (q, k, v), g)
    torch.testing.assert_close(out, ref_out, **tol)
    torch.testing.assert_close(lse, ref_lse, **tol)
    for name, got, want in zip("qkv", grads, ref_grads):
        torch.testing.assert_close(got, want, **tol, msg=lambda m, n=name: f"grad {n}: {m}")
        assert got.stride() == want.stride() or not want.is_contiguous()
    m = compile_metrics()
    assert m["flex_attention"] == 2, m  # the forward and the backward ran as generated kernels
    return out


F32 = dict(rtol=2e-5, atol=2e-5)
B, H, S, D = 2, 4, 300, 32  # 300: the last block of queries and keys is partial


@pytest.mark.parametrize("mask", ["causal", "sliding_window", "prefix_lm", "document"])
def test_masks_forward_and_backward_equal_eager(mask):
    q, k, v = inputs(B, H, H, S, D)
    doc = torch.repeat_interleave(torch.arange(4), torch.tensor([70, 100, 50, 80])).to(DEV)
    mask_mod = {"causal": causal, "sliding_window": sliding_window, "prefix_lm": prefix_lm,
                "document": document_mask(doc)}[mask]
    block_mask = create_block_mask(mask_mod, None, None, S, S, device=DEV)
    listed = block_mask.kv_num_blocks + block_mask.full_kv_num_blocks
    assert (listed < block_mask.kv_indices.shape[-1]).any()  # some blocks are skipped, not only masked
    compare(q, k, v, F32, block_mask=block_mask)


@pytest.mark.parametrize("score", ["alibi", "soft_cap"])
def test_score_mods_forward_and_backward_equal_eager(score):
    q, k, v = inputs(B, H, H, S, D, seed=1)
    slopes = torch.tensor([2.0 ** -(i + 1) for i in range(H)], device=DEV)
    score_mod = alibi(slopes) if score == "alibi" else soft_cap
    compare(q, k, v, F32, score_mod=score_mod, block_mask=create_block_mask(causal, None, None, S, S, device=DEV))


def test_gqa_per_batch_mask_and_strided_inputs():
    # 8 query heads over 2 key/value heads, a block mask per batch and head, inputs viewed from
    # [B, S, H, D] as attention layers make them.
    q, k, v = inputs(B, 8, 2, 256, 64, seed=2, layout="bshd")
    lengths = torch.tensor([256, 100], device=DEV)

    def padded_causal(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (kv_idx < lengths[b])

    block_mask = create_block_mask(padded_causal, B, 8, 256, 256, device=DEV)
    compare(q, k, v, F32, block_mask=block_mask, enable_gqa=True)


def test_gradient_through_the_logsumexp():
    # Attention sinks as TorchTitan's GPT-OSS writes them: the output rescaled by
    # sigmoid(lse - sink[h]), so the backward gets a gradient for the logsumexp too.
    q, k, v = inputs(B, H, H, 256, 32, seed=9)
    sinks = torch.randn(H, generator=torch.Generator().manual_seed(10)).to(DEV).requires_grad_()
    block_mask = create_block_mask(sliding_window, None, None, 256, 256, device=DEV)

    def attention(fn):
        out, lse = fn(q, k, v, block_mask=block_mask, return_lse=True)
        return out * torch.sigmoid(lse - sinks.view(1, -1, 1)).unsqueeze(-1)

    got = attention(torch.compile(flex_attention, backend="neuron"))
    want = attention(flex_attention)
    g = torch.randn(got.shape, generator=torch.Generator().manual_seed(11)).to(DEV)
    for a, b in zip(torch.autograd.grad(got, (q, k, v, sinks), g), torch.autograd.grad(want, (q, k, v, sinks), g)):
        torch.testing.assert_close(a, b, **F32)
    torch.testing.assert_close(got, want, **F32)
    assert compile_metrics()["flex_attention"] == 2


def test_rectangular_shapes_broadcast_batch_and_small_blocks():
    # 200 queries against 330 keys, value width 48 against key width 32, one key/value batch for
    # two query batches (its gradients sum over them), 64-wide blocks, a mask per head.
    g = torch.Generator().manual_seed(12)
    q = torch.randn(2, 4, 200, 32, generator=g).to(DEV).requires_grad_()
    k = torch.randn(1, 4, 330, 32, generator=g).to(DEV).requires_grad_()
    v = torch.randn(1, 4, 330, 48, generator=g).to(DEV).requires_grad_()

    def per_head_window(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx + 130) & (kv_idx >= q_idx + 130 - 40 * (h + 1))

    block_mask = create_block_mask(per_head_window, 2, 4, 200, 330, device=DEV, BLOCK_SIZE=64)
    compare(q, k, v, F32, block_mask=block_mask)


def test_no_block_mask_and_a_score_bias():
    q, k, v = inputs(1, 2, 2, 200, 16, seed=3)
    compare(q, k, v, F32, score_mod=lambda s, b, h, qi, kv: s + (qi - kv) * 0.01)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision(dtype):
    # The mod runs in float32 (FlexAttention's working precision), not rounded per op.
    q, k, v = inputs(B, H, H, 256, 64, dtype=dtype, seed=4)
    compare(q, k, v, dict(rtol=2e-2, atol=2e-2), score_mod=soft_cap,
            block_mask=create_block_mask(causal, None, None, 256, 256, device=DEV))


def test_ordinary_size_sequence_2048():
    # A user's size: 8 heads of 64 over 2048 tokens, causal, forward and backward.
    q, k, v = inputs(1, 8, 8, 2048, 64, seed=5)
    compare(q, k, v, dict(rtol=1e-4, atol=1e-4), block_mask=create_block_mask(causal, None, None, 2048, 2048, device=DEV))


def test_index_out_of_range_in_a_mask_raises_and_the_device_stays_usable():
    q, k, v = (t.detach() for t in inputs(1, 2, 2, 256, 16, seed=6))
    short = torch.zeros(100, dtype=torch.int64, device=DEV)  # fewer ids than tokens

    def bad(b, h, q_idx, kv_idx):
        return short[q_idx] == short[kv_idx]

    # Every block partial, so the mask runs on every score (create_block_mask would run it eagerly).
    num = torch.full((1, 1, 2), 2, dtype=torch.int32, device=DEV)
    idx = torch.tensor([[[[0, 1], [0, 1]]]], dtype=torch.int32, device=DEV)
    block_mask = BlockMask.from_kv_blocks(num, idx, mask_mod=bad, seq_lengths=(256, 256))
    compiled = torch.compile(functools.partial(flex_attention, block_mask=block_mask), backend="neuron")
    with pytest.raises(IndexError, match="out of range"):
        compiled(q, k, v)
        torch.neuron.synchronize()
    assert (torch.ones(4, device=DEV) + 1).sum().item() == 8


def test_integer_division_by_zero_and_a_repeated_block_raise():
    q, k, v = (t.detach() for t in inputs(1, 2, 2, 128, 16, seed=13))
    zero = torch.zeros(2, dtype=torch.int64, device=DEV)
    divide = torch.compile(functools.partial(flex_attention, score_mod=lambda s, b, h, qi, kv: s + qi % zero[h]),
                           backend="neuron")
    with pytest.raises(RuntimeError, match="divided an integer by zero"):
        divide(q, k, v)
        torch.neuron.synchronize()
    twice = BlockMask.from_kv_blocks(torch.full((1, 1, 1), 2, dtype=torch.int32, device=DEV),
                                     torch.zeros(1, 1, 1, 2, dtype=torch.int32, device=DEV), seq_lengths=(128, 128))
    with pytest.raises(RuntimeError, match="lists block 0 twice"):
        torch.compile(functools.partial(flex_attention, block_mask=twice), backend="neuron")(q, k, v)
        torch.neuron.synchronize()
    assert (torch.ones(4, device=DEV) + 1).sum().item() == 8


@pytest.mark.runs_eagerly
def test_a_mod_without_a_lowering_runs_eagerly_with_its_reason():
    q, k, v = (t.detach() for t in inputs(1, 2, 2, 128, 16, seed=8))
    score_mod = lambda s, b, h, qi, kv: s + torch.atan(s)  # noqa: E731 (no program lowering of atan)
    out = torch.compile(functools.partial(flex_attention, score_mod=score_mod), backend="neuron")(q, k, v)
    torch.testing.assert_close(out, flex_attention(q, k, v, score_mod=score_mod), **F32)
    m = compile_metrics()
    assert m["flex_attention"] == 0 and any("aten::atan" in r for r in m["eager_reasons"]), m
