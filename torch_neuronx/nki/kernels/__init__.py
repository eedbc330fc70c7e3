"""The NKI kernel library: FlashAttention, norms, SwiGLU MLP and mixture-of-experts kernels
written in ``torch_neuronx.nki``, registered as torch ops (``torch.ops.nki_kernels.*``) with
autograd where they have a backward.

Call them directly (``flash_attention``, ``rms_norm``, ...) or let the backend route PyTorch ops to
them: ``enable("attention", "rmsnorm", "moe")`` or ``TORCH_NEURONX_NKI_KERNELS=attention,rmsnorm,moe``
(see :mod:`.routing`). See docs/nki.md, "Kernel library"."""
from __future__ import annotations

from .routing import disable, enable, enabled, stats  # noqa: F401


def flash_attention(q, k, v, *, causal=False, scale=None, window=None, return_lse=False):
    """FlashAttention on ``[B, H, S, D]`` tensors (GQA when k/v have fewer heads), differentiable;
    ``return_lse=True`` also returns the float32 log-sum-exp per query row."""
    from . import ops
    out, lse = ops.flash_attention(q, k, v, causal, scale, window)
    return (out, lse) if return_lse else out


def rms_norm(x, weight=None, eps=1e-6):
    """RMSNorm over the last dimension, differentiable."""
    from . import ops
    return ops.rms_norm(x, weight, eps)[0]


def layer_norm(x, weight=None, bias=None, eps=1e-5):
    """LayerNorm over the last dimension, differentiable."""
    from . import ops
    return ops.layer_norm(x, weight, bias, eps)[0]


def rms_norm_linear(x, norm_weight, linear_weight, eps=1e-6):
    """``rms_norm(x, norm_weight) @ linear_weight.T`` fused in one kernel."""
    from . import ops
    return ops.rms_norm_linear(x, norm_weight, eps, linear_weight)


def swiglu(x, w_gate, w_up, w_down):
    """Llama's MLP ``(silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T`` fused."""
    from . import ops
    return ops.swiglu(x, w_gate, w_up, w_down)


def moe_experts(x, expert_ids, weights, gate_up_proj, down_proj):
    """A mixture-of-experts layer's experts for routed tokens (Hugging Face's layout: ``gate_up_proj``
    ``[E, 2I, H]``, ``down_proj`` ``[E, H, I]``, SiLU gate): permutation, grouped GEMMs, combine."""
    from . import ops
    return ops.moe_experts(x, expert_ids, weights, gate_up_proj, down_proj)
