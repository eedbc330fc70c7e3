"""Calls over hundreds and thousands of tensors at once, as real models make them.

An optimizer step over a model's parameters, `torch.stack`/`cat` of a list, `clip_grad_norm_`:
each is one op whose arguments touch as many device storages as there are tensors. A storage
counter of fixed width on the per-op path hung the process at 256 storages (fused AdamW over
52 parameters: 5 tensors each); these tests run well past that, against CPU.
"""
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn

import torch_neuronx

DEV = torch.device("neuron")


def _params(n, seed=0):
    """n parameters of the mixed shapes a model has (matrices, vectors, scalars-ish), with grads."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(16, 8), (8,), (4, 4, 2), (1,), (32,)]
    ps = []
    for i in range(n):
        p = nn.Parameter(torch.randn(shapes[i % len(shapes)], generator=g))
        p.grad = torch.randn(p.shape, generator=g)
        ps.append(p)
    return ps


def _to_device(ps):
    out = []
    for p in ps:
        q = nn.Parameter(p.detach().to(DEV))
        q.grad = p.grad.to(DEV)
        out.append(q)
    return out


def _run_isolated(code, timeout=240):
    """Runs code in a fresh interpreter with a time limit: a hang fails the test instead of CI."""
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def test_the_reported_snippets_return():
    # Both hung before the fix (one op over more than 255 distinct storages).
    out = _run_isolated("""
        import torch
        ps = [torch.nn.Parameter(torch.randn(4, device="neuron")) for _ in range(52)]
        for p in ps: p.grad = torch.randn_like(p)
        torch.optim.AdamW(ps, fused=True).step()
        s = torch.stack([torch.full((2,), float(i), device="neuron") for i in range(257)])
        assert s[:, 0].cpu().tolist() == [float(i) for i in range(257)]
        print("done", torch.isfinite(ps[51].cpu()).all().item())
    """)
    assert "done True" in out


@pytest.mark.parametrize("n", [300, 1000])
@pytest.mark.parametrize("impl", ["fused", "foreach", "for_loop"])
def test_adamw_over_many_parameters_equals_cpu(n, impl):
    kw = {"fused": dict(fused=True), "foreach": dict(foreach=True), "for_loop": dict(foreach=False)}[impl]
    cpu = _params(n)
    dev = _to_device(cpu)
    opt_c = torch.optim.AdamW(cpu, lr=1e-2, weight_decay=0.1, **kw)
    opt_d = torch.optim.AdamW(dev, lr=1e-2, weight_decay=0.1, **kw)
    for step in range(2):
        opt_c.step()
        opt_d.step()
        for p in cpu:  # new gradients for the second step, the same on both
            p.grad.mul_(0.5).add_(step)
        for p, q in zip(cpu, dev):
            q.grad.copy_(p.grad)
    got = torch.cat([p.detach().flatten() for p in dev]).cpu()
    want = torch.cat([p.detach().flatten() for p in cpu])
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    st = opt_d.state[dev[-1]]
    torch.testing.assert_close(st["exp_avg_sq"].cpu(), opt_c.state[cpu[-1]]["exp_avg_sq"])


@pytest.mark.parametrize("op", [torch.stack, torch.cat])
def test_stack_and_cat_of_a_thousand_tensors(op):
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(3, 5, generator=g) for _ in range(1000)]
    # Some share a storage (views of one buffer), as a model's parameter views do.
    base = torch.randn(200, 3, 5, generator=g)
    xs[::5] = list(base.unbind(0))
    dev = [x.to(DEV) for x in xs]
    shared = base.to(DEV)
    dev[::5] = list(shared.unbind(0))
    op(dev[:2])  # the first call with these dtypes runs inline (dtype validation)
    torch_neuronx.reset_metrics()
    torch.testing.assert_close(op(dev).cpu(), op(xs), rtol=0, atol=0)
    # Queued like any other call (stack is cat of unsqueezed views): not the synchronous path.
    assert torch_neuronx.metrics()["ops"]["aten::cat"] == {"async": 1}


@pytest.mark.parametrize("foreach", [True, False])
def test_clip_grad_norm_over_a_thousand_parameters(foreach):
    cpu = _params(1000, seed=5)
    dev = _to_device(cpu)
    n_c = torch.nn.utils.clip_grad_norm_(cpu, max_norm=1.0, foreach=foreach)
    n_d = torch.nn.utils.clip_grad_norm_(dev, max_norm=1.0, foreach=foreach)
    torch.testing.assert_close(n_d.cpu(), n_c, rtol=1e-5, atol=0)
    got = torch.cat([p.grad.flatten() for p in dev]).cpu()
    torch.testing.assert_close(got, torch.cat([p.grad.flatten() for p in cpu]), rtol=1e-5, atol=1e-7)


def test_foreach_op_over_tensors_sharing_storages_keeps_the_alias_classes_apart():
    # 40 views of one buffer and 40 separate tensors in one foreach call: the meta cache key must
    # tell the two layouts apart (a call with all-separate storages caches another signature).
    base = torch.zeros(40, 4, device=DEV)
    sep = [torch.zeros(4, device=DEV) for _ in range(40)]
    torch._foreach_add_(sep, 1.0)
    torch._foreach_add_(list(base.unbind(0)), 1.0)
    torch._foreach_add_(list(base.unbind(0)) + sep, 2.0)
    assert base.cpu().eq(3).all() and all(t.cpu().eq(3).all() for t in sep)
