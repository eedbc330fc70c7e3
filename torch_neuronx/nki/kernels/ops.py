"""The library's kernels as torch ops (``torch.ops.nki_kernels.*``), each an ``nki_op`` with its
autograd formula where the kernel has a backward: eager, autograd and ``torch.compile`` (one call
per op in the graph) treat them like any ATen op."""
from __future__ import annotations

from typing import Optional

import torch

from ..torch_ops import nki_op
from . import attention, mlp, moe, moe_block, norms

Tensor = torch.Tensor


# -- attention ------------------------------------------------------------------------------

@nki_op("nki_kernels::flash_attention", mutates_args=())
def flash_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, scale: Optional[float] = None,
                    window: Optional[int] = None) -> tuple[Tensor, Tensor]:
    return attention.flash_attention_forward(q, k, v, causal=causal, scale=scale, window=window)


@nki_op("nki_kernels::flash_attention_backward", mutates_args=())
def flash_attention_backward(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                             causal: bool = False, scale: Optional[float] = None,
                             window: Optional[int] = None) -> tuple[Tensor, Tensor, Tensor]:
    return attention.flash_attention_backward(grad_out, q, k, v, out, lse, causal=causal, scale=scale, window=window)


def _attention_setup(ctx, inputs, output):
    q, k, v, causal, scale, window = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.args = (causal, scale, window)
    ctx.set_materialize_grads(False)  # an unused lse gets no gradient (None), not zeros


def _lse_gradient(q, k, lse, grad_lse, causal, scale, window):
    """dq, dk of lse's own gradient: d lse_i / d s_ij = P_ij, so dS = P * grad_lse (ATen ops; the
    kernels cover the usual case, where only the output is differentiated)."""
    import math
    sc = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    groups = q.shape[1] // k.shape[1]
    kq = k.repeat_interleave(groups, dim=1).float()
    s = (q.float() @ kq.transpose(-1, -2)) * sc
    i = torch.arange(q.shape[-2], device=q.device)[:, None]
    j = torch.arange(k.shape[-2], device=q.device)[None, :]
    hidden = torch.zeros(i.shape[0], j.shape[1], dtype=torch.bool, device=q.device)
    if causal:
        hidden = hidden | (j > i)
    if window is not None:
        hidden = hidden | (j <= i - window)
    p = torch.exp(s.masked_fill(hidden, float("-inf")) - lse[..., None])
    ds = p * grad_lse[..., None].float()
    dq = (ds @ kq) * sc
    dk = ((ds.transpose(-1, -2) @ q.float()) * sc).unflatten(1, (k.shape[1], groups)).sum(2)
    return dq.to(q.dtype), dk.to(k.dtype)


def _attention_backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse = ctx.saved_tensors
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    dq, dk, dv = flash_attention_backward(grad_out.contiguous(), q, k, v, out, lse, *ctx.args)
    if grad_lse is not None:
        eq, ek = _lse_gradient(q, k, lse, grad_lse, *ctx.args)
        dq, dk = dq + eq, dk + ek
    return dq, dk, dv, None, None, None


flash_attention.register_autograd(_attention_backward, setup_context=_attention_setup)


# -- norms ----------------------------------------------------------------------------------

@nki_op("nki_kernels::rms_norm", mutates_args=())
def rms_norm(x: Tensor, weight: Optional[Tensor], eps: float) -> tuple[Tensor, Tensor]:
    return norms.rms_norm_forward(x, weight, eps)


_NONE = (0,)  # torch ops cannot return None: an empty tensor stands for "no gradient"


def _or_empty(t, like):
    return like.new_empty(_NONE) if t is None else t


def _or_none(t, present):
    return t if present else None


@nki_op("nki_kernels::rms_norm_backward", mutates_args=())
def rms_norm_backward(grad_y: Tensor, x: Tensor, weight: Optional[Tensor], rstd: Tensor) -> tuple[Tensor, Tensor]:
    dx, dw = norms.rms_norm_backward(grad_y, x, weight, rstd)
    return dx, _or_empty(dw, x)


def _rms_setup(ctx, inputs, output):
    x, weight, _eps = inputs
    ctx.save_for_backward(x, weight, output[1])


def _rms_backward(ctx, grad_y, _grad_rstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = rms_norm_backward(grad_y.contiguous(), x, weight, rstd)
    return dx, _or_none(dw, weight is not None), None


rms_norm.register_autograd(_rms_backward, setup_context=_rms_setup)


@nki_op("nki_kernels::layer_norm", mutates_args=())
def layer_norm(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
               eps: float) -> tuple[Tensor, Tensor, Tensor]:
    return norms.layer_norm_forward(x, weight, bias, eps)


@nki_op("nki_kernels::layer_norm_backward", mutates_args=())
def layer_norm_backward(grad_y: Tensor, x: Tensor, weight: Optional[Tensor], mean: Tensor,
                        rstd: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    dx, dw, db = norms.layer_norm_backward(grad_y, x, weight, mean, rstd)
    return dx, _or_empty(dw, x), _or_empty(db, x)


def _ln_setup(ctx, inputs, output):
    x, weight, bias, _eps = inputs
    ctx.save_for_backward(x, weight, output[1], output[2])
    ctx.has_bias = bias is not None


def _ln_backward(ctx, grad_y, _gm, _gr):
    x, weight, mean, rstd = ctx.saved_tensors
    dx, dw, db = layer_norm_backward(grad_y.contiguous(), x, weight, mean, rstd)
    return dx, _or_none(dw, weight is not None), _or_none(db, ctx.has_bias), None


layer_norm.register_autograd(_ln_backward, setup_context=_ln_setup)


@nki_op("nki_kernels::rms_norm_linear", mutates_args=())
def rms_norm_linear(x: Tensor, norm_weight: Optional[Tensor], eps: float, linear_weight: Tensor) -> Tensor:
    return norms.rms_norm_linear_forward(x, norm_weight, eps, linear_weight)


def _rms_linear_setup(ctx, inputs, output):
    x, norm_weight, eps, linear_weight = inputs
    ctx.save_for_backward(x, norm_weight, linear_weight)
    ctx.eps = eps


def _rms_linear_backward(ctx, grad_y):
    # the fused forward kept no normalized rows: recompute them with the RMSNorm kernel
    x, nw, lw = ctx.saved_tensors
    n, rstd = rms_norm(x, nw, ctx.eps)
    gy = grad_y.reshape(-1, grad_y.shape[-1])
    d_lw = gy.t().to(lw.dtype) @ n.reshape(-1, n.shape[-1]).to(lw.dtype)
    dx, dnw = rms_norm_backward((grad_y @ lw.to(grad_y.dtype)).contiguous(), x, nw, rstd)
    return dx, _or_none(dnw, nw is not None), None, d_lw


rms_norm_linear.register_autograd(_rms_linear_backward, setup_context=_rms_linear_setup)


# -- MLP ------------------------------------------------------------------------------------

@nki_op("nki_kernels::swiglu", mutates_args=())
def swiglu(x: Tensor, w_gate: Tensor, w_up: Tensor, w_down: Tensor) -> Tensor:
    return mlp.swiglu_forward(x, w_gate, w_up, w_down)


@nki_op("nki_kernels::swiglu_backward", mutates_args=())
def swiglu_backward(grad_y: Tensor, x: Tensor, w_gate: Tensor, w_up: Tensor,
                    w_down: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    # the kernel writes [dw_gate; dw_up] as one block: op outputs may not alias each other
    return tuple(t.clone() if t._base is not None else t for t in mlp.swiglu_backward(grad_y, x, w_gate, w_up, w_down))


def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _swiglu_backward(ctx, grad_y):
    return swiglu_backward(grad_y.contiguous(), *ctx.saved_tensors)


swiglu.register_autograd(_swiglu_backward, setup_context=_swiglu_setup)


# -- mixture of experts ---------------------------------------------------------------------

@nki_op("nki_kernels::moe_experts", mutates_args=())
def moe_experts(x: Tensor, expert_ids: Tensor, weights: Tensor, gate_up_proj: Tensor, down_proj: Tensor) -> Tensor:
    return moe_block.moe_experts_forward(x, expert_ids, weights, gate_up_proj, down_proj)


def _moe_reference(x, expert_ids, weights, gate_up_proj, down_proj):
    """The experts' math in ATen ops (transformers' eager loop), for the backward."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    E = gate_up_proj.shape[0]
    for e in range(E):
        tok, slot = torch.where(expert_ids == e)
        if tok.numel() == 0:
            continue
        g, u = torch.nn.functional.linear(x[tok], gate_up_proj[e]).chunk(2, dim=-1)
        h = torch.nn.functional.linear(torch.nn.functional.silu(g) * u, down_proj[e])
        out = out.index_add(0, tok, h.float() * weights[tok, slot, None].float())
    return out.to(x.dtype)


def _moe_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _moe_backward(ctx, grad_y):
    # the gradient of the same math, by autograd over the ATen composition (no backward kernel yet)
    x, ids, w, gu, dp = ctx.saved_tensors
    leaves = [t.detach().requires_grad_(t.is_floating_point()) for t in (x, ids, w, gu, dp)]
    with torch.enable_grad():
        y = _moe_reference(*leaves)
    want = [t for t in leaves if t.requires_grad]
    grads = iter(torch.autograd.grad(y, want, grad_y, allow_unused=True))
    return tuple(next(grads) if t.requires_grad else None for t in leaves)


moe_experts.register_autograd(_moe_backward, setup_context=_moe_setup)


# The MoE block's stages as ops of their own (forward only: routing and permutation are not
# differentiable; the grouped GEMM's and combine's gradients are the composed op's).

@nki_op("nki_kernels::moe_route", mutates_args=())
def moe_route(router_logits: Tensor, top_k: int, gate: str = "softmax", normalize: bool = True,
              capacity: Optional[int] = None) -> tuple[Tensor, Tensor]:
    return moe.moe_route(router_logits, top_k, gate=gate, normalize=normalize, capacity=capacity)


@nki_op("nki_kernels::moe_permute", mutates_args=())
def moe_permute(x: Tensor, expert_ids: Tensor, num_experts: int) -> tuple[Tensor, Tensor, Tensor]:
    return moe.moe_permute(x, expert_ids, num_experts)


@nki_op("nki_kernels::moe_grouped_gemm", mutates_args=())
def moe_grouped_gemm(x_sorted: Tensor, expert_offsets: Tensor, w: Tensor) -> Tensor:
    return moe.moe_grouped_gemm(x_sorted, expert_offsets, w)


@nki_op("nki_kernels::moe_combine", mutates_args=())
def moe_combine(y_sorted: Tensor, order: Tensor, weights: Tensor, T: int) -> Tensor:
    return moe.moe_combine(y_sorted, order, weights, T)
