"""The whole mixture-of-experts computations on the stages of :mod:`.moe`: Hugging Face's experts
(``moe_experts_forward``) and Mixtral's sparse MoE block (``moe_forward``)."""
from __future__ import annotations

import torch

from .moe import (_check_2d, _check_experts, _check_ids, _check_num_experts, _check_route_args,  # noqa: F401
                  _check_weights, moe_combine, moe_experts_sorted, moe_grouped_gemm, moe_permute, moe_route)
from .norms import check_same_device, check_tensor


def moe_experts_forward(x, expert_ids, weights, gate_up_proj, down_proj):
    """Hugging Face's experts (``MixtralExperts``' math) for routed tokens: ``x [T, H]``,
    ``expert_ids``/``weights [T, k]``, ``gate_up_proj [E, 2I, H]`` (gate rows first, then up: the
    ``.chunk(2)`` of transformers' concatenated layout), ``down_proj [E, H, I]``. Permutation, the
    SwiGLU experts and the weighted combine; ids equal to E are skipped. Returns ``[T, H]`` in x's dtype."""
    check_tensor(gate_up_proj, "gate_up_proj", min_dim=3)
    if gate_up_proj.dim() != 3 or gate_up_proj.shape[1] % 2:
        raise ValueError(f"gate_up_proj must be [E, 2*I, H], got {tuple(gate_up_proj.shape)}")
    _check_2d(x, "x", "tokens, hidden")
    I = gate_up_proj.shape[1] // 2
    w_gate, w_up = gate_up_proj[:, :I], gate_up_proj[:, I:]
    E, _ = _check_experts(x, w_gate, w_up, down_proj)
    _check_num_experts(E)
    T = x.shape[0]
    _check_ids(expert_ids, T, "expert_ids")
    _check_weights(weights, expert_ids)
    xs, offs, order = moe_permute(x, expert_ids, E)
    ys = moe_experts_sorted(xs, offs, w_gate, w_up, down_proj)
    return moe_combine(ys, order, weights, T)


def moe_forward(x, router_weight, w_gate, w_up, w_down, top_k, gate="softmax", normalize=True):
    """Mixtral's sparse MoE block (``MixtralSparseMoeBlock.forward``, no training jitter), forward
    only: ``logits = x @ router_weight.T`` (in x's dtype, as nn.Linear), :func:`moe_route` (fp32
    gates, top-k, renormalised if ``normalize``), :func:`moe_permute`, :func:`moe_experts_sorted`,
    :func:`moe_combine`: five kernel launches, no host sync. ``x [..., H]``, ``router_weight [E, H]``,
    ``w_gate``/``w_up [E, I, H]``, ``w_down [E, H, I]``, all float32 or all bfloat16; returns
    ``[..., H]``. Transformers 5.x keeps ``experts.gate_up_proj [E, 2I, H]`` (pass ``[:, :I]`` and
    ``[:, I:]``), ``experts.down_proj [E, H, I]`` and ``gate.weight [E, H]``."""
    check_tensor(x, "x")
    H = x.shape[-1]
    check_tensor(router_weight, "router_weight", min_dim=2)
    if router_weight.dim() != 2 or router_weight.shape[1] != H:
        raise ValueError(f"router_weight must be [E, {H}], got {tuple(router_weight.shape)}")
    if router_weight.dtype != x.dtype:
        raise TypeError(f"router_weight has dtype {router_weight.dtype} but x has {x.dtype}")
    E = router_weight.shape[0]
    _check_route_args(E, top_k, gate, None)
    if _check_experts(x, w_gate, w_up, w_down)[0] != E:
        raise ValueError(f"w_gate has {w_gate.shape[0]} experts but router_weight has {E}")
    check_same_device(x=x, router_weight=router_weight)
    x2 = x.reshape(-1, H).contiguous()
    T = x2.shape[0]
    if T == 0:
        return torch.empty_like(x)
    logits = moe_grouped_gemm(x2, torch.tensor([0, T], dtype=torch.int32, device=x.device), router_weight[None],
                              host_offsets=(0, T))
    ids, weights = moe_route(logits, top_k, gate=gate, normalize=normalize)
    xs, offs, order = moe_permute(x2, ids, E)
    ys = moe_experts_sorted(xs, offs, w_gate, w_up, w_down)
    return moe_combine(ys, order, weights, T).reshape(x.shape)
