"""Routing PyTorch ops on ``neuron`` to the kernel library (opt-in).

``TORCH_NEURONX_NKI_KERNELS=attention,rmsnorm,moe`` (read at import) or :func:`enable` sends
``scaled_dot_product_attention`` and ``nn.functional.rms_norm`` on ``neuron`` tensors to the
library's kernels, and registers the MoE kernel as Hugging Face's ``"eager"`` experts
implementation for ``neuron`` tensors. The ops are registered at ``PrivateUse1`` and
``AutogradPrivateUse1`` (over ATen's composite), so eager mode, autograd, inference mode and
``torch.compile`` graphs (which trace through the same dispatcher) all take the kernels; calls a
kernel does not cover (an explicit mask, dropout, other dtypes) run ATen's composite as before."""
from __future__ import annotations

import math
import os
import warnings

import torch

KINDS = ("attention", "rmsnorm", "moe")
_enabled: dict = {}  # kind -> what undoes it (a torch.library.Library, or a callable)
_stats = {k: 0 for k in KINDS}
_fallbacks = {k: 0 for k in KINDS}


def _on_neuron(*ts):
    return all(t.device.type == "neuron" for t in ts if isinstance(t, torch.Tensor))


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    from . import ops
    if "attention" not in _enabled:
        return torch.ops.aten.scaled_dot_product_attention.default.decompose(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    ok = (attn_mask is None and dropout_p == 0.0 and query.dim() == 4 and key.dim() == 4 and value.dim() == 4
          and min(query.shape) > 0 and min(key.shape) > 0 and min(value.shape) > 0
          and (scale is None or math.isfinite(scale))
          and query.dtype in (torch.float32, torch.bfloat16) and query.dtype == key.dtype == value.dtype
          and query.shape[-1] <= 128 and key.shape[-1] == query.shape[-1] == value.shape[-1]
          and query.shape[0] == key.shape[0] == value.shape[0] and key.shape[1] == value.shape[1]
          and key.shape[-2] == value.shape[-2] and key.shape[-2] > 0 and query.shape[-2] > 0
          and (key.shape[1] == query.shape[1] or (enable_gqa and query.shape[1] % key.shape[1] == 0))
          and _on_neuron(query, key, value))
    if not ok:
        _fallbacks["attention"] += 1
        return torch.ops.aten.scaled_dot_product_attention.default.decompose(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    _stats["attention"] += 1
    out, _lse = ops.flash_attention(query, key, value, bool(is_causal), scale, None)
    return out


def _rms_norm(input, normalized_shape, weight=None, eps=None):
    from . import ops
    if "rmsnorm" not in _enabled:
        return torch.ops.aten.rms_norm.default.decompose(input, normalized_shape, weight, eps)
    ok = (len(normalized_shape) == 1 and input.dim() >= 1 and input.shape[-1] == normalized_shape[0]
          and input.dtype in (torch.float32, torch.bfloat16) and input.numel() > 0
          and (eps is None or eps >= 0)
          and (weight is None or (weight.dtype == input.dtype and tuple(weight.shape) == tuple(normalized_shape)))
          and _on_neuron(input, weight))
    if not ok:
        _fallbacks["rmsnorm"] += 1
        return torch.ops.aten.rms_norm.default.decompose(input, normalized_shape, weight, eps)
    _stats["rmsnorm"] += 1
    if eps is None:  # as ATen: the compute type's machine epsilon (float32 for bf16)
        eps = torch.finfo(torch.float32).eps
    y, _rstd = ops.rms_norm(input, weight, float(eps))
    return y


_libs = {}  # op -> torch.library.Library: registered once, kept for the process


def _register(op_name, fn):
    # Registered once and never destroyed: removing a Python kernel from the dispatcher leaves
    # Dynamo/AOTAutograd caches that still resolve to it, so a disabled route falls through to
    # ATen's composite inside the kernel instead.
    if op_name not in _libs:
        lib = torch.library.Library("aten", "IMPL")
        for key in ("PrivateUse1", "AutogradPrivateUse1"):
            lib.impl(op_name, fn, key, allow_override=True)
        _libs[op_name] = lib
    return op_name


def _enable_moe():
    from . import hf_moe
    return hf_moe.install()


def enable(*kinds):
    """Routes the given kinds (``"attention"``, ``"rmsnorm"``, ``"moe"``; none: all) to the library."""
    for kind in kinds or KINDS:
        if kind not in KINDS:
            raise ValueError(f"unknown NKI kernel kind {kind!r}; expected some of {', '.join(KINDS)}")
        if kind in _enabled:
            continue
        if kind == "attention":
            _enabled[kind] = _register("scaled_dot_product_attention", _sdpa)
        elif kind == "rmsnorm":
            _enabled[kind] = _register("rms_norm", _rms_norm)
        else:
            _enabled[kind] = _enable_moe()


def disable(*kinds):
    """Undoes :func:`enable` for the given kinds (none: all): ATen's composites run again."""
    for kind in kinds or tuple(_enabled):
        undo = _enabled.pop(kind, None)
        if callable(undo):
            undo()


def enabled():
    """The kinds currently routed to the library."""
    return tuple(k for k in KINDS if k in _enabled)


def stats():
    """Calls routed to the kernels and calls that fell back to ATen, per kind, since import."""
    return {"routed": dict(_stats), "fallback": dict(_fallbacks)}


def enable_from_env():
    spec = os.environ.get("TORCH_NEURONX_NKI_KERNELS", "").strip()
    if not spec:
        return
    kinds = KINDS if spec == "all" else tuple(s.strip() for s in spec.split(",") if s.strip())
    try:
        enable(*kinds)
    except (ValueError, RuntimeError) as e:  # a bad setting must not break `import torch_neuronx`
        warnings.warn(f"TORCH_NEURONX_NKI_KERNELS={spec!r} ignored in part: {e}")
