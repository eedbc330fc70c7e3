"""The library's torch ops (torch.ops.nki_kernels.*) under autograd on neuron: forward and
gradients against the ATen composition on CPU."""
import pytest
import torch
import torch.nn.functional as F

import torch_neuronx  # noqa: F401
from torch_neuronx.nki import kernels


def _leaves(*ts):
    cpu = [t.clone().requires_grad_() for t in ts]
    dev = [t.to("neuron").requires_grad_() for t in ts]
    return cpu, dev


def _check(ref_fn, nki_fn, inputs, atol, rtol):
    cpu, dev = _leaves(*inputs)
    ref = ref_fn(*cpu)
    out = nki_fn(*dev)
    torch.testing.assert_close(out.cpu(), ref.detach(), atol=atol, rtol=rtol)
    g = torch.randn_like(ref)
    ref.backward(g)
    out.backward(g.to("neuron"))
    for a, b in zip(dev, cpu):
        torch.testing.assert_close(a.grad.cpu(), b.grad, atol=atol * 10, rtol=rtol * 10)


def test_swiglu_op_trains():
    torch.manual_seed(0)
    x, wg, wu, wd = torch.randn(300, 256), torch.randn(512, 256) / 16, torch.randn(512, 256) / 16, torch.randn(256, 512) / 22

    def ref(x, wg, wu, wd):
        return (F.silu(x @ wg.T) * (x @ wu.T)) @ wd.T
    _check(ref, kernels.swiglu, (x, wg, wu, wd), 1e-4, 1e-4)


def test_rms_norm_linear_op_trains():
    torch.manual_seed(0)
    x, nw, lw = torch.randn(2, 150, 512), torch.randn(512), torch.randn(384, 512) / 22

    def ref(x, nw, lw):
        return F.rms_norm(x, (512,), nw, 1e-6) @ lw.T
    _check(ref, lambda x, nw, lw: kernels.rms_norm_linear(x, nw, lw, 1e-6), (x, nw, lw), 1e-4, 1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm_op_trains(dtype):
    torch.manual_seed(0)
    x, w, b = torch.randn(517, 768, dtype=dtype), torch.randn(768, dtype=dtype), torch.randn(768, dtype=dtype)
    tol = 2e-5 if dtype == torch.float32 else 2e-2

    def ref(x, w, b):
        return F.layer_norm(x.float(), (768,), w.float(), b.float(), 1e-5).to(dtype)
    cpu, dev = _leaves(x, w, b)
    y = kernels.layer_norm(*dev, eps=1e-5)
    r = ref(*cpu)
    torch.testing.assert_close(y.cpu().float(), r.detach().float(), atol=tol, rtol=tol)
    g = torch.randn_like(r)
    r.backward(g)
    y.backward(g.to("neuron"))
    for a, c in zip(dev, cpu):
        scale = c.grad.float().abs().max()
        torch.testing.assert_close(a.grad.cpu().float(), c.grad.float(), atol=tol * 10 * scale, rtol=tol * 10)


def test_moe_experts_op_forward_and_gradients():
    torch.manual_seed(0)
    T, H, I, E, k = 300, 256, 256, 8, 2
    x = torch.randn(T, H)
    gu, dp = torch.randn(E, 2 * I, H) / 16, torch.randn(E, H, I) / 16
    ids = torch.stack([torch.randperm(E)[:k] for _ in range(T)])
    ids[ids == 7] = 6  # expert 7 receives no token
    ids[:, 1] = torch.where(ids[:, 1] == ids[:, 0], (ids[:, 0] + 1) % 7, ids[:, 1])
    w = torch.softmax(torch.randn(T, k), -1)
    from torch_neuronx.nki.kernels.ops import _moe_reference
    cpu = [t.clone().requires_grad_() for t in (x, gu, dp)]
    dev = [t.to("neuron").requires_grad_() for t in (x, gu, dp)]
    ref = _moe_reference(cpu[0], ids, w, cpu[1], cpu[2])
    out = kernels.moe_experts(dev[0], ids.to("neuron"), w.to("neuron"), dev[1], dev[2])
    torch.testing.assert_close(out.cpu(), ref.detach(), atol=1e-4, rtol=1e-4)
    g = torch.randn_like(ref)
    ref.backward(g)
    out.backward(g.to("neuron"))
    for a, c in zip(dev, cpu):
        torch.testing.assert_close(a.grad.cpu(), c.grad, atol=1e-4, rtol=1e-4)
    assert torch.equal(dev[1].grad[7].cpu(), torch.zeros(2 * I, H))


def test_moe_stage_ops_compose_the_experts_and_run_in_a_compiled_graph():
    from torch_neuronx.nki.kernels import ops
    torch.manual_seed(0)
    T, H, I, E, k = 333, 256, 256, 8, 2
    x, logits = torch.randn(T, H), torch.randn(T, E)
    gu, dp = torch.randn(E, 2 * I, H) / 16, torch.randn(E, H, I) / 16

    def block(x, logits, gu, dp):
        ids, w = ops.moe_route(logits, k)
        xs, offs, order = ops.moe_permute(x, ids, E)
        g = ops.moe_grouped_gemm(xs, offs, gu[:, :I].contiguous())
        u = ops.moe_grouped_gemm(xs, offs, gu[:, I:].contiguous())
        ys = ops.moe_grouped_gemm((F.silu(g) * u).contiguous(), offs, dp)
        return ops.moe_combine(ys, order, w, T), ids, w
    args = [t.to("neuron") for t in (x, logits, gu, dp)]
    y, ids, w = block(*args)
    from torch_neuronx.nki.kernels.ops import _moe_reference
    ref_w, ref_ids = torch.topk(torch.softmax(logits, -1), k)
    assert torch.equal(ids.cpu(), ref_ids)
    torch.testing.assert_close(w.cpu(), ref_w / ref_w.sum(-1, keepdim=True))
    torch.testing.assert_close(y.cpu(), _moe_reference(x, ref_ids, w.cpu(), gu, dp), atol=1e-4, rtol=1e-4)
    cy, _, _ = torch.compile(block, backend="neuron", fullgraph=True)(*args)
    torch.testing.assert_close(cy.cpu(), y.cpu())


def test_mixtral_moe_block_routes_to_the_kernel_when_compiled():
    transformers = pytest.importorskip("transformers")
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    cfg = transformers.MixtralConfig(hidden_size=256, intermediate_size=384, num_local_experts=8,
                                     num_experts_per_tok=2)
    cfg._experts_implementation = "grouped_mm"
    torch.manual_seed(0)
    blk = MixtralSparseMoeBlock(cfg)
    with torch.no_grad():
        for p in blk.parameters():
            p.normal_(0, 0.05)
    blk = blk.eval().to("neuron")
    x = torch.randn(2, 150, 256).to("neuron")
    with torch.no_grad():
        ref = blk(x)
        kernels.enable("moe")
        try:
            before = kernels.stats()["routed"]["moe"]
            out = torch.compile(blk, backend="neuron")(x)
            assert kernels.stats()["routed"]["moe"] > before
        finally:
            kernels.disable()
    torch.testing.assert_close(out.cpu(), ref.cpu(), atol=1e-4, rtol=1e-4)


def test_flash_attention_lse_is_differentiable():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, 150, 64), torch.randn(1, 2, 150, 64), torch.randn(1, 2, 150, 64)

    def ref(q, k, v):
        s = (q @ k.repeat_interleave(2, 1).transpose(-1, -2)) / 8
        s = s.masked_fill(torch.ones(150, 150, dtype=torch.bool).triu(1), float("-inf"))
        return (torch.softmax(s, -1) @ v.repeat_interleave(2, 1)), torch.logsumexp(s, -1)
    cpu = [t.clone().requires_grad_() for t in (q, k, v)]
    dev = [t.to("neuron").requires_grad_() for t in (q, k, v)]
    o, lse = ref(*cpu)
    on, lsen = kernels.flash_attention(*dev, causal=True, return_lse=True)
    torch.testing.assert_close(lsen.cpu(), lse.detach(), atol=1e-5, rtol=1e-5)
    (o.sum() + 3 * lse.sum()).backward()
    (on.sum() + 3 * lsen.sum()).backward()
    for a, b in zip(dev, cpu):
        torch.testing.assert_close(a.grad.cpu(), b.grad, atol=1e-4, rtol=1e-4)
    # only the LSE differentiated: the output's gradient is absent (None), not a tensor to pass on
    qc, qn = q.clone().requires_grad_(), q.to("neuron").requires_grad_()
    ref(qc, k, v)[1].sum().backward()
    kernels.flash_attention(qn, k.to("neuron"), v.to("neuron"), causal=True, return_lse=True)[1].sum().backward()
    torch.testing.assert_close(qn.grad.cpu(), qc.grad, atol=1e-4, rtol=1e-4)
