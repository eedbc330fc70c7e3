"""vLLM serving throughput on neuron, side by side with Hugging Face `generate` on CPU.

vLLM's own CPU platform needs vLLM's CPU build (its `vllm._C`), which is not on PyPI and cannot
be installed next to the CUDA wheel this project pins, so the baseline is the same model and
requests through `transformers` on CPU (one padded batch, greedy, KV cache, float32). Both
generate the same number of tokens; vLLM's figure is the second of two identical `generate`
calls in one engine (the first warms it up), run in a fresh process as the tests do. It exits
non-zero unless every request's tokens equal HF's.

    python bench/serving.py [--layers 12] [--hidden 768] [--requests 16] [--prompt 128] [--new 32]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.path.join(HERE, "..", "tests", "ecosystem", "vllm_run.py")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=32)
    args = ap.parse_args()
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                      num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                      num_key_value_heads=args.hidden // 128, max_position_embeddings=1024)
    model = LlamaForCausalLM(cfg).eval()
    params = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(3, cfg.vocab_size, (args.requests, args.prompt), generator=g)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        job = {"prompts": prompts.tolist(), "sampling": {"max_tokens": args.new, "temperature": 0.0,
                                                          "ignore_eos": True}}
        spec = {"engine": {"model": tmp, "skip_tokenizer_init": True, "dtype": "float32",
                           "max_model_len": args.prompt + args.new, "max_num_seqs": args.requests,
                           "gpu_memory_utilization": 0.3, "enable_prefix_caching": False},
                "jobs": [{"name": "warm", **job}, {"name": "timed", **job}]}
        path = os.path.join(tmp, "spec.json")
        json.dump(spec, open(path, "w"))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_NEURONX_", "NEURON_"))}
        env["TORCH_NEURONX_SIM_HBM"] = str(4 << 30)
        r = subprocess.run([sys.executable, RUN, path], env=env, capture_output=True, text=True, cwd=tmp)
        if r.returncode != 0:
            sys.exit("vLLM run failed:\n" + (r.stdout + r.stderr)[-4000:])
        result = json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")][0][7:])
    vllm_s = result["jobs"]["timed"]["seconds"]
    with torch.no_grad():
        model.generate(prompts[:2], attention_mask=torch.ones_like(prompts[:2]), max_new_tokens=2, do_sample=False,
                       pad_token_id=0)  # warm-up
        start = time.perf_counter()
        ref = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=args.new,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
        hf_s = time.perf_counter() - start
    same = sum(ref[i, args.prompt:].tolist() == result["jobs"]["timed"]["tokens"][i] for i in range(args.requests))
    tokens = args.requests * args.new
    print(f"Llama {params / 1e6:.0f}M parameters ({args.layers} layers, d={args.hidden}), {args.requests} requests "
          f"x {args.prompt} prompt tokens, {args.new} new tokens each, greedy, float32")
    print("| | seconds | output tokens/s | ratio |")
    print("|---|---:|---:|---:|")
    print(f"| HF `generate`, CPU | {hf_s:.2f} | {tokens / hf_s:.0f} | 1.00 |")
    print(f"| vLLM on neuron | {vllm_s:.2f} | {tokens / vllm_s:.0f} | {hf_s / vllm_s:.2f} |")
    print(f"requests with tokens equal to HF's: {same}/{args.requests}")
    if same != args.requests:  # make ecosystem's check of vLLM at this size
        sys.exit(f"vLLM on neuron generated other tokens than HF for {args.requests - same} requests")


if __name__ == "__main__":
    main()
