"""Routing PyTorch ops on neuron to the kernel library (TORCH_NEURONX_NKI_KERNELS / kernels.enable):
SDPA and rms_norm in eager mode, under autograd, in inference mode and inside torch.compile
graphs; what the kernels do not cover falls back to ATen."""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import torch_neuronx  # noqa: F401
from torch_neuronx.nki import kernels

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from helpers import clean_env  # noqa: E402


@pytest.fixture
def routed():
    kernels.enable("attention", "rmsnorm")
    yield
    kernels.disable()


def _counts():
    s = kernels.stats()
    return dict(s["routed"]), dict(s["fallback"])


def _launches(fn):
    with torch.profiler.profile() as prof:
        r = fn()
        torch.neuron.synchronize()
    return r, sum(1 for e in prof.events() if e.name == "nki::launch")


def test_sdpa_runs_the_flash_kernel_forward_and_backward(routed):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 8, 300, 64, requires_grad=True) for _ in range(3))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref.sum().backward()
    qn, kn, vn = (t.detach().to("neuron").requires_grad_() for t in (q, k, v))
    before, _ = _counts()
    out, launches = _launches(lambda: F.scaled_dot_product_attention(qn, kn, vn, is_causal=True))
    assert launches >= 1 and _counts()[0]["attention"] == before["attention"] + 1
    torch.testing.assert_close(out.cpu(), ref, atol=2e-5, rtol=1e-4)
    out.sum().backward()
    for a, b in ((qn, q), (kn, k), (vn, v)):
        torch.testing.assert_close(a.grad.cpu(), b.grad, atol=1e-4, rtol=1e-3)


def test_sdpa_gqa_in_inference_mode(routed):
    q = torch.randn(1, 8, 129, 128, dtype=torch.bfloat16)
    k, v = torch.randn(1, 2, 129, 128, dtype=torch.bfloat16), torch.randn(1, 2, 129, 128, dtype=torch.bfloat16)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
    with torch.inference_mode():
        out, launches = _launches(lambda: F.scaled_dot_product_attention(
            q.to("neuron"), k.to("neuron"), v.to("neuron"), enable_gqa=True))
    assert launches >= 1
    torch.testing.assert_close(out.cpu().float(), ref, atol=2e-2, rtol=2e-2)


def test_sdpa_with_a_mask_or_dropout_falls_back_to_aten(routed):
    q = torch.randn(1, 2, 64, 32)
    mask = torch.rand(64, 64) > 0.3
    r0, f0 = _counts()
    out, launches = _launches(lambda: F.scaled_dot_product_attention(
        q.to("neuron"), q.to("neuron"), q.to("neuron"), attn_mask=mask.to("neuron")))
    r1, f1 = _counts()
    assert launches == 0 and r1["attention"] == r0["attention"] and f1["attention"] == f0["attention"] + 1
    torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q, q, q, attn_mask=mask))


def test_rms_norm_runs_the_kernel_forward_and_backward(routed):
    torch.manual_seed(0)
    x = torch.randn(4, 250, 1024, requires_grad=True)
    w = torch.randn(1024, requires_grad=True)
    ref = F.rms_norm(x, (1024,), w, 1e-6)
    (ref * ref).sum().backward()
    xn, wn = x.detach().to("neuron").requires_grad_(), w.detach().to("neuron").requires_grad_()
    y, launches = _launches(lambda: F.rms_norm(xn, (1024,), wn, 1e-6))
    assert launches >= 1
    torch.testing.assert_close(y.cpu(), ref, atol=1e-5, rtol=1e-5)
    (y * y).sum().backward()
    torch.testing.assert_close(xn.grad.cpu(), x.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(wn.grad.cpu(), w.grad, atol=1e-3, rtol=1e-4)
    # normalizing over two dims is not covered: ATen's composite
    z = torch.randn(8, 16, 32)
    torch.testing.assert_close(F.rms_norm(z.to("neuron"), (16, 32)).cpu(), F.rms_norm(z, (16, 32)))


def test_compiled_graphs_call_the_kernels(routed):
    torch.manual_seed(0)
    w = torch.randn(256)

    def block(x, q, k, v):
        return F.rms_norm(x, (256,), w.to(x.device), 1e-5), F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = torch.randn(3, 200, 256)
    q, k, v = (torch.randn(1, 4, 200, 64) for _ in range(3))
    ref = block(x, q, k, v)
    cb = torch.compile(block, backend="neuron", fullgraph=True)
    args = [t.to("neuron") for t in (x, q, k, v)]
    cb(*args)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.PrivateUse1]
    with torch.profiler.profile(activities=acts) as prof:
        y, o = cb(*args)
        torch.neuron.synchronize()
    names = {e.name for e in prof.events()}
    # both kernels ran as steps of the compiled program
    assert {"neuron::executable", "nki_kernels::flash_attention", "nki_kernels::rms_norm"} <= names
    torch.testing.assert_close(y.cpu(), ref[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(o.cpu(), ref[1], atol=2e-5, rtol=1e-4)


def test_disable_restores_aten_and_unknown_kinds_are_refused():
    q = torch.randn(1, 2, 64, 32).to("neuron")
    kernels.enable("attention")
    kernels.disable()
    assert kernels.enabled() == ()
    _, launches = _launches(lambda: F.scaled_dot_product_attention(q, q, q))
    assert launches == 0
    with pytest.raises(ValueError, match="unknown NKI kernel kind 'flash'"):
        kernels.enable("flash")


def test_environment_variable_enables_the_routes():
    code = ("import torch, torch_neuronx; from torch_neuronx.nki import kernels; print(kernels.enabled())")
    env = clean_env()
    env["TORCH_NEURONX_NKI_KERNELS"] = "attention,rmsnorm"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("('attention', 'rmsnorm')")


def test_routes_match_aten_at_the_edges(routed):
    # rms_norm without eps: ATen's default is float32's epsilon, for bf16 inputs too
    x = torch.full((2, 8), 1e-3, dtype=torch.bfloat16)
    torch.testing.assert_close(F.rms_norm(x.to("neuron"), (8,)).cpu(), F.rms_norm(x, (8,)))
    # empty batches and heads fall back to ATen instead of raising
    for shape in ((0, 2, 4, 8), (1, 0, 4, 8)):
        q = torch.randn(shape)
        assert F.scaled_dot_product_attention(q.to("neuron"), q.to("neuron"), q.to("neuron")).shape == shape
