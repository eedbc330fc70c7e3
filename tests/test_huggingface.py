"""Hugging Face on neuron, unchanged libraries (issue 8, first flows): a tiny causal LM saved
locally loads with device_map="neuron", generates as on CPU (greedy equal, sampling runs),
saves back bitwise, and trains with Trainer single-process (device detected without
environment variables, bf16, the default fused AdamW, gradient checkpointing, evaluation,
checkpoint save and resume)."""
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="make installs the pinned Hugging Face packages")
from transformers import AutoModelForCausalLM, LlamaConfig, Trainer, TrainingArguments  # noqa: E402


def _config():
    return LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                       pad_token_id=0)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("tiny-llama")
    AutoModelForCausalLM.from_config(_config()).save_pretrained(d)  # safetensors
    return d


def test_from_pretrained_device_map_and_generate_match_cpu(tiny_dir):
    dev = AutoModelForCausalLM.from_pretrained(tiny_dir, device_map="neuron")
    cpu = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert all(p.device.type == "neuron" for p in dev.parameters())
    x = torch.randint(1, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(x)
    greedy_cpu = cpu.generate(x, attention_mask=mask, max_new_tokens=8, do_sample=False)
    greedy_dev = dev.generate(x.to("neuron"), attention_mask=mask.to("neuron"), max_new_tokens=8, do_sample=False)
    assert torch.equal(greedy_dev.cpu(), greedy_cpu)  # KV-cache decoding, token for token
    sampled = dev.generate(x.to("neuron"), attention_mask=mask.to("neuron"), max_new_tokens=8, do_sample=True,
                           top_k=10)
    assert sampled.shape == (2, 16) and sampled.device.type == "neuron"
    torch.testing.assert_close(dev(x.to("neuron")).logits.cpu(), cpu(x).logits, rtol=1e-5, atol=1e-5)


def test_save_pretrained_from_device_reloads_bitwise(tiny_dir, tmp_path):
    dev = AutoModelForCausalLM.from_pretrained(tiny_dir, device_map="neuron")
    dev.save_pretrained(tmp_path)
    back = AutoModelForCausalLM.from_pretrained(tmp_path)
    for (k, a), (_, b) in zip(dev.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a.cpu(), b), k


class _Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        ids = torch.randint(1, 128, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


def test_trainer_single_process_bf16_checkpoint_resume(tiny_dir, tmp_path):
    def trainer(max_steps):
        args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=max_steps,
                                 learning_rate=1e-3, bf16=True, gradient_checkpointing=True, report_to=[],
                                 logging_steps=1, save_steps=3, eval_strategy="steps", eval_steps=3,
                                 per_device_eval_batch_size=4, seed=0, disable_tqdm=True)
        model = AutoModelForCausalLM.from_pretrained(tiny_dir)
        return Trainer(model=model, args=args, train_dataset=_Tokens(), eval_dataset=_Tokens())

    t = trainer(6)
    assert t.args.device == torch.device("neuron", 0)  # detected, no environment variables
    assert "fused" in str(t.args.optim).lower()
    t.train()
    assert next(t.model.parameters()).device.type == "neuron"
    losses = [h["loss"] for h in t.state.log_history if "loss" in h]
    evals = [h["eval_loss"] for h in t.state.log_history if "eval_loss" in h]
    assert len(losses) == 6 and len(evals) == 2 and evals[-1] < evals[0]
    ckpt = tmp_path / "checkpoint-3"
    assert (ckpt / "model.safetensors").exists() and any(ckpt.glob("rng_state*.pth"))
    # Resume from step 3: steps 4..6 repeat the first run's losses (model, optimizer and RNG state).
    r = trainer(6)
    r.train(resume_from_checkpoint=str(ckpt))
    resumed = [h["loss"] for h in r.state.log_history if "loss" in h and h["step"] > 3]
    torch.testing.assert_close(torch.tensor(resumed), torch.tensor(losses[3:]), rtol=1e-3, atol=1e-3)
