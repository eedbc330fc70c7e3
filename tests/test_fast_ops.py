"""The unboxed entry points of the hottest ops (csrc/backend/fast_ops.cpp): registered where the
fallback was, same results as CPU, same errors, in-place returns are the argument itself."""
import pytest
import torch
import torch.nn.functional as F

import torch_neuronx

DEV = "neuron"


def _private_use1_line(op):
    lines = [l for l in torch._C._dispatch_dump(op).splitlines() if l.startswith("PrivateUse1:")]
    assert len(lines) == 1, torch._C._dispatch_dump(op)
    return lines[0]


def test_every_fast_op_has_an_unboxed_kernel_on_neuron():
    ops = torch_neuronx._C._fast_ops()
    assert len(ops) >= 35 and "aten::add.Tensor" in ops and "aten::mm" in ops
    for op in ops:
        # An unboxed registration shows both forms (SymInt signatures are listed as boxed only:
        # their unboxed form is the SymInt one); the boxed fallback shows only "boxed".
        line = _private_use1_line(op)
        assert "[ boxed unboxed ]" in line or "SymInt" in line, op
    # Ops outside the table keep the boxed fallback.
    assert "[ boxed ]" in _private_use1_line("aten::cos")


def test_calls_go_through_the_entry_points():
    x = torch.randn(8, 32, device=DEV, requires_grad=True)
    before = torch_neuronx._C._fast_ops()
    y = F.layer_norm(x, (32,))
    (y * x).sum().backward()
    torch.nn.functional.embedding(torch.tensor([1, 2], device=DEV),
                                  torch.randn(4, 3, device=DEV, requires_grad=True)).sum().backward()
    after = torch_neuronx._C._fast_ops()
    for op in ("aten::native_layer_norm", "aten::native_layer_norm_backward", "aten::mul.Tensor",
               "aten::embedding_dense_backward", "aten::index_select"):
        assert after[op] > before[op], op
    assert after["aten::mm"] == before["aten::mm"]


def test_a_training_step_through_the_fast_ops_equals_cpu():
    # Ordinary sizes: a 2-layer MLP with layer norm over 64x1024 activations, forward, backward
    # and an AdamW step (foreach off: the per-tensor in-place ops of the table).
    torch_neuronx.reset_metrics()
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(1024, 1024, generator=g) * 0.02, torch.randn(1024, 256, generator=g) * 0.02]
    x = torch.randn(64, 1024, generator=g)
    results = {}
    for dev in ("cpu", DEV):
        params = [torch.nn.Parameter(w.clone().to(dev)) for w in ws]  # (to("cpu") would alias ws)
        opt = torch.optim.AdamW(params, lr=1e-3, foreach=False)
        for _ in range(3):
            opt.zero_grad()
            h = F.layer_norm(F.gelu(x.to(dev) @ params[0]), (1024,))
            loss = torch.log_softmax(torch.relu(h) @ params[1], dim=-1).mean()
            loss.backward()
            opt.step()
        results[dev] = [loss.detach().cpu()] + [p.detach().cpu() for p in params]
    for c, n in zip(results["cpu"], results[DEV]):
        torch.testing.assert_close(n, c, rtol=1e-5, atol=1e-6)
    ops = torch_neuronx.metrics()["ops"]
    for op in ("aten::mm", "aten::gelu", "aten::native_layer_norm", "aten::addcdiv_", "aten::lerp_.Scalar"):
        # (the first call of a signature runs inline: it validates the dtypes)
        assert ops.get(op, {}).get("async", 0) >= 2, (op, ops.get(op))


def test_in_place_returns_are_the_argument_and_results_are_cpus():
    a = torch.randn(1000, device=DEV)
    b = torch.randn(1000, device=DEV)
    ac, bc = a.cpu(), b.cpu()
    assert a.add_(b, alpha=2) is a
    assert a.mul_(b) is a
    assert a.fill_(3.5) is a and torch.equal(a.cpu(), torch.full((1000,), 3.5))
    assert a.zero_() is a and torch.equal(a.cpu(), torch.zeros(1000))
    torch.testing.assert_close((ac + bc).sum(), (a.copy_(ac.to(DEV)) + b).sum().cpu())
    # A host 0-dim operand and a Python scalar, as on CPU.
    torch.testing.assert_close((b * torch.tensor(2.0)).cpu(), bc * 2.0, rtol=0, atol=0)
    torch.testing.assert_close(torch.where(b > 0, b, 0.0).cpu(), torch.where(bc > 0, bc, 0.0), rtol=0, atol=0)


def test_errors_are_cpus():
    a = torch.randn(3, 4, device=DEV)
    with pytest.raises(RuntimeError) as dev_err:
        torch.add(a, torch.randn(5, device=DEV))
    with pytest.raises(RuntimeError) as cpu_err:
        torch.add(a.cpu(), torch.randn(5))
    assert str(dev_err.value) == str(cpu_err.value)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.mm(a, torch.randn(4, 2))
    # The device is still usable and the operands unchanged.
    torch.testing.assert_close((a @ a.T).cpu(), a.cpu() @ a.cpu().T)


def test_operands_keep_their_reference_counts():
    import sys

    a = torch.randn(16, device=DEV)
    b = torch.randn(16, device=DEV)
    before = sys.getrefcount(a), sys.getrefcount(b)
    for _ in range(1000):
        a + b
        a.add_(b)
        a.sum()
    torch.neuron.synchronize()
    assert (sys.getrefcount(a), sys.getrefcount(b)) == before


def test_reused_cpu_aliases_keep_each_kernels_dtype_shape_and_flags():
    """Queued kernels run on CPU views of the device buffers; the engine reuses the views of
    finished kernels. A stream of ops that alternate dtypes, ranks, strides, 0-dim wrapped
    scalars and 0-dim tensors must give CPU's values, and the views were reused. (Conjugate
    and negative views reach kernels resolved by ATen's fallbacks; they are in the stream too.)"""
    torch.manual_seed(0)
    cpu = {
        "f": torch.randn(64, 96),
        "d": torch.randn(96, dtype=torch.float64),
        "i": torch.randint(-50, 50, (3, 5, 7)),
        "z": torch.randn(40, dtype=torch.complex64),
        "s": torch.tensor(2.5),
    }
    dev = {k: v.to(DEV) for k, v in cpu.items()}

    def steps(t):
        out = []
        for k in range(30):  # many kernels: finished ones' views are handed to later ones
            out.append(t["f"].t() * (k + 1) + t["f"].t().relu())  # transposed (non-contiguous) operands
            out.append(t["d"] + 1.5)  # a Python scalar: a 0-dim wrapped number operand
            out.append((t["i"] * 3 - k).sum(dim=1))
            out.append(t["z"].conj() * (1 + 2j))  # a conjugate view operand ...
            out.append(t["z"] * (k - 2j))  # ... then plain ones of the same dtype
            out.append(t["z"].conj().imag * 2)  # a negative view operand (imag of a conjugate) ...
            out.append(t["f"][k] * 2)  # ... then plain ones of the same dtype
            out.append(t["s"] * t["f"][k])  # a 0-dim tensor operand
        return out

    torch_neuronx.reset_metrics()
    got = [x.cpu() for x in steps(dev)]
    aliases = torch_neuronx.metrics()["aliases"]
    want = steps(cpu)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert aliases["reused"] > 200 and aliases["reused"] > aliases["made"], aliases
