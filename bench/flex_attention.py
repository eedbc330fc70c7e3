"""FlexAttention on neuron, measured side by side in one run: compiled flex_attention (the
generated kernels, csrc/compiler/flex_attention.h) against CPU Inductor's compiled
flex_attention (forward: Inductor has no CPU backward) and against the same attention written as
SDPA with a dense boolean mask on neuron eager (forward, and forward + backward). Medians of
interleaved repetitions after warm-up; outputs are checked equal before timings count.

    python bench/flex_attention.py [--quick] [--docs]   # --docs: the table goes into docs/compile.md
"""
import argparse
import pathlib
import statistics
import time
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import torch_neuronx  # noqa: F401

ROOT = pathlib.Path(__file__).resolve().parents[1]
warnings.filterwarnings("ignore", ".*flex_attention called without torch.compile")


def causal(b, h, q, kv):
    return q >= kv


def sync(device):
    if device == "neuron":
        torch.neuron.synchronize()


def setups(B, H, S, D):
    g = torch.Generator().manual_seed(0)
    base = [torch.randn(B, H, S, D, generator=g) for _ in range(3)]
    out = {}
    for device in ("cpu", "neuron"):
        q, k, v = (t.to(device) for t in base)
        block_mask = create_block_mask(causal, None, None, S, S, device=device)
        flex = torch.compile(flex_attention, backend="inductor" if device == "cpu" else "neuron")
        out[f"{device} flex compiled"] = (device, lambda f=flex, q=q, k=k, v=v, m=block_mask: f(q, k, v, block_mask=m))
    q, k, v = (t.to("neuron") for t in base)
    dense = torch.ones(S, S, dtype=torch.bool, device="neuron").tril()
    out["neuron SDPA dense mask"] = ("neuron", lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense))
    # Forward and backward (neuron only).
    qg, kg, vg = (t.to("neuron").requires_grad_() for t in base)
    block_mask = create_block_mask(causal, None, None, S, S, device="neuron")
    flex = torch.compile(flex_attention, backend="neuron")
    grad = torch.randn(B, H, S, D, generator=g).to("neuron")

    def fwd_bwd(fn):
        def run():
            out = fn()
            torch.autograd.grad(out, (qg, kg, vg), grad)
            return out
        return run
    out["neuron flex compiled, fwd+bwd"] = ("neuron", fwd_bwd(lambda: flex(qg, kg, vg, block_mask=block_mask)))
    out["neuron SDPA dense mask, fwd+bwd"] = ("neuron", fwd_bwd(
        lambda: F.scaled_dot_product_attention(qg, kg, vg, attn_mask=dense)))
    return out


def measure(quick):
    B, H, S, D = (1, 2, 512, 64) if quick else (1, 8, 2048, 64)
    reps = 3 if quick else 9
    fns = setups(B, H, S, D)
    results = {}
    for name, (device, fn) in fns.items():
        results[name] = fn().detach().cpu()  # compile + warm-up
        sync(device)
    ref = results["cpu flex compiled"]
    for name, r in results.items():
        torch.testing.assert_close(r, ref, rtol=1e-4, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
    times = {n: [] for n in fns}
    for _ in range(reps):
        for name, (device, fn) in fns.items():
            t = time.perf_counter()
            fn()
            sync(device)
            times[name].append(time.perf_counter() - t)
    ms = {n: statistics.median(v) * 1e3 for n, v in times.items()}
    for n, v in ms.items():
        print(f"{n:<36} {v:9.2f} ms", flush=True)
    ratios = {
        "vs CPU Inductor (forward)": ms["cpu flex compiled"] / ms["neuron flex compiled"],
        "vs neuron SDPA dense mask (forward)": ms["neuron SDPA dense mask"] / ms["neuron flex compiled"],
        "vs neuron SDPA dense mask (forward + backward)":
            ms["neuron SDPA dense mask, fwd+bwd"] / ms["neuron flex compiled, fwd+bwd"],
    }
    for n, r in ratios.items():
        print(f"neuron flex compiled {n}: {r:.2f}x", flush=True)
    return (B, H, S, D), reps, ms, ratios


def table(shape, reps, ms, ratios):
    B, H, S, D = shape
    lines = [f"Measured {time.strftime('%Y-%m-%d')} on this machine ({torch.get_num_threads()} threads), torch "
             f"{torch.__version__}: causal block mask, batch {B}, {H} heads of {D}, sequence {S}, float32; "
             f"medians of {reps} interleaved repetitions.", "", "| run | time |", "|---|---|"]
    lines += [f"| {n} | {v:.1f} ms |" for n, v in ms.items()]
    lines += ["", "| neuron compiled flex attention | speed-up |", "|---|---|"]
    lines += [f"| {n} | {r:.2f}× |" for n, r in ratios.items()]
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="sequence 512, 3 repetitions (the CI smoke test)")
    p.add_argument("--docs", action="store_true", help="write the table into docs/compile.md")
    args = p.parse_args()
    text = table(*measure(args.quick))
    if args.docs:
        doc = ROOT / "docs" / "compile.md"
        begin, end = "<!-- bench:flex begin -->", "<!-- bench:flex end -->"
        head, rest = doc.read_text().split(begin)
        doc.write_text(head + begin + "\n" + text + "\n" + end + rest.split(end)[1])


if __name__ == "__main__":
    main()
