"""Paged attention on ``neuron`` for vLLM: the KV cache written by slot, read by block table.

Each layer's cache is vLLM's per-layer view ``[blocks, kv_heads, block_size, 2 * head_size]``:
keys in the first ``head_size`` channels, values in the rest. A step's requests are split in
two: decodes (one new token each) run as one batched attention over their gathered blocks;
prefills (new prompt chunks, which may follow cached prefix blocks) run one request at a time.
Masks are built once per step by the metadata builder and shared by every layer.
"""
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from vllm.forward_context import get_forward_context
from vllm.v1.attention.backend import (AttentionBackend, AttentionImpl, AttentionMetadataBuilder, AttentionType,
                                       CommonAttentionMetadata)
from vllm.v1.kv_cache_layout import KVCacheLayout


class NeuronAttentionBackend(AttentionBackend):
    """vLLM attention backend for ``neuron`` (registered as ``AttentionBackendEnum.CUSTOM``)."""

    forward_includes_kv_cache_update = False
    accept_output_buffer = True
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list] = ["auto", "float16", "bfloat16", "float32"]

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls():
        return NeuronAttentionImpl

    @staticmethod
    def get_builder_cls():
        return NeuronAttentionMetadataBuilder

    @classmethod
    def supported_kv_cache_layouts(cls):
        return (KVCacheLayout.LBHNC,)

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True


@dataclass
class _Prefill:
    query: slice            # this request's rows of the step's query
    blocks: torch.Tensor    # [num_blocks] its cache blocks, on the device
    seq_len: int
    mask: torch.Tensor      # [query_len, seq_len] bool, True where a key is visible (causal)
    distance: torch.Tensor  # [query_len, seq_len] query position - key position (sliding windows)


@dataclass
class NeuronAttentionMetadata:
    num_actual_tokens: int
    slot_mapping: torch.Tensor
    # Decodes, batched: their query rows, block tables and key masks.
    decode_rows: torch.Tensor | None       # [D] long
    decode_blocks: torch.Tensor | None     # [D, max_blocks]
    decode_mask: torch.Tensor | None       # [D, 1, 1, max_blocks * block_size] bool
    decode_distance: torch.Tensor | None   # [D, 1, 1, max_blocks * block_size]
    prefills: list


class NeuronAttentionMetadataBuilder(AttentionMetadataBuilder[NeuronAttentionMetadata]):
    """Builds one step's attention metadata from vLLM's common metadata (host lists → device masks).

    The masks are causal; each layer applies its own sliding window (layers of one KV-cache group
    can differ: vLLM gives windowed and global layers one group when the hybrid cache is off)."""

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.block_size = kv_cache_spec.block_size

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> NeuronAttentionMetadata:
        cm = common_attn_metadata
        n = cm.num_reqs
        qsl = cm.query_start_loc_cpu[: n + 1].tolist()
        seq = cm.seq_lens_cpu_upper_bound
        seq = seq[:n].tolist() if seq is not None else cm.seq_lens[:n].cpu().tolist()
        bs = self.block_size
        decodes, prefills = [], []
        for i in range(n):
            ql = qsl[i + 1] - qsl[i]
            if ql == 1:
                decodes.append(i)
            elif ql > 1:
                prefills.append(i)
        md = NeuronAttentionMetadata(cm.num_actual_tokens, cm.slot_mapping, None, None, None, None, [])
        dev = cm.block_table_tensor.device
        if decodes:
            nb = max((seq[i] + bs - 1) // bs for i in decodes)
            idx = torch.tensor(decodes, dtype=torch.long)
            rows = torch.tensor([qsl[i] for i in decodes], dtype=torch.long)
            seqlens = torch.tensor([seq[i] for i in decodes], dtype=torch.long).view(-1, 1)
            kpos = torch.arange(nb * bs).view(1, -1)
            distance = seqlens - 1 - kpos
            md.decode_rows = rows.to(dev)
            md.decode_blocks = cm.block_table_tensor[idx.to(dev), :nb].long()
            md.decode_mask = (distance >= 0).view(len(decodes), 1, 1, -1).to(dev)
            md.decode_distance = distance.view(len(decodes), 1, 1, -1).to(dev)
        for i in prefills:
            ql, sl = qsl[i + 1] - qsl[i], seq[i]
            nb = (sl + bs - 1) // bs
            distance = (torch.arange(sl - ql, sl).view(-1, 1) - torch.arange(sl).view(1, -1)).to(dev)
            md.prefills.append(_Prefill(slice(qsl[i], qsl[i + 1]), cm.block_table_tensor[i, :nb].long(), sl,
                                        distance >= 0, distance))
        return md


def _metadata_for(layer) -> NeuronAttentionMetadata | None:
    md = get_forward_context().attn_metadata
    if isinstance(md, dict):
        md = md.get(layer.layer_name)
    return md


class NeuronAttentionImpl(AttentionImpl):
    """Writes new keys and values into the paged cache and attends over each request's blocks."""

    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, alibi_slopes=None, sliding_window=None,
                 kv_cache_dtype="auto", logits_soft_cap=None, attn_type=AttentionType.DECODER,
                 kv_sharing_target_layer_name=None, **kwargs):
        unsupported = [what for what, bad in (
            ("ALiBi", alibi_slopes is not None),
            (f"attention type {attn_type}", attn_type != AttentionType.DECODER),
            ("attention sinks", kwargs.get("sinks") is not None),
            (f"KV cache dtype {kv_cache_dtype}", kv_cache_dtype not in NeuronAttentionBackend.supported_kv_cache_dtypes),
            ("a value head size other than the key head size", kwargs.get("head_size_v") not in (None, head_size)),
        ) if bad]
        if unsupported:
            raise NotImplementedError("the neuron vLLM attention backend does not support " + ", ".join(unsupported))
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.logits_soft_cap = logits_soft_cap or None
        self.sliding_window = sliding_window  # keys at distance < window are visible (vLLM's (W-1, 0))
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping):
        md = _metadata_for(layer)
        if md is None:  # profile and dummy runs: nothing to keep (their slots are padding, -1)
            return
        # Rows past num_actual_tokens are padding with slot -1 (data parallelism, whose batches
        # are padded across ranks, is refused by the platform).
        n = min(md.num_actual_tokens, slot_mapping.shape[0])
        block_size = kv_cache.shape[2]
        slots = slot_mapping[:n]
        blk, off = slots // block_size, slots % block_size
        hs = self.head_size
        kv_cache[blk, :, off, :hs] = key[:n].to(kv_cache.dtype)
        kv_cache[blk, :, off, hs:] = value[:n].to(kv_cache.dtype)

    def _mask(self, causal, distance):
        return causal if self.sliding_window is None else causal & (distance < self.sliding_window)

    def _attend(self, q, k, v, mask):
        # q [..., heads, q_len, hs]; k, v [..., kv_heads, k_len, hs]; GQA by repeating kv heads.
        groups = self.num_heads // self.num_kv_heads
        if groups > 1:
            k = k.repeat_interleave(groups, dim=-3)
            v = v.repeat_interleave(groups, dim=-3)
        if self.logits_soft_cap is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        scores = torch.tanh(scores / self.logits_soft_cap) * self.logits_soft_cap
        scores = scores.masked_fill(~mask, float("-inf"))
        return torch.matmul(torch.softmax(scores.float(), dim=-1).to(v.dtype), v)

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
                output_block_scale=None):
        if attn_metadata is None:  # profiling run: no cache yet
            return output.fill_(0)
        md = attn_metadata
        _, kv_heads, block_size, _ = kv_cache.shape
        hs = self.head_size
        query = query.view(-1, self.num_heads, hs)
        out = output.view(-1, self.num_heads, hs)
        if md.decode_rows is not None:
            d, nb = md.decode_blocks.shape
            kv = kv_cache[md.decode_blocks.reshape(-1)].view(d, nb, kv_heads, block_size, -1)
            kv = kv.permute(0, 2, 1, 3, 4).reshape(d, kv_heads, nb * block_size, -1).to(query.dtype)
            q = query[md.decode_rows].unsqueeze(2)                   # [D, heads, 1, hs]
            o = self._attend(q, kv[..., :hs], kv[..., hs:], self._mask(md.decode_mask, md.decode_distance))
            out[md.decode_rows] = o.squeeze(2).to(out.dtype)
        for p in md.prefills:
            kv = kv_cache[p.blocks]                                  # [nb, kv_heads, bs, 2hs]
            kv = kv.permute(1, 0, 2, 3).reshape(kv_heads, -1, 2 * hs)[:, : p.seq_len].to(query.dtype)
            q = query[p.query].transpose(0, 1)                       # [heads, q_len, hs]
            o = self._attend(q, kv[..., :hs], kv[..., hs:], self._mask(p.mask, p.distance))
            out[p.query] = o.transpose(0, 1).to(out.dtype)
        return output
