"""Torch implementations of the Triton kernels on vLLM's model-runner path.

vLLM launches these through its Triton kernel registry (``register_kernels``); on ``neuron``
they run as ordinary torch ops queued on the current stream. The arguments are the Triton
kernel's, in its order (``*_ptr`` are tensors).
"""
import torch


def compute_slot_mapping(num_tokens, max_num_tokens, query_start_loc_ptr, positions_ptr, block_table_ptr,
                         block_table_stride, slot_mapping_ptr, KV_CACHE_BLOCK_SIZE, TOTAL_CP_WORLD_SIZE,
                         TOTAL_CP_RANK, CP_KV_CACHE_INTERLEAVE_SIZE, PAD_ID, BLOCK_SIZE):
    """Slot of every scheduled token in the paged KV cache, ``PAD_ID`` past ``num_tokens``.

    Token ``t`` of request ``r`` at position ``p`` goes to block ``block_table[r, p // B]`` at
    offset ``p % B`` (with context parallelism, the virtual block of ``B * world`` positions is
    interleaved across ranks and positions owned by other ranks get ``PAD_ID``)."""
    n = int(num_tokens)
    qsl = query_start_loc_ptr
    num_reqs = qsl.shape[0] - 1
    if n > 0:
        lens = (qsl[1:] - qsl[:-1]).long()
        req = torch.repeat_interleave(torch.arange(num_reqs, device=qsl.device), lens, output_size=n)
        pos = positions_ptr[:n].long()
        virtual = KV_CACHE_BLOCK_SIZE * TOTAL_CP_WORLD_SIZE
        vblock = pos // virtual
        voff = pos - vblock * virtual
        table = block_table_ptr.reshape(-1, block_table_stride)
        block = table[req, vblock].long()
        if TOTAL_CP_WORLD_SIZE == 1:
            slot = block * KV_CACHE_BLOCK_SIZE + voff
        else:
            interleave = CP_KV_CACHE_INTERLEAVE_SIZE
            local = (voff // interleave) % TOTAL_CP_WORLD_SIZE == TOTAL_CP_RANK
            loff = (voff // (TOTAL_CP_WORLD_SIZE * interleave)) * interleave + voff % interleave
            slot = torch.where(local, block * KV_CACHE_BLOCK_SIZE + loff, torch.full_like(loff, PAD_ID))
        slot_mapping_ptr[:n] = slot
    if int(max_num_tokens) > n:
        slot_mapping_ptr[n:int(max_num_tokens)] = PAD_ID


TRITON_OVERRIDES = {
    "vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel": compute_slot_mapping,
}
