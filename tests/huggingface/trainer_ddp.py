"""A Trainer run launched with torchrun / accelerate (tests/test_huggingface.py): each rank
writes what the Hugging Face stack chose and what it trained to OUTDIR/rank<r>.json."""
import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Trainer, TrainingArguments

from torch_neuronx.testing.models import TokenDataset


def main(out):
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, max_steps=4, learning_rate=1e-3,
                             report_to=[], disable_tqdm=True, logging_steps=1, save_strategy="no")
    trainer = Trainer(model=model, args=args, train_dataset=TokenDataset(n=32, seq=16, vocab=128))
    trainer.train()
    rank = int(os.environ["RANK"])
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"device": str(args.device), "distributed_type": str(args.distributed_state.distributed_type),
                   "backend": args.distributed_state.backend, "wrapped": type(trainer.model_wrapped).__name__,
                   "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
                   "param_sum": float(sum(p.detach().double().sum().item() for p in model.parameters()))}, f)


if __name__ == "__main__":
    main(sys.argv[1])
