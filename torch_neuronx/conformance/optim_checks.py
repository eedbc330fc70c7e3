"""Checks of one OptimizerInfo at one dtype: every optimizer configuration, in its for-loop,
foreach and fused forms, stepped on neuron and on CPU from the same parameters and data."""
import warnings

import torch

from .compare import DEVICE, assert_same
from .op_checks import SEED, _skip

STEPS = 5


def optim_key(info):
    return info.optim_cls.__name__


def _params(dtype, device, sparse, matrices_only):
    g = torch.Generator().manual_seed(SEED)
    if sparse:  # SparseAdam: an embedding table whose gradients are sparse
        w = torch.randn(10, 4, generator=g, dtype=dtype)
        return [w.to(device).requires_grad_()]
    w = torch.randn(4, 5, generator=g, dtype=dtype)
    b = torch.randn(4, generator=g, dtype=dtype)
    if matrices_only:  # Muon: 2-D parameters only
        return [w.to(device).requires_grad_()]
    return [w.to(device).requires_grad_(), b.to(device).requires_grad_()]


def _loss(params, dtype, device, step, sparse):
    g = torch.Generator().manual_seed(SEED + step)
    if sparse:
        idx = torch.randint(0, 10, (6,), generator=g).to(device)
        return torch.nn.functional.embedding(idx, params[0], sparse=True).pow(2).sum()
    x = torch.randn(5, 3, generator=g, dtype=dtype).to(device)
    y = params[0] @ x + (params[1][:, None] if len(params) > 1 else 0)
    return (y.abs() if y.is_complex() else y).pow(2).sum()


def _to(v, device):
    return v.to(device) if isinstance(v, torch.Tensor) else v


def _train(info, kwargs, dtype, device, matrices_only=False):
    sparse = info.only_supports_sparse_grads
    params = _params(dtype, device, sparse, matrices_only)
    kw = {k: _to(v, device) for k, v in kwargs.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = info.optim_cls(params, **kw)
        losses = []
        for step in range(STEPS):
            def closure():
                opt.zero_grad()
                loss = _loss(params, dtype, device, step, sparse)
                loss.backward()
                return loss
            losses.append(opt.step(closure))
    if device == DEVICE:
        torch.neuron.synchronize()
    state = [{k: v for k, v in opt.state[p].items()} for p in params]
    return [p.detach() for p in params], [float(l) for l in losses if l is not None], state


def check_optimizer(info, kwargs, dtype):
    matrices_only = False
    try:
        cpu = _train(info, kwargs, dtype, "cpu")
    except ValueError as e:
        if "2D parameters" not in str(e):
            _skip(f"CPU rejects this configuration: ValueError: {str(e).splitlines()[0][:150]}")
        matrices_only = True  # an optimizer for weight matrices only (Muon)
        cpu = _train(info, kwargs, dtype, "cpu", matrices_only)
    except Exception as e:
        _skip(f"CPU rejects this configuration: {type(e).__name__}: {str(e).splitlines()[0][:150]}")
    dev = _train(info, kwargs, dtype, DEVICE, matrices_only)
    bitwise = assert_same(dev[0], cpu[0], "params", check_strides=False)
    bitwise &= assert_same(dev[1], cpu[1], "losses")
    bitwise &= assert_same(dev[2], cpu[2], "state", check_strides=False, host_ok=True)
    return bitwise, None


def cases(info, dtype, max_samples=None):
    key = optim_key(info)
    dt = str(dtype).replace("torch.", "")
    if dtype.is_complex and not info.supports_complex:
        return
    configs = []
    for oi in info.optim_inputs_func(device="cpu", dtype=dtype):
        if oi.params is not None:
            continue  # configurations that bring their own parameters exercise param groups only
        kw = dict(oi.kwargs)
        desc = oi.desc.replace(" ", "_") or "default"
        configs.append((f"{desc}", kw))
        if "foreach" in info.supported_impls and "foreach" not in kw:
            configs.append((f"{desc}+foreach", {**kw, "foreach": True}))
        if ("fused" in info.supported_impls and "cpu" in info.supports_fused_on and "fused" not in kw
                and not kw.get("differentiable") and not kw.get("capturable") and not dtype.is_complex):
            configs.append((f"{desc}+fused", {**kw, "fused": True}))
    for i, (desc, kw) in enumerate(configs[:max_samples]):
        yield f"{key}|{dt}|{i}:{desc}", "optim", (lambda kw=kw: check_optimizer(info, kw, dtype))
