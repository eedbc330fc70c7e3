"""Hugging Face's mixture-of-experts layers on the library's MoE kernel.

Transformers dispatches every experts module (``@use_experts_implementation``: Mixtral, Qwen-MoE,
DeepSeek, ...) through its ``ExpertsInterface`` by ``config._experts_implementation``
(``"grouped_mm"`` by default, ``"batched_mm"`` while ``generate`` decodes, or ``"eager"``).
:func:`install` puts the kernel in front of each for
experts modules on ``neuron`` of the layout the kernel covers (concatenated gate/up projections,
SiLU gate, no bias, no post-expert norm, no expert parallelism) and registers it as
``"neuron_nki"``; other modules and devices keep the implementation they asked for."""
from __future__ import annotations

import torch

NAME = "neuron_nki"


def _plain_swiglu(module):
    """The default gate (silu(gate) * up): models with their own ``_apply_gate`` (clamps, offsets) differ."""
    from transformers.integrations.moe import _default_apply_gate
    act = getattr(module, "act_fn", None)
    return (getattr(type(module), "_apply_gate", None) is _default_apply_gate
            and (isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"))


def _covered(module, hidden_states, top_k_index):
    cfg = getattr(module, "config", None)
    return (hidden_states.device.type == "neuron" and hidden_states.dim() == 2 and hidden_states.shape[0] > 0
            and top_k_index.dim() == 2 and 1 <= top_k_index.shape[1] <= 8
            and top_k_index.device == hidden_states.device and not top_k_index.is_floating_point()
            and hidden_states.dtype in (torch.float32, torch.bfloat16)
            and getattr(module, "has_gate", False) and not getattr(module, "has_bias", True)
            and not getattr(module, "is_transposed", True) and getattr(module, "is_concatenated", False)
            and not getattr(module, "has_post_expert_norm", True) and not getattr(module, "_is_expert_parallel", True)
            and getattr(cfg, "hidden_act", None) in ("silu", "swish")
            and isinstance(getattr(module, "gate_up_proj", None), torch.Tensor)
            and module.gate_up_proj.dim() == 3 and module.gate_up_proj.shape[0] <= 511
            and module.gate_up_proj.dtype == hidden_states.dtype and module.down_proj.dtype == hidden_states.dtype
            and _plain_swiglu(module))


def experts_forward(module, hidden_states, top_k_index, top_k_weights):
    """The experts' forward on the library's kernel (permute, grouped SwiGLU GEMMs, combine)."""
    from . import ops
    return ops.moe_experts(hidden_states, top_k_index, top_k_weights.to(torch.float32), module.gate_up_proj,
                           module.down_proj).to(hidden_states.dtype)


def _routed(fallback):
    from . import routing

    def forward(module, hidden_states, top_k_index, top_k_weights):
        if _covered(module, hidden_states, top_k_index):
            routing._stats["moe"] += 1
            return experts_forward(module, hidden_states, top_k_index, top_k_weights)
        routing._fallbacks["moe"] += 1
        if fallback is None:  # "eager": the module's own forward, as transformers calls it
            return type(module).forward.__wrapped__(module, hidden_states, top_k_index, top_k_weights)
        return fallback(module, hidden_states, top_k_index, top_k_weights)
    forward.nki_routed = True
    return forward


def install():
    """Routes covered experts modules to the kernel; returns the function that undoes it."""
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    except ImportError as e:  # the MoE route exists only for transformers' experts interface
        raise RuntimeError("routing MoE to the NKI kernel needs transformers (its ExpertsInterface); "
                           "install transformers or leave 'moe' out of TORCH_NEURONX_NKI_KERNELS") from e
    mapping = type(ALL_EXPERTS_FUNCTIONS)._global_mapping
    saved = {k: mapping.get(k) for k in ("eager", "grouped_mm", "batched_mm", NAME)}
    mapping["eager"] = _routed(None)
    for k in ("grouped_mm", "batched_mm"):
        if saved[k] is not None:
            mapping[k] = _routed(saved[k])
    mapping[NAME] = _routed(saved["grouped_mm"])

    def undo():
        for k, v in saved.items():
            if v is None:
                mapping.pop(k, None)
            else:
                mapping[k] = v
    return undo
