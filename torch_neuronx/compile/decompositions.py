"""Decompositions of fused ATen ops the compiler does better in pieces.

``nn.TransformerEncoderLayer`` in inference runs one fused op (``_transformer_encoder_layer_fwd``,
PyTorch's "fast path"), which Dynamo records as is. As one op it is an opaque library call;
in pieces its linears become oneDNN matmuls with the bias, GELU and residual adds fused, around
the same scaled-dot-product attention.

``native_dropout`` takes no generator: its CPU kernel would draw from CPU's default generator.
In pieces it draws its mask with ``bernoulli`` from the neuron generator, as eager does."""
import torch
import torch.nn.functional as F

aten = torch.ops.aten


def transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                  use_gelu, norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2,
                                  norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None,
                                  mask_type=None):
    """``aten._transformer_encoder_layer_fwd`` as the ops the fast path runs (batch-first input,
    no mask; anything else keeps the fused op)."""
    if mask is not None or src.is_nested or src.dim() != 3:
        return NotImplemented
    batch, seq, _ = src.shape
    x = F.layer_norm(src, (embed_dim,), norm_weight_1, norm_bias_1, eps) if norm_first else src
    qkv = F.linear(x, qkv_weight, qkv_bias).view(batch, seq, 3, num_heads, embed_dim // num_heads)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    attn = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, seq, embed_dim)
    x = F.linear(attn, proj_weight, proj_bias) + src
    if not norm_first:
        x = F.layer_norm(x, (embed_dim,), norm_weight_1, norm_bias_1, eps)
    h = F.layer_norm(x, (embed_dim,), norm_weight_2, norm_bias_2, eps) if norm_first else x
    h = F.linear(h, ffn_weight_1, ffn_bias_1)
    h = F.gelu(h) if use_gelu else F.relu(h)
    x = F.linear(h, ffn_weight_2, ffn_bias_2) + x
    if not norm_first:
        x = F.layer_norm(x, (embed_dim,), norm_weight_2, norm_bias_2, eps)
    return x


def native_dropout(input, p, train):
    """``aten.native_dropout`` as eager runs it on neuron: a ``bernoulli`` mask (same draws), then
    ``input * mask * 1/(1-p)``."""
    if train is not None and not train:
        return input.clone(), torch.ones_like(input, dtype=torch.bool)
    keep = 1.0 - p
    mask = aten.bernoulli.p(torch.empty_like(input, dtype=torch.bool), keep)
    return input * mask * (0.0 if keep == 0 else 1.0 / keep), mask


NEURON_DECOMPOSITIONS = {aten._transformer_encoder_layer_fwd.default: transformer_encoder_layer_fwd,
                         aten.native_dropout.default: native_dropout}
