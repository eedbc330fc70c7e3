"""NKI kernels on the simulated NeuronCore against the equivalent ATen composition on CPU,
measured side by side (interleaved repetitions, medians of per-pair ratios).

The kernels are torch_neuronx.nki.samples (written like the public tutorials): a tiled
matmul accumulating in PSUM and a causal flash-attention forward (online softmax,
fully masked key blocks skipped). Their traces are cached (the first call traces).

Then the kernel library (torch_neuronx.nki.kernels): each op on neuron against its ATen
composition on CPU, with the modeled NeuronCore latency of its launches (trn2 unless
NEURON_PLATFORM_TARGET_OVERRIDE says otherwise) and the Tensor Engine's modeled utilization.

    python bench/nki.py [--reps 7] [--library-only]
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from torch_neuronx import nki
from torch_neuronx.nki import kernels as K
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


def library_cases():
    """(name, NKI op on neuron, ATen composition on CPU) of each library kernel."""
    torch.manual_seed(0)
    cases = {}

    def attn(B, H, Hkv, S_, D, dtype, causal, grad):
        q = torch.randn(B, H, S_, D, dtype=dtype)
        k, v = torch.randn(B, Hkv, S_, D, dtype=dtype), torch.randn(B, Hkv, S_, D, dtype=dtype)
        g = torch.randn_like(q)
        qn, kn, vn, gn = (t.to("neuron") for t in (q, k, v, g))
        if not grad:
            return (lambda: K.flash_attention(qn, kn, vn, causal=causal),
                    lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True))
        out, lse = K.flash_attention(qn, kn, vn, causal=causal, return_lse=True)
        cpu_args = [t.requires_grad_() for t in (q.clone(), k.clone(), v.clone())]
        from torch_neuronx.nki.kernels import ops

        def cpu_bwd():
            o = F.scaled_dot_product_attention(*cpu_args, is_causal=causal, enable_gqa=True)
            torch.autograd.grad(o, cpu_args, g)
        return (lambda: ops.flash_attention_backward(gn, qn, kn, vn, out, lse, causal, None, None), cpu_bwd)

    cases["flash attention fwd B1 H8/kv2 S1024 d128 causal bf16"] = attn(1, 8, 2, 1024, 128, torch.bfloat16, True, False)
    cases["flash attention fwd B1 H8 S1000 d64 fp32"] = attn(1, 8, 8, 1000, 64, torch.float32, False, False)
    cases["flash attention bwd B1 H8/kv2 S1024 d128 causal bf16"] = attn(1, 8, 2, 1024, 128, torch.bfloat16, True, True)
    x = torch.randn(4096, 2048, dtype=torch.bfloat16)
    w, b = torch.randn(2048, dtype=torch.bfloat16), torch.randn(2048, dtype=torch.bfloat16)
    xn, wn, bn = x.to("neuron"), w.to("neuron"), b.to("neuron")
    cases["rms_norm fwd 4096x2048 bf16"] = (lambda: K.rms_norm(xn, wn), lambda: F.rms_norm(x, (2048,), w, 1e-6))
    cases["layer_norm fwd 4096x2048 bf16"] = (lambda: K.layer_norm(xn, wn, bn),
                                              lambda: F.layer_norm(x, (2048,), w, b))
    xs = torch.randn(1024, 1024, dtype=torch.bfloat16)
    lw = torch.randn(2816, 1024, dtype=torch.bfloat16) / 32
    wg, wu = torch.randn(2816, 1024, dtype=torch.bfloat16) / 32, torch.randn(2816, 1024, dtype=torch.bfloat16) / 32
    wd = torch.randn(1024, 2816, dtype=torch.bfloat16) / 53
    xsn, lwn, wgn, wun, wdn, w1n = (t.to("neuron") for t in (xs, lw, wg, wu, wd, w[:1024]))
    cases["rms_norm + linear 1024x1024 -> 2816 bf16"] = (
        lambda: K.rms_norm_linear(xsn, w1n, lwn), lambda: F.rms_norm(xs, (1024,), w[:1024], 1e-6) @ lw.T)
    cases["SwiGLU MLP 1024x1024, I=2816 bf16"] = (
        lambda: K.swiglu(xsn, wgn, wun, wdn), lambda: (F.silu(xs @ wg.T) * (xs @ wu.T)) @ wd.T)
    T, E, k, H, I = 1000, 8, 2, 1024, 1024
    xm = torch.randn(T, H, dtype=torch.bfloat16)
    gu, dp = torch.randn(E, 2 * I, H, dtype=torch.bfloat16) / 32, torch.randn(E, H, I, dtype=torch.bfloat16) / 32
    ids = torch.topk(torch.randn(T, E), k).indices
    wts = torch.softmax(torch.randn(T, k), -1)
    xmn, gun, dpn, idn, wtn = (t.to("neuron") for t in (xm, gu, dp, ids, wts))
    from torch_neuronx.nki.kernels.ops import _moe_reference
    cases["MoE experts T1000 E8 top2 H=I=1024 bf16"] = (
        lambda: K.moe_experts(xmn, idn, wtn, gun, dpn), lambda: _moe_reference(xm, ids, wts, gu, dp))
    return cases


def _pairs(nki_fn, cpu_fn, reps):
    def dev():
        nki_fn()
        torch.neuron.synchronize()
    dev(), cpu_fn()  # trace, warm up
    pairs = [(_timed(dev), _timed(cpu_fn)) for _ in range(reps)]
    n = statistics.median(a for a, _ in pairs) * 1e3
    c = statistics.median(b for _, b in pairs) * 1e3
    return n, c, statistics.median(a / b for a, b in pairs)


def naive_vs_flash():
    """The modeled Tensor Engine utilization of the flash and naive forward kernels at S=4096, d=128, bf16."""
    from torch_neuronx.nki.kernels import attention as A
    rows = []
    for causal in (False, True):
        q, k, v = (torch.randn(1, 1, 4096, 128, dtype=torch.bfloat16) for _ in range(3))
        with nki.modeled_launches() as flash:
            A.flash_attention_forward(q, k, v, causal=causal)
        with nki.modeled_launches() as naive:
            A.naive_attention_forward(q, k, v, causal=causal)
        rows.append((causal, flash, naive))
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--library-only", action="store_true")
    args = p.parse_args()
    print("| kernel library op | NKI on neuron (ms) | ATen on CPU (ms) | ratio | modeled NeuronCore (us) | "
          "Tensor Engine (modeled) |\n|---|---|---|---|---|---|")
    for name, (nki_fn, cpu_fn) in library_cases().items():
        with nki.modeled_launches() as launches:
            nki_fn()
        n, c, r = _pairs(nki_fn, cpu_fn, args.reps)
        print(f"| {name} | {n:.2f} | {c:.2f} | {r:.2f}x | {launches.latency_us:.1f} | "
              f"{100 * launches.tensor_utilization:.1f}% |")
    print("\n| FlashAttention fwd S=4096 d=128 bf16 (modeled) | flash latency (us) | flash Tensor Engine | "
          "naive latency (us) | naive Tensor Engine |\n|---|---|---|---|---|")
    for causal, flash, naive in naive_vs_flash():
        print(f"| {'causal' if causal else 'no mask'} | {flash.latency_us:.1f} | {100 * flash.tensor_utilization:.1f}% | "
              f"{naive.latency_us:.1f} | {100 * naive.tensor_utilization:.1f}% |")
    if args.library_only:
        return
    print(f"\n| kernel | NKI on neuron (ms) | ATen on CPU (ms) | ratio |\n|---|---|---|---|")
    for name, (nki_fn, cpu_fn) in cases().items():
        nki_fn(), cpu_fn()  # trace, warm up
        pairs = [(_timed(nki_fn), _timed(cpu_fn)) for _ in range(args.reps)]
        n = statistics.median(a for a, _ in pairs) * 1e3
        c = statistics.median(b for _, b in pairs) * 1e3
        r = statistics.median(a / b for a, b in pairs)
        print(f"| {name} | {n:.2f} | {c:.2f} | {r:.2f}x |")


if __name__ == "__main__":
    main()
