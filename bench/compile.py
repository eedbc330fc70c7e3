"""torch.compile on neuron vs CPU Inductor, measured side by side in the same run.

Throughput (medians of interleaved repetitions, warm-up excluded) of training steps (nanoGPT, a
Hugging Face GPT-2, a small CNN with batch norm), inference (the BERT-sized encoder, ResNet-18)
and a pointwise chain for: CPU Inductor (the baseline),
neuron compiled (backend "neuron") and neuron eager. Compile times: the first call (trace +
compile + run) in a fresh process with an empty cache (cold) and again with the cache the cold
run filled (warm), for both compilers.

    python bench/compile.py [--quick] [--docs]   # --docs: the table goes into docs/compile.md
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import run as B  # noqa: E402
from torch_neuronx.testing.models import SmallCNN  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODES = ("cpu_inductor", "neuron_compiled", "neuron_eager")


def tokens(n, vocab, seq):
    return torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(3))


def nanogpt_train(quick):
    vocab, layers, batch, seq = (512, 2, 2, 64) if quick else (8192, 8, 4, 256)

    def setup(device, backend):
        torch.manual_seed(0)
        model = B.NanoGPT(vocab=vocab, layers=layers, seq=seq).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x, y = tokens(batch, vocab, seq).to(device), tokens(batch, vocab, seq).to(device)
        fwd = torch.compile(model, backend=backend) if backend else model

        def step():
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(fwd(x).reshape(-1, vocab), y.reshape(-1))
            loss.backward()
            opt.step()
            return loss
        return step
    return setup


def gpt2_train(quick):
    """A Hugging Face GPT-2 built from its config (4 layers, d=384, seq 256; dropout on)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    layers, d, heads, vocab, batch, seq = (2, 64, 2, 512, 2, 64) if quick else (4, 384, 6, 8192, 8, 256)
    cfg = GPT2Config(n_layer=layers, n_embd=d, n_head=heads, vocab_size=vocab, n_positions=seq, bos_token_id=0,
                     eos_token_id=0)
    cfg._attn_implementation = "sdpa"

    def setup(device, backend):
        torch.manual_seed(0)
        model = GPT2LMHeadModel(cfg).to(device).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = tokens(batch, vocab, seq).to(device)
        fwd = torch.compile(model, backend=backend) if backend else model

        def step():
            opt.zero_grad(set_to_none=True)
            loss = fwd(input_ids=x, labels=x).loss
            loss.backward()
            opt.step()
            return loss
        return step
    return setup


def cnn_train(quick):
    batch, size = (4, 32) if quick else (32, 64)

    def setup(device, backend):
        torch.manual_seed(0)
        model = SmallCNN().to(device).train()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        g = torch.Generator().manual_seed(5)
        x = torch.randn(batch, 3, size, size, generator=g).to(device)
        y = torch.randint(0, 10, (batch,), generator=g).to(device)
        fwd = torch.compile(model, backend=backend) if backend else model

        def step():
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(fwd(x), y)
            loss.backward()
            opt.step()
            return loss
        return step
    return setup


def inference(make_model, make_input):
    """A workload's setup: the model in eval mode on the device, compiled with the backend (none:
    eager), run under no_grad."""
    def setup(device, backend):
        torch.manual_seed(0)
        model = make_model().to(device).eval()
        x = make_input().to(device)
        fwd = torch.compile(model, backend=backend) if backend else model

        def run():
            with torch.no_grad():
                return fwd(x)
        return run
    return setup


def resnet18_inference(quick):
    batch, size, width = (1, 64, 16) if quick else (8, 224, 64)
    return inference(lambda: B.ResNet18(width=width),
                     lambda: torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(4)))


def bert_inference(quick):
    kw = dict(vocab=1024, d=128, layers=2, heads=4, ff=256) if quick else {}
    batch = 2 if quick else 8
    return inference(lambda: B.BertEncoder(**kw), lambda: tokens(batch, kw.get("vocab", 30522), 128))


def pointwise(quick):
    n = 1 << (16 if quick else 22)

    def setup(device, backend):
        g = torch.Generator().manual_seed(0)
        x, b, r = (torch.randn(n, generator=g).to(device) for _ in range(3))

        def chain(x, b, r):
            return torch.sigmoid(F.gelu(x + b) * 1.5).tanh() + r * torch.exp(-x.abs())
        fn = torch.compile(chain, backend=backend) if backend else chain
        return lambda: fn(x, b, r)
    return setup


WORKLOADS = {"nanogpt_train_step": nanogpt_train, "gpt2_train_step": gpt2_train, "cnn_train_step": cnn_train,
             "bert_inference": bert_inference, "resnet18_inference": resnet18_inference,
             "pointwise_chain": pointwise}


def backend_of(mode):
    return {"cpu_inductor": ("cpu", "inductor"), "neuron_compiled": ("neuron", "neuron"),
            "neuron_eager": ("neuron", None)}[mode]


def throughput(quick, reps):
    rows = {}
    for name, make in WORKLOADS.items():
        fns = {}
        for mode in MODES:
            device, backend = backend_of(mode)
            torch._dynamo.reset()
            fn = make(quick)(device, backend)
            fn()  # compile + warm-up
            B.sync(device)
            fns[mode] = (fn, device)
        times = {m: [] for m in MODES}
        for _ in range(reps):
            for mode, (fn, device) in fns.items():
                t = time.perf_counter()
                fn()
                fn()
                B.sync(device)
                times[mode].append((time.perf_counter() - t) / 2)
        med = {m: statistics.median(v) for m, v in times.items()}
        rows[name] = {"ms": {m: v * 1e3 for m, v in med.items()},
                      "compiled_vs_inductor": med["cpu_inductor"] / med["neuron_compiled"],
                      "compiled_vs_eager": med["neuron_eager"] / med["neuron_compiled"]}
        print(f"{name:<20}" + "".join(f"{m}={v * 1e3:9.2f} ms  " for m, v in med.items())
              + f"compiled/inductor {rows[name]['compiled_vs_inductor']:.2f}x  "
              f"compiled/eager {rows[name]['compiled_vs_eager']:.2f}x", flush=True)
    return rows


CHILD = """
import sys, time, torch, torch_neuronx
sys.path.insert(0, {bench!r})
import compile as C
setup = C.nanogpt_train({quick})
device, backend = C.backend_of({mode!r})
fn = setup(device, backend)
t = time.perf_counter()
fn().item()
first = time.perf_counter() - t
steps = []
for _ in range(3):
    t = time.perf_counter()
    fn().item()
    steps.append(time.perf_counter() - t)
print(first, sorted(steps)[1])
"""


def compile_times(quick):
    """First-call seconds (trace + compile + one step; the model is built before) in fresh
    processes, cold then warm, and the compile part of it (first call - a later step). Caches on
    for both compilers (bench/run.py turns Inductor's off for its own first-call figures)."""
    out = {}
    for mode in ("cpu_inductor", "neuron_compiled"):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "TORCH_NEURONX_CACHE_DIR": cache, "TORCHINDUCTOR_CACHE_DIR": cache,
                   "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "0"}
            secs, compile_secs = [], []
            for _ in range(2):
                r = subprocess.run([sys.executable, "-c", CHILD.format(bench=str(ROOT / "bench"), quick=quick,
                                                                        mode=mode)],
                                   capture_output=True, text=True, env=env, timeout=900)
                if r.returncode:
                    raise RuntimeError(r.stderr[-3000:])
                first, step = map(float, r.stdout.strip().splitlines()[-1].split())
                secs.append(first)
                compile_secs.append(first - step)
            out[mode] = {"cold_s": secs[0], "warm_s": secs[1], "cold_compile_s": compile_secs[0],
                         "warm_compile_s": compile_secs[1]}
            print(f"{mode:<16} first call: cold {secs[0]:.2f} s, warm {secs[1]:.2f} s; compile part: "
                  f"cold {compile_secs[0]:.2f} s, warm {compile_secs[1]:.2f} s", flush=True)
    return out


def table(rows, times, meta):
    lines = [f"Measured {meta['date']} on this machine ({meta['threads']} threads), torch {meta['torch']}; "
             f"medians of {meta['reps']} interleaved repetitions.", "",
             "| workload | CPU Inductor | neuron compiled | neuron eager | compiled / Inductor | compiled / eager |",
             "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        ms = r["ms"]
        lines.append(f"| {name} | {ms['cpu_inductor']:.1f} ms | {ms['neuron_compiled']:.1f} ms | "
                     f"{ms['neuron_eager']:.1f} ms | {r['compiled_vs_inductor']:.2f}× | {r['compiled_vs_eager']:.2f}× |")
    lines += ["", "First call of the nanoGPT training step in a new process (Dynamo, AOTAutograd, compile, one "
              "step; the model is built before), and its compile part (first call minus a later step):", "",
              "| compiler | first call, cold (empty caches) | first call, warm (caches from the cold run) | "
              "compile part, cold | compile part, warm |", "|---|---|---|---|---|"]
    for mode, t in times.items():
        lines.append(f"| {mode} | {t['cold_s']:.2f} s | {t['warm_s']:.2f} s | {t['cold_compile_s']:.2f} s | "
                     f"{t['warm_compile_s']:.2f} s |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes, 3 repetitions (the CI smoke test)")
    p.add_argument("--docs", action="store_true", help="write the table into docs/compile.md")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    reps = 3 if args.quick else 7
    rows = throughput(args.quick, reps)
    times = compile_times(args.quick)
    meta = {"date": time.strftime("%Y-%m-%d"), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "reps": reps}
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"meta": meta, "throughput": rows, "compile": times}, indent=1))
    if args.docs:
        doc = ROOT / "docs" / "compile.md"
        text = doc.read_text()
        begin, end = "<!-- bench:compile begin -->", "<!-- bench:compile end -->"
        head, rest = text.split(begin)
        doc.write_text(head + begin + "\n" + table(rows, times, meta) + "\n" + end + rest.split(end)[1])


if __name__ == "__main__":
    main()
