"""Models at the size users run them (make test-large; minutes on 2 cores, not in make test).

- GPT-2 small (124M parameters, 148 tensors, built from its config) trained 3 steps with the
  Hugging Face Trainer's defaults (fused AdamW over every parameter) on neuron, equal to the same
  run on CPU; the same with torch_compile=True (the neuron Dynamo backend).
- A ~1.1B-parameter Llama config (random weights, bfloat16) generates greedily on neuron exactly
  the tokens it generates on CPU.
"""
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="make installs the pinned Hugging Face packages")
from transformers import (AutoModelForCausalLM, GPT2Config, LlamaConfig, Trainer,  # noqa: E402
                          TrainingArguments)

import torch_neuronx  # noqa: E402,F401

SEQ = 64


class Tokens(torch.utils.data.Dataset):
    """Fixed random token rows (language-model labels are the inputs)."""

    def __init__(self, n=24, vocab=50257):
        g = torch.Generator().manual_seed(0)
        self.rows = torch.randint(0, vocab, (n, SEQ), generator=g)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


@pytest.fixture(scope="module")
def gpt2_small(tmp_path_factory):
    # GPT-2 small's shape; dropout off so the CPU and neuron runs draw no random numbers.
    cfg = GPT2Config(n_positions=SEQ, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("gpt2-small")
    model = AutoModelForCausalLM.from_config(cfg)
    assert 120e6 < sum(p.numel() for p in model.parameters()) < 130e6
    model.save_pretrained(d)
    return d


def _train(model_dir, out, cpu, compile_=False):
    torch._dynamo.reset()
    args = TrainingArguments(output_dir=str(out), max_steps=3, report_to=[], save_strategy="no", seed=0,
                             logging_steps=1, disable_tqdm=True, use_cpu=cpu, torch_compile=compile_)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    t = Trainer(model=model, args=args, train_dataset=Tokens())
    t.train()
    losses = [h["loss"] for h in t.state.log_history if "loss" in h]
    return t, losses, {k: v.detach().cpu() for k, v in t.model.named_parameters()}


@pytest.fixture(scope="module")
def cpu_run(gpt2_small, tmp_path_factory):
    return _train(gpt2_small, tmp_path_factory.mktemp("cpu"), cpu=True)


def test_gpt2_small_trainer_defaults_equal_cpu(gpt2_small, cpu_run, tmp_path):
    _, cpu_losses, cpu_params = cpu_run
    t, losses, params = _train(gpt2_small, tmp_path, cpu=False)
    assert t.args.device.type == "neuron" and "fused" in str(t.args.optim).lower()
    assert len(params) == 148  # GPT-2 small's parameter tensors (the LM head is tied to the embedding)
    assert len(losses) == 3
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(cpu_losses), rtol=1e-4, atol=1e-4)
    for k, v in params.items():
        torch.testing.assert_close(v, cpu_params[k], rtol=1e-4, atol=1e-5, msg=k)


def test_gpt2_small_trainer_compiled_equals_cpu(gpt2_small, cpu_run, tmp_path):
    from torch_neuronx.compile import compile_metrics, reset_compile_metrics

    _, cpu_losses, cpu_params = cpu_run
    reset_compile_metrics()
    t, losses, params = _train(gpt2_small, tmp_path, cpu=False, compile_=True)
    m = compile_metrics()
    assert t.args.torch_compile_backend == "neuron" and m["compiles"] >= 2
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(cpu_losses), rtol=1e-3, atol=1e-3)
    for k, v in params.items():
        torch.testing.assert_close(v, cpu_params[k], rtol=1e-3, atol=1e-4, msg=k)


def test_llama_1b_bf16_greedy_generation_equals_cpu():
    # TinyLlama-1.1B's shape, random weights.
    cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                      num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=256)
    torch.manual_seed(0)
    cpu = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    assert 1.0e9 < sum(p.numel() for p in cpu.parameters()) < 1.2e9
    dev = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    dev.load_state_dict(cpu.state_dict())
    dev.to("neuron")
    prompt = torch.randint(0, 32000, (2, 16), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(prompt)
    with torch.no_grad():
        want = cpu.generate(prompt, attention_mask=mask, max_new_tokens=4, do_sample=False)
        got = dev.generate(prompt.to("neuron"), attention_mask=mask.to("neuron"), max_new_tokens=4,
                           do_sample=False)
    assert got.device.type == "neuron"
    assert torch.equal(got.cpu(), want)
