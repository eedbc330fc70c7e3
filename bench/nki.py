"""NKI kernels on the simulated NeuronCore against the equivalent ATen composition on CPU,
measured side by side (interleaved repetitions, medians of per-pair ratios).

The kernels are torch_neuronx.nki.samples (written like the public tutorials): a tiled
matmul accumulating in PSUM and a causal flash-attention forward (online softmax,
fully masked key blocks skipped). Their traces are cached (the first call traces).

    python bench/nki.py [--reps 7]
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from torch_neuronx.nki import samples as S


def _timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def cases():
    torch.manual_seed(0)
    lhsT, rhs = torch.randn(1024, 512), torch.randn(1024, 1024)
    ln, rn = lhsT.to("neuron"), rhs.to("neuron")
    S_len, d = 1024, 64
    q, k, v = torch.randn(S_len, d), torch.randn(S_len, d), torch.randn(S_len, d)
    qT, kT, vn = q.T.contiguous().to("neuron"), k.T.contiguous().to("neuron"), v.to("neuron")

    def nki_mm():
        S.matmul(ln, rn)
        torch.neuron.synchronize()

    def nki_flash():
        S.flash_attention(qT, kT, vn, d ** -0.5)
        torch.neuron.synchronize()

    return {
        "matmul 512x1024 @ 1024x1024 (fp32)": (nki_mm, lambda: lhsT.T @ rhs),
        "flash attention causal S=1024 d=64": (
            nki_flash, lambda: F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args()
    print(f"| kernel | NKI on neuron (ms) | ATen on CPU (ms) | ratio |\n|---|---|---|---|")
    for name, (nki_fn, cpu_fn) in cases().items():
        nki_fn(), cpu_fn()  # trace, warm up
        pairs = [(_timed(nki_fn), _timed(cpu_fn)) for _ in range(args.reps)]
        n = statistics.median(a for a, _ in pairs) * 1e3
        c = statistics.median(b for _, b in pairs) * 1e3
        r = statistics.median(a / b for a, b in pairs)
        print(f"| {name} | {n:.2f} | {c:.2f} | {r:.2f}x |")


if __name__ == "__main__":
    main()
