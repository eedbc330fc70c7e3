"""Unquantized fused-MoE method for vLLM on ``neuron`` (routing and experts in torch ops).

vLLM 0.32 selects no MoE kernel on out-of-tree platforms, and its router's top-k op lives in the
CUDA extension, so the platform registers this method in place of ``UnquantizedFusedMoEMethod``.
Tokens are sorted by expert once per layer (one host read of the per-expert counts), and each
expert runs two GEMMs over its own tokens.
"""
import torch
import torch.nn.functional as F
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

_GATED = {
    MoEActivation.SILU: F.silu,
    MoEActivation.GELU: F.gelu,
    MoEActivation.GELU_TANH: lambda x: F.gelu(x, approximate="tanh"),
}


def route(router_logits, top_k, scoring_func="softmax", renormalize=True, correction_bias=None):
    """Top-k expert ids and weights per token, computed in float32 as vLLM's CUDA router does."""
    logits = router_logits.float()
    if scoring_func == "softmax":
        scores = torch.softmax(logits, dim=-1)
    elif scoring_func == "sigmoid":
        scores = torch.sigmoid(logits)
    else:
        raise NotImplementedError(f"MoE scoring function {scoring_func!r} is not supported on neuron")
    if correction_bias is not None:  # the bias picks the experts; the weights stay unbiased
        ids = torch.topk(scores + correction_bias.float(), top_k, dim=-1).indices
        weights = scores.gather(-1, ids)
    else:
        weights, ids = torch.topk(scores, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def experts(x, w13, w2, weights, ids, activation=F.silu):
    """Sum over each token's experts of ``weight * w2 @ act(gate) * up``; ``w13`` is ``[E, 2I, H]``."""
    num_experts, inter = w13.shape[0], w2.shape[-1]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts).tolist()  # the layer's one host read
    token = order // ids.shape[-1]
    out = torch.zeros(x.shape[0], x.shape[-1], dtype=torch.float32, device=x.device)
    start = 0
    for e, count in enumerate(counts):
        if count == 0:
            continue
        sel = order[start:start + count]
        tok = token[start:start + count]
        start += count
        h = x[tok] @ w13[e].t()
        y = (activation(h[:, :inter]) * h[:, inter:]) @ w2[e].t()
        out.index_add_(0, tok, y.float() * weights.reshape(-1)[sel].unsqueeze(-1))
    return out.to(x.dtype)


@UnquantizedFusedMoEMethod.register_oot
class NeuronUnquantizedFusedMoEMethod(UnquantizedFusedMoEMethod):
    """Routes and runs the experts itself (monolithic), from the router's logits."""

    @property
    def is_monolithic(self) -> bool:
        return True

    def apply_monolithic(self, layer, x, router_logits, input_ids=None):
        unsupported = [name for name, bad in (
            ("grouped top-k routing", getattr(layer, "use_grouped_topk", False)),
            ("a custom routing function", getattr(layer, "custom_routing_function", None) is not None),
            ("router weights applied on the input", getattr(layer, "apply_router_weight_on_input", False)),
            ("routed_scaling_factor != 1", getattr(layer, "routed_scaling_factor", 1.0) not in (None, 1.0)),
            ("expert parallelism", getattr(layer, "local_num_experts", 0) != getattr(layer, "global_num_experts", 0)),
            ("expert biases", getattr(layer, "w13_bias", None) is not None or getattr(layer, "w2_bias", None) is not None),
            ("a SwiGLU limit", getattr(layer, "swiglu_limit", None) is not None),
            ("fused shared experts",
             getattr(getattr(layer, "expert_map_manager", None), "num_fused_shared_experts", 0) != 0),
            ("a routing sink", getattr(layer, "routing_sink", None) is not None),
        ) if bad]
        act = _GATED.get(getattr(layer, "activation", MoEActivation.SILU))
        if act is None:
            unsupported.append(f"activation {layer.activation}")
        if unsupported:
            raise NotImplementedError("the neuron MoE method does not support " + ", ".join(unsupported))
        weights, ids = route(router_logits, layer.top_k, getattr(layer, "scoring_func", "softmax"),
                             getattr(layer, "renormalize", True), getattr(layer, "e_score_correction_bias", None))
        return experts(x, layer.w13_weight, layer.w2_weight, weights, ids, act)
