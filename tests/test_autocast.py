"""torch.autocast("neuron") against CUDA's autocast policy, and GradScaler.

The op lists and arguments are PyTorch's own (torch.testing._internal.autocast_test_lists, what
test_cuda.py runs on CUDA): each op's output dtype under autocast must be what CUDA autocast
gives, and its values must equal running the op on explicitly cast inputs.
"""
import collections
import warnings

import pytest
import torch
from torch.testing._internal.autocast_test_lists import AutocastTestLists

import torch_neuronx  # noqa: F401

DEV = torch.device("neuron")
_L = AutocastTestLists(DEV)


# CUDA library entry points (cuDNN/MIOpen, CUDA's fused RNN cells) that only CUDA code calls;
# on neuron convolutions and RNN cells go through their public ops, which are in the lists.
CUDA_ONLY = ("cudnn_", "miopen_", "_thnn_fused")


def pairs(lst):
    out = []
    for x in lst:
        if x[0].startswith(CUDA_ONLY):
            continue
        if len(x) == 3 and x[2]:
            # A third field is upstream's skip flag (ROCm); its einsum entry, whose equation does
            # not fit its operands, is always skipped there: einsum is checked below instead.
            continue
        else:
            out.append((x[0], x[1]))
    return out


class LISTS:  # (op, args) pairs
    torch_fp16 = pairs(_L.torch_fp16)
    torch_fp32 = pairs(_L.torch_fp32)
    torch_need_autocast_promote = pairs(_L.torch_need_autocast_promote)
    torch_expect_builtin_promote = _L.torch_expect_builtin_promote
    nn_fp16 = pairs(_L.nn_fp16)
    nn_fp32 = pairs(_L.nn_fp32)
    linalg_fp16 = pairs(_L.linalg_fp16)
    methods_fp16 = pairs(_L.methods_fp16)
    methods_fp32 = pairs(_L.methods_fp32)
    banned = _L.banned


def cast(v, to):
    if isinstance(v, torch.Tensor):
        return v.to(to) if v.is_floating_point() and v.dtype != torch.float64 else v
    if isinstance(v, collections.abc.Iterable) and not isinstance(v, str):
        return type(v)(cast(x, to) for x in v)
    return v


def run(op, args, run_as, out_type=None, module=torch, amp_dtype=torch.float16):
    """PyTorch's _run_autocast_outofplace: dtype under autocast, and equality with the op run
    on inputs cast by hand (autocast disabled)."""
    out_type = out_type if out_type is not None else run_as
    fn = getattr(module, op, None)
    with torch.autocast("neuron", dtype=amp_dtype):
        out = fn(*args) if fn is not None else getattr(args[0], op)(*args[1:])
    first = out[0] if isinstance(out, (tuple, list)) else out
    assert first.dtype == out_type, (op, first.dtype, out_type)
    control = fn(*cast(args, run_as)) if fn is not None else getattr(cast(args[0], run_as), op)(*cast(args[1:], run_as))
    ctrl = control[0] if isinstance(control, (tuple, list)) else control
    torch.testing.assert_close(first.cpu(), ctrl.cpu(), rtol=0, atol=0, equal_nan=True)


def ids(lst):
    return [f"{i}-{x[0]}" for i, x in enumerate(lst)]


def test_autocast_registers_every_op_cuda_autocasts():
    # Same op set as AutocastCUDA: nothing of CUDA's policy is missing on neuron.
    names = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::")]
    cuda = {n for n in names if torch._C._dispatch_has_kernel_for_dispatch_key(n, "AutocastCUDA")}
    neuron = {n for n in names if torch._C._dispatch_has_kernel_for_dispatch_key(n, "AutocastPrivateUse1")}
    assert len(cuda) > 100
    assert {n for n in cuda - neuron if not n[len("aten::"):].startswith(CUDA_ONLY)} == set()


def test_defaults():
    assert torch.get_autocast_dtype("neuron") == torch.bfloat16
    assert torch.neuron.get_amp_supported_dtype() == [torch.bfloat16, torch.float16, torch.float32]
    assert torch.neuron.is_bf16_supported()
    with torch.autocast("neuron"):
        assert torch.is_autocast_enabled("neuron")
        assert (torch.ones(2, 2, device=DEV) @ torch.ones(2, 2, device=DEV)).dtype == torch.bfloat16
    assert not torch.is_autocast_enabled("neuron")


def test_float32_autocast_is_accepted_as_on_cuda():
    # CUDA accepts dtype=float32 (lower-precision ops then run in float32); a refused dtype
    # warns and disables autocast, which the warning filter turns into a failure here.
    a = torch.randn(8, 8, dtype=torch.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autocast("neuron", dtype=torch.float32):
            assert torch.is_autocast_enabled("neuron")
            assert torch.get_autocast_dtype("neuron") == torch.float32
            y = a.to(DEV) @ a.to(DEV)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.cpu(), a.float() @ a.float())


@pytest.mark.parametrize("op,args", LISTS.torch_fp16, ids=ids(LISTS.torch_fp16))
def test_lower_precision_ops(op, args):
    run(op, args, torch.float16)


def test_einsum_lower_precision():
    a, b = torch.randn(2, 3, 4, device=DEV), torch.randn(2, 4, 5, device=DEV)
    run("einsum", ("bij,bjk->bik", a, b), torch.float16)
    run("einsum", ("bij,bjk->bik", a, b), torch.bfloat16, amp_dtype=torch.bfloat16)


@pytest.mark.parametrize("op,args", LISTS.torch_fp16[2:12], ids=ids(LISTS.torch_fp16[2:12]))
def test_lower_precision_ops_bf16(op, args):
    run(op, args, torch.bfloat16, amp_dtype=torch.bfloat16)


@pytest.mark.parametrize("op,args", LISTS.torch_fp32, ids=ids(LISTS.torch_fp32))
def test_fp32_ops(op, args):
    run(op, args, torch.float32)


@pytest.mark.parametrize("op,args", LISTS.torch_need_autocast_promote, ids=ids(LISTS.torch_need_autocast_promote))
def test_promote_ops(op, args):
    run(op, args, torch.float32)


@pytest.mark.parametrize("op,args,out_type", LISTS.torch_expect_builtin_promote,
                         ids=ids(LISTS.torch_expect_builtin_promote))
def test_builtin_promote_ops(op, args, out_type):
    with torch.autocast("neuron", dtype=torch.float16):
        out = getattr(torch, op)(*args)
    if isinstance(out, torch.Tensor):
        assert out.dtype == out_type


@pytest.mark.parametrize("op,args", LISTS.nn_fp16, ids=ids(LISTS.nn_fp16))
def test_nn_lower_precision_ops(op, args):
    run(op, args, torch.float16, module=torch._C._nn)


@pytest.mark.parametrize("op,args", LISTS.nn_fp32, ids=ids(LISTS.nn_fp32))
def test_nn_fp32_ops(op, args):
    run(op, args, torch.float32, module=torch._C._nn)


@pytest.mark.parametrize("op,args", LISTS.linalg_fp16, ids=ids(LISTS.linalg_fp16))
def test_linalg_lower_precision_ops(op, args):
    run(op, args, torch.float16, module=torch._C._linalg)


@pytest.mark.parametrize("op,args", LISTS.methods_fp16 + LISTS.methods_fp32,
                         ids=ids(LISTS.methods_fp16 + LISTS.methods_fp32))
def test_method_ops(op, args):
    run(op, args, torch.float16 if (op, args) in LISTS.methods_fp16 else torch.float32, module=None)


@pytest.mark.parametrize("op,args,module", LISTS.banned, ids=ids(LISTS.banned))
def test_banned_ops(op, args, module):
    with torch.autocast("neuron"):
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            getattr(module, op)(*args)


def _train(device, dtype, steps=6, inject_inf_at=None, scaler_device=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler(scaler_device or device.type if isinstance(device, torch.device) else device)
    g = torch.Generator().manual_seed(1)
    skipped = []
    for step in range(steps):
        x = torch.randn(32, 8, generator=g).to(device)
        y = torch.randn(32, 4, generator=g).to(device)
        with torch.autocast(torch.device(device).type, dtype=dtype):
            loss = torch.nn.functional.mse_loss(model(x), y)
        if step == inject_inf_at:
            loss = loss * float("inf")
        before = [p.detach().cpu().clone() for p in model.parameters()]
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        skipped.append(all(torch.equal(b, p.detach().cpu()) for b, p in zip(before, model.parameters())))
    return model, scaler, skipped


def test_grad_scaler_skips_the_step_with_an_injected_inf():
    model, scaler, skipped = _train("neuron", torch.float16, inject_inf_at=3)
    assert skipped == [False, False, False, True, False, False]
    assert scaler.get_scale() == 65536.0 / 2  # halved once, by the inf step
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_fp16_scaler_training_matches_cpu_autocast():
    # Linear runs in float16 and mse_loss in float32 under both devices' policies: the same
    # scaled training run on CPU and on neuron ends with the same parameters and scale.
    dev_model, dev_scaler, dev_skipped = _train("neuron", torch.float16, steps=8)
    cpu_model, cpu_scaler, cpu_skipped = _train("cpu", torch.float16, steps=8)
    assert dev_skipped == cpu_skipped == [False] * 8
    assert dev_scaler.get_scale() == cpu_scaler.get_scale()
    for d, c in zip(dev_model.parameters(), cpu_model.parameters()):
        torch.testing.assert_close(d.detach().cpu(), c.detach(), rtol=1e-3, atol=1e-3)
