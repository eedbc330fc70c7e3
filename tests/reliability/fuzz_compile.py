"""A seeded fuzzer of the compile tier: random small graphs compiled with the ``neuron`` backend
against the same function run eagerly on CPU.

Each graph chains 3 to 8 ops (pointwise unary and binary with broadcast operands and scalars,
reductions over a dim with keepdim, softmax, matmul, views) over 1 to 3 float inputs of random
shape (0-size included), dtype (float32, bfloat16) and layout (contiguous, transposed, strided).
The compiled result must equal CPU eager within the compile tier's tolerances (it may contract
multiply-adds), or be no further than eager from a float64 run of the program (Inductor's rule for
ill-conditioned programs); no graph may fall back to eager. A graph is reproducible from (seed, index).

    python tests/reliability/fuzz_compile.py --graphs 200 --seed 1
"""
import argparse
import random
import sys
import time
import warnings

import torch

import torch_neuronx  # noqa: F401
from torch_neuronx.compile import compile_metrics, reset_compile_metrics

UNARY = ["relu", "exp", "tanh", "sigmoid", "neg", "abs", "sqrt_abs", "gelu", "square", "log1p_abs", "sin"]
BINARY = ["add", "sub", "mul", "div_safe", "maximum", "where_gt"]


def _shape(rng):
    nd = rng.choice([1, 2, 2, 3])
    return [rng.choice([0, 1, 3, 4, 7, 16, 33, 64]) if rng.random() < 0.1 else rng.choice([1, 3, 4, 7, 16, 33, 64])
            for _ in range(nd)]


def _input(rng, shape, dtype):
    g = torch.Generator().manual_seed(rng.getrandbits(31))
    kind = rng.choice(["contiguous", "transposed", "strided"]) if len(shape) >= 2 else "contiguous"
    if kind == "transposed":
        return torch.randn(shape[:-2] + [shape[-1], shape[-2]], generator=g).to(dtype).transpose(-1, -2)
    if kind == "strided":
        return torch.randn(shape[:-1] + [2 * shape[-1]], generator=g).to(dtype)[..., ::2]
    return torch.randn(shape, generator=g).to(dtype)


def make_graph(seed, i):
    """(fn, inputs, words): a random program over the inputs."""
    rng = random.Random(seed * 7_000_003 + i)
    dtype = torch.float32 if rng.random() < 0.8 else torch.bfloat16
    shape = _shape(rng)
    n_in = rng.randint(1, 3)
    shapes = [shape] + [[1 if rng.random() < 0.3 else s for s in shape[rng.randint(0, len(shape) - 1):]]
                        for _ in range(n_in - 1)]
    inputs = [_input(rng, s, dtype) for s in shapes]
    steps, words = [], []
    for _ in range(rng.randint(3, 8)):
        kind = rng.random()
        if kind < 0.4:
            op = rng.choice(UNARY)
            steps.append(("u", op))
            words.append(op)
        elif kind < 0.75:
            op = rng.choice(BINARY)
            other = rng.randrange(n_in) if rng.random() < 0.7 else rng.choice([0.5, -2.0, 3.0])
            steps.append(("b", op, other))
            words.append(f"{op}({other if isinstance(other, float) else 'in%d' % other})")
        elif kind < 0.85:
            op = rng.choice(["sum", "amax", "mean"])
            dim, keep = rng.randint(-1, 0), True
            steps.append(("r", op, dim, keep))
            words.append(f"{op}({dim})")
        elif kind < 0.92:
            steps.append(("softmax",))
            words.append("softmax")
        else:
            steps.append(("mm",))
            words.append("x@x.T")

    def fn(*xs):
        y = xs[0]
        for s in steps:
            if s[0] == "u":
                y = {"relu": torch.relu, "exp": lambda t: torch.exp(t.clamp(max=20)), "tanh": torch.tanh,
                     "sigmoid": torch.sigmoid, "neg": torch.neg, "abs": torch.abs,
                     "sqrt_abs": lambda t: torch.sqrt(t.abs()), "gelu": torch.nn.functional.gelu,
                     "square": torch.square, "log1p_abs": lambda t: torch.log1p(t.abs()),
                     "sin": torch.sin}[s[1]](y)
            elif s[0] == "b":
                o = xs[s[2]] if isinstance(s[2], int) else s[2]
                if s[1] == "add":
                    y = y + o
                elif s[1] == "sub":
                    y = y - o
                elif s[1] == "mul":
                    y = y * o
                elif s[1] == "div_safe":
                    y = y / (o.abs() + 1 if isinstance(o, torch.Tensor) else o)
                elif s[1] == "maximum":
                    y = torch.maximum(y, o if isinstance(o, torch.Tensor) else torch.tensor(o, dtype=y.dtype))
                else:
                    y = torch.where(y > (o if isinstance(o, float) else 0.0), y, o if isinstance(o, torch.Tensor)
                                    else y * o)
            elif s[0] == "r":
                y = getattr(torch, s[1])(y, dim=s[2], keepdim=s[3]) if y.dim() else y
            elif s[0] == "softmax":
                y = torch.softmax(y, -1) if y.dim() else y
            else:
                y = y @ y.transpose(-1, -2) if y.dim() >= 2 else y * y
        return y

    return fn, inputs, f"{dtype} inputs {shapes}: " + " -> ".join(words)


def _as_accurate(fn, inputs, ref, got, tol):
    """Inductor's accuracy rule for ill-conditioned programs (exp of a sum, bfloat16 chains that
    eager rounds at every op): the compiled result is accepted if it is no further from a float64
    run of the program than eager is (RMSE, 3x eager's error plus tol/10), with the same
    non-finite entries."""
    with torch.no_grad():
        exact = fn(*[x.double() for x in inputs])
    ref, got = ref.double(), got.double()
    finite = exact.isfinite() & ref.isfinite()
    if not torch.equal(finite, exact.isfinite() & got.isfinite()):
        return False
    rmse = lambda a: (a[finite] - exact[finite]).square().mean().sqrt().item() if finite.any() else 0.0  # noqa: E731
    return rmse(got) <= 3 * rmse(ref) + tol / 10


def run(seed, graphs, start=0, log=None):
    warnings.simplefilter("ignore")
    stats = {"graphs": 0, "failures": [], "seconds": 0.0}
    t0 = time.perf_counter()
    for i in range(start, start + graphs):
        fn, inputs, words = make_graph(seed, i)
        stats["graphs"] += 1
        torch._dynamo.reset()
        reset_compile_metrics()
        problem = None
        try:
            ref = fn(*inputs)
        except Exception as e:
            ref = e
        try:
            got = torch.compile(fn, backend="neuron", dynamic=False)(*[x.to("neuron") for x in inputs])
            got = got.cpu()
            torch.neuron.synchronize()
        except Exception as e:
            got = e
        if isinstance(ref, Exception) or isinstance(got, Exception):
            # An invalid program: Dynamo raises its own RuntimeError subclass (TorchRuntimeError,
            # from the fake-tensor trace), whichever exception eager raised.
            invalid_both = isinstance(ref, Exception) and (
                isinstance(got, type(ref)) or isinstance(got, torch._dynamo.exc.TorchRuntimeError))
            if not invalid_both:
                problem = f"eager CPU: {type(ref).__name__ if isinstance(ref, Exception) else 'ok'}; " \
                          f"compiled: {type(got).__name__ if isinstance(got, Exception) else 'ok'} " \
                          f"{str(got)[:300] if isinstance(got, Exception) else ''}"
        elif ref.shape != got.shape or ref.dtype != got.dtype:
            problem = f"CPU {tuple(ref.shape)} {ref.dtype} vs compiled {tuple(got.shape)} {got.dtype}"
        else:
            tol = 2e-2 if ref.dtype == torch.bfloat16 else 1e-4
            try:
                torch.testing.assert_close(got, ref, rtol=tol, atol=tol, equal_nan=True)
            except AssertionError as e:
                problem = None if _as_accurate(fn, inputs, ref, got, tol) else " ".join(str(e).splitlines()[:3])
        m = compile_metrics()
        if not problem and m["eager_graphs"]:
            problem = f"ran eagerly: {m['eager_reasons']}"
        if problem:
            stats["failures"].append({"seed": seed, "index": i, "graph": words, "problem": problem})
            if log:
                print(f"FAIL seed={seed} index={i} {words}: {problem}", file=log, flush=True)
    stats["seconds"] = time.perf_counter() - t0
    return stats


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--graphs", type=int, default=100)
    p.add_argument("--start", type=int, default=0)
    a = p.parse_args()
    s = run(a.seed, a.graphs, a.start, log=sys.stdout)
    print(f"seed {a.seed}: {s['graphs']} graphs in {s['seconds']:.1f} s; {len(s['failures'])} failures")
    sys.exit(1 if s["failures"] else 0)


if __name__ == "__main__":
    main()
