"""Per-op dispatch overhead: a loop of tiny ops on neuron vs CPU, measured side by side.

Each figure is microseconds per op including a final synchronize, the median of
interleaved repetitions (CPU, neuron, CPU, neuron, ...) after warm-up; the ratio
is the median over repetitions of neuron / CPU measured back to back (a shared
machine's speed drifts between repetitions; a pair sees the same speed).

    python bench/dispatch.py [--ops 500] [--reps 41]
"""
import argparse
import statistics
import time

import torch

OPS = {
    "add": lambda a, b: a + b,
    "add_": lambda a, b: a.add_(b),
    "mul_scalar": lambda a, b: a * 2.0,
    "relu": lambda a, b: torch.relu(a),
    "sum": lambda a, b: a.sum(),
    "mm_4x4": lambda a, b: a.view(4, 4) @ b.view(4, 4),
}


def per_op_us(device, fn, n):
    a = torch.randn(16, device=device)
    b = torch.randn(16, device=device)
    sync = torch.neuron.synchronize if device == "neuron" else (lambda: None)
    sync()
    t = time.perf_counter()
    for _ in range(n):
        fn(a, b)
    sync()
    return (time.perf_counter() - t) / n * 1e6


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", type=int, default=500, help="ops per repetition")
    p.add_argument("--reps", type=int, default=41, help="interleaved repetitions (median reported)")
    args = p.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; tiny (16-element) ops, "
          f"median of {args.reps} interleaved repetitions of {args.ops} ops")
    print(f"{'op':<12}{'cpu us/op':>12}{'neuron us/op':>14}{'ratio':>8}")
    for name, fn in OPS.items():
        for dev in ("cpu", "neuron"):
            per_op_us(dev, fn, 200)  # warm-up (first neuron call per signature runs inline)
        cpu, neu = [], []
        for _ in range(args.reps):
            cpu.append(per_op_us("cpu", fn, args.ops))
            neu.append(per_op_us("neuron", fn, args.ops))
        c, n = statistics.median(cpu), statistics.median(neu)
        ratio = statistics.median(x / y for x, y in zip(neu, cpu))
        print(f"{name:<12}{c:>12.2f}{n:>14.2f}{ratio:>8.2f}")


if __name__ == "__main__":
    main()
