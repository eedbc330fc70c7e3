"""torch_neuronx._torch_compat: where PyTorch's Python decides by device name, neuron gets what
CUDA (or CPU, whose kernels neuron runs) gets, and an unchecked torch version changes nothing."""
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.modules.linear_cross_entropy_options import LinearCrossEntropyOptions

import torch_neuronx
import torch_neuronx._torch_compat as compat

DEV = torch.device("neuron")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_linear_cross_entropy_accumulates_in_float32_as_on_cpu_and_cuda(dtype):
    # A vocabulary head of ordinary size, chunked: in the input dtype the loss and gradients
    # drift from CPU's (which accumulates in float32); with float32 accumulation they match.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 256, generator=g).to(dtype)
    w = (torch.randn(4096, 256, generator=g) * 0.05).to(dtype)
    y = torch.randint(0, 4096, (512,), generator=g)
    opts = LinearCrossEntropyOptions()
    assert opts._adjust(512, 256, 4096, dtype, DEV).acc_dtype == torch.float32
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    loss_c = F.linear_cross_entropy(xc, wc, y, options=opts)
    loss_c.backward()
    xd, wd = x.to(DEV).requires_grad_(), w.to(DEV).requires_grad_()
    loss_d = F.linear_cross_entropy(xd, wd, y.to(DEV), options=opts)
    loss_d.backward()
    torch.testing.assert_close(loss_d.cpu(), loss_c, rtol=0, atol=0)
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, rtol=0, atol=0)
    torch.testing.assert_close(wd.grad.cpu(), wc.grad, rtol=0, atol=0)


def test_the_adjustments_are_in_effect():
    assert {"flex_attention_device", "higher_order_autocast", "linear_cross_entropy_accumulation",
            "multi_backend_default", "out_dtype_int_mm", "conv_memory_format"} <= set(compat.applied())
    # Other higher-order ops pass autocast through on neuron, as on CPU and CUDA.
    from torch._C import DispatchKey
    from torch._higher_order_ops.cond import cond_op

    assert not cond_op.non_fallthrough_keys.has(DispatchKey.AutocastPrivateUse1)


def test_an_unchecked_torch_version_warns_and_changes_nothing(monkeypatch):
    monkeypatch.setattr(compat, "_applied", [])
    monkeypatch.setattr(torch, "__version__", "9.0.0")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        compat.apply()
    assert compat.applied() == []
    assert any("not a version its PyTorch adjustments were checked against" in str(x.message) for x in w)


def test_training_utilities_have_nothing_device_specific_to_warn_about(tmp_path):
    """What a CUDA training script calls, on neuron: pinned DataLoader batches copied without
    blocking, autocast, activation checkpointing, GradScaler, gradient clipping, the default
    optimizer, SDPA, a device generator, a weights-only checkpoint round trip. PyTorch warns or
    takes a slower path where a device is not supported; none of that may show here."""
    from torch.utils.checkpoint import checkpoint
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(DEV)
    opt = torch.optim.AdamW(m.parameters())
    scaler = torch.amp.GradScaler("neuron")
    data = DataLoader(TensorDataset(torch.randn(64, 16), torch.randn(64, 4)), batch_size=16, pin_memory=True)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for x, y in data:
            assert x.is_pinned() and y.is_pinned()  # pinned by the DataLoader for this device
            x, y = x.to(DEV, non_blocking=True).requires_grad_(), y.to(DEV, non_blocking=True)
            with torch.autocast("neuron", dtype=torch.bfloat16):
                out = checkpoint(m, x, use_reentrant=False)
            loss = F.mse_loss(out.float(), y)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        q = torch.randn(2, 4, 32, 16, device=DEV)
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
        g = torch.Generator(device=DEV).manual_seed(1)
        torch.randn(3, device=DEV, generator=g)
        torch.save(m.state_dict(), tmp_path / "m.pt")
        state = torch.load(tmp_path / "m.pt", weights_only=True)
    assert all(v.device.type == "neuron" for v in state.values())
    assert torch.isfinite(loss).item()
    assert [str(x.message) for x in w] == []


def test_default_backend_compiles_neuron_graphs_with_the_neuron_backend():
    # torch.compile's default backend is Inductor, which has no code generator for neuron: such a
    # graph goes to the neuron backend (TorchTitan compiles its FlexAttention block masks this way).
    from torch.nn.attention.flex_attention import create_block_mask

    from torch_neuronx.compile import compile_metrics, reset_compile_metrics

    torch._dynamo.reset()
    reset_compile_metrics()
    x = torch.randn(64)
    f = torch.compile(lambda t: torch.sin(t) * 2 + 1)
    torch.testing.assert_close(f(x.to("neuron")).cpu(), torch.sin(x) * 2 + 1)
    mask = torch.compile(create_block_mask)(lambda b, h, q, kv: q >= kv, 1, 1, 256, 256, device="neuron")
    assert mask.kv_num_blocks.device.type == "neuron" and mask.sparsity() == 25.0
    m = compile_metrics()
    assert m["compiles"] >= 2 and m["eager_graphs"] == 0, m["eager_reasons"]
    assert "inductor_on_neuron" in compat.applied()
    torch._dynamo.reset()


def test_rng_state_replay_ops_run_on_neuron():
    # AOTAutograd replays random ops in recomputed (activation-checkpointed) regions with these
    # higher-order ops; their device map knew cuda, cpu, hpu and xpu only.
    from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state

    torch.manual_seed(0)
    rand = torch.ops.aten.rand.default
    state, a = run_and_save_rng_state(rand, [1000], device=torch.device("neuron"))
    after = torch.rand(10, device="neuron").cpu()
    b = run_with_rng_state(state, rand, [1000], device=torch.device("neuron"))
    assert a.device.type == "neuron" and torch.equal(a.cpu(), b.cpu())
    assert torch.equal(a.cpu(), torch.rand(1000, generator=torch.Generator().manual_seed(0)))
    # run_with_rng_state leaves the generator where it was.
    assert not torch.equal(torch.rand(10, device="neuron").cpu(), after)
    assert "rng_state_higher_order_ops" in compat.applied()


def test_printing_reads_the_device_once():
    # Printing formats a host copy of the elements it reads (summarized tensors: the corners), with
    # the same text as formatting on the device, which read element after element.
    import torch._tensor_str as ts

    torch.manual_seed(0)
    cases = [torch.tensor(3.5), torch.empty(0), torch.randn(5), torch.randn(2000), torch.randn(100, 100),
             torch.randn(20, 30, 40), torch.randn(7, 1001).to(torch.bfloat16), torch.randint(-5, 5, (3000,)),
             torch.rand(50, 50) > 0.5, torch.randn(40, 40, dtype=torch.complex64), torch.randn(300, 400).t(),
             torch.tensor([float("inf"), float("nan"), 1e-8, 1e8] * 300), torch.randn(6, 6).to(torch.float8_e4m3fn),
             torch.randint(-128, 127, (512, 256), dtype=torch.int8), torch.randn(2, 3, 4, 5, 6, 7)]
    dev = [c.to("neuron") for c in cases] + [torch.nn.Parameter(torch.randn(3000, device="neuron")) * 2]
    patched = ts._tensor_str
    assert "print_from_host_copy" in compat.applied() and patched._neuron
    got = [str(d) for d in dev]
    ts._tensor_str = patched._original
    try:
        expected = [str(d) for d in dev]
    finally:
        ts._tensor_str = patched
    for g, e, d in zip(got, expected, dev):
        assert g == e, (d.shape, d.dtype)
    for x in (dev[-3], dev[-2]):  # 131,072 int8 elements; a 6-d tensor; both summarized
        syncs = sum(torch_neuronx.metrics()["syncs"].values())
        repr(x)
        assert sum(torch_neuronx.metrics()["syncs"].values()) - syncs == 1, x.shape  # one copy (the int8 was 48 reads)
