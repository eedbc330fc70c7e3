"""The kernel library under Hugging Face models: with TORCH_NEURONX_NKI_KERNELS' kinds enabled,
Llama's SDPA attention and Mixtral's experts run on the library's kernels (the routing counters
show it) and greedy generation yields the tokens it yields without them."""
import pytest
import torch

import torch_neuronx  # noqa: F401
from torch_neuronx.nki import kernels

transformers = pytest.importorskip("transformers")


def _generate(model, ids, n):
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                              pad_token_id=0)


def _compare(model, kinds, n=12):
    torch.manual_seed(0)
    ids = torch.randint(1, model.config.vocab_size, (2, 37)).to("neuron")
    kernels.disable()
    ref = _generate(model, ids, n).cpu()
    before = kernels.stats()["routed"]
    kernels.enable(*kinds)
    try:
        out = _generate(model, ids, n).cpu()
    finally:
        kernels.disable()
    routed = {k: kernels.stats()["routed"][k] - before[k] for k in kinds}
    return ref, out, routed


def test_llama_generates_the_same_tokens_with_the_attention_kernel():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256,
                      attn_implementation="sdpa")
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval().to("neuron")
    ref, out, routed = _compare(model, ("attention",))
    # prefill (causal, 37 queries) and every decode step (1 query) in both layers took the kernel
    assert routed["attention"] >= 2 * 12
    assert torch.equal(out, ref), (out, ref)


def test_mixtral_generates_the_same_tokens_with_the_moe_and_attention_kernels():
    from transformers import MixtralConfig, MixtralForCausalLM
    cfg = MixtralConfig(vocab_size=512, hidden_size=256, intermediate_size=384, num_hidden_layers=2,
                        num_attention_heads=8, num_key_value_heads=4, num_local_experts=8,
                        num_experts_per_tok=2, max_position_embeddings=256, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = MixtralForCausalLM(cfg).eval().to("neuron")
    ref, out, routed = _compare(model, ("attention", "moe"))
    assert routed["moe"] >= 2 * 12 and routed["attention"] >= 2 * 12, routed
    assert torch.equal(out, ref), (out, ref)
