"""TorchAO on neuron vs CPU, side by side: a tiny Llama (8 layers, d=256, batch 4 x 128) forward
in float32 and with int8 weight-only and int8 dynamic-activation quantization; a float8 training
step (tensorwise and rowwise recipes) against the same step in bfloat16.

Figures are milliseconds per call including a synchronize, the median of interleaved
repetitions after warm-up (the compiled column is measured after its compile); ratios are
CPU eager / the column (above 1: faster than CPU eager).

    python bench/quantization.py [--reps 7]
"""
import argparse
import copy
import logging
import statistics
import time

import torch

import torch_neuronx  # noqa: F401

logging.getLogger("torchao").setLevel(logging.ERROR)  # its CUDA-only libraries do not load here
from torchao.float8 import Float8LinearConfig, convert_to_float8_training  # noqa: E402
from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

COLUMNS = [("cpu", False), ("neuron", False), ("neuron", True)]


def _model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=768, num_hidden_layers=8,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256)
    return LlamaForCausalLM(cfg)


def _time(fns, reps):
    """Median ms of each function, interleaved."""
    for fn in fns:
        fn()
        fn()
    times = [[] for _ in fns]
    for _ in range(reps):
        for i, fn in enumerate(fns):
            t = time.perf_counter()
            fn()
            torch.neuron.synchronize()
            times[i].append((time.perf_counter() - t) * 1e3)
    return [statistics.median(t) for t in times]


def _inference(base, config, reps):
    ids = torch.randint(0, 1024, (4, 128), generator=torch.Generator().manual_seed(1))
    fns = []
    for dev, compiled in COLUMNS:
        m = copy.deepcopy(base).eval().to(dev)
        if config is not None:
            quantize_(m, config())
        run = torch.compile(m, backend="neuron") if compiled else m
        x = ids.to(dev)

        def fn(run=run, x=x):
            with torch.no_grad():
                return run(x).logits
        fns.append(fn)
    return _time(fns, reps)


def _training(base, recipe, reps):
    ids = torch.randint(0, 1024, (4, 128), generator=torch.Generator().manual_seed(1))
    fns = []
    for dev, compiled in COLUMNS:
        m = copy.deepcopy(base).train().to(dev, torch.bfloat16)
        if recipe is not None:
            convert_to_float8_training(m, config=Float8LinearConfig.from_recipe_name(recipe),
                                       module_filter_fn=lambda mod, fqn: "lm_head" not in fqn)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
        run = torch.compile(m, backend="neuron") if compiled else m
        x = ids.to(dev)

        def fn(run=run, x=x, opt=opt):
            run(x, labels=x).loss.backward()
            opt.step()
            opt.zero_grad()
        fns.append(fn)
    return _time(fns, reps)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=7, help="interleaved repetitions (median reported)")
    args = p.parse_args()
    base = _model()
    rows = [(f"forward, {name}", _inference(base, cfg, args.reps)) for name, cfg in
            [("float32", None), ("int8 weight-only", Int8WeightOnlyConfig),
             ("int8 dynamic activation", Int8DynamicActivationInt8WeightConfig)]]
    rows += [(f"training step, {name}", _training(base, recipe, args.reps)) for name, recipe in
             [("bfloat16", None), ("float8 tensorwise", "tensorwise"), ("float8 rowwise", "rowwise")]]
    print(f"torch {torch.__version__}, torchao {__import__('torchao').__version__}, {torch.get_num_threads()} "
          f"threads; median of {args.reps} interleaved repetitions (ms; ratio = CPU eager / column)\n")
    print("| workload | CPU eager | neuron eager | neuron compiled |")
    print("|---|---|---|---|")
    for name, (cpu, eager, compiled) in rows:
        print(f"| {name} | {cpu:.1f} | {eager:.1f} ({cpu / eager:.2f}x) | {compiled:.1f} ({cpu / compiled:.2f}x) |")


if __name__ == "__main__":
    main()
