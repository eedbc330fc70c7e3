"""A seeded fuzzer of the eager op surface: every case runs on CPU and on ``neuron``.

Each case draws an op family, shapes (0-d and 0-size included), dtypes (mixed, so type promotion
runs), layouts (transposed, strided, offset, permuted, expanded: the same view of the same values
on both devices), CPU 0-d operands mixed with device tensors, and sometimes an invalid argument
(incompatible shapes, a dimension or index out of range, a dtype the op refuses). The outcome on
``neuron`` must be CPU's: the same values, shape and dtype, or an exception of the same type (an
asynchronous kernel error counts when the case's synchronize raises it). After every case the
device must still work. A case is reproducible from ``(seed, index)``.

    python tests/reliability/fuzz_ops.py --cases 20000 --seed 1
"""
import argparse
import faulthandler
import random
import sys
import time
import warnings
from typing import Callable, List, Optional

import torch

import torch_neuronx  # noqa: F401

DEV = "neuron"
FLOATS = [torch.float32, torch.float32, torch.float64, torch.bfloat16, torch.float16]
INTS = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]
ALL = FLOATS + INTS + [torch.bool, torch.complex64]
SIZES = [0, 1, 1, 2, 3, 4, 5, 7, 8, 16, 33]


class Case:
    """What a case runs: fn over args (tensors given as (base, view) builders), and its words."""

    def __init__(self, family: str, fn: Callable, args: list, words: str):
        self.family, self.fn, self.args, self.words = family, fn, args, words


class T:
    """A tensor argument: values made on CPU, then the same view taken on each device."""

    def __init__(self, base: torch.Tensor, view: Callable, words: str, host: bool = False):
        self.base, self.view, self.words, self.host = base, view, words, host

    def on(self, device: str) -> torch.Tensor:
        if self.host or device == "cpu":
            return self.view(self.base.clone())
        return self.view(self.base.to(device))


def values(rng: random.Random, shape, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(rng.getrandbits(31))
    if dtype.is_floating_point or dtype.is_complex:
        v = torch.randn(shape, generator=g, dtype=torch.float64) * rng.choice([1.0, 3.0, 100.0])
        if rng.random() < 0.1 and v.numel():
            v.view(-1)[0] = rng.choice([float("nan"), float("inf"), -float("inf"), 0.0, -0.0])
        if dtype.is_complex:
            return torch.complex(v, torch.randn(shape, generator=g, dtype=torch.float64)).to(dtype)
        return v.to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) < 0.5
    lo = 0 if dtype == torch.uint8 else -20
    return torch.randint(lo, 40, shape, generator=g).to(dtype)


def shape_of(rng: random.Random, max_dim: int = 4) -> List[int]:
    if rng.random() < 0.03:  # sizes where CPU kernels split work across threads
        return rng.choice([[rng.choice([4097, 65537, 300001])], [513, rng.choice([257, 1000])], [3, 129, 257]])
    ndim = rng.choice([0, 1, 1, 2, 2, 2, 3, 3, 4][: max_dim * 2 + 1])
    return [rng.choice(SIZES) for _ in range(ndim)]


def tensor(rng: random.Random, shape, dtype, layouts=True, host_ok=False) -> T:
    """A tensor of `shape` and `dtype` in a random layout (a view of a base made for it); if
    host_ok, a 0-d one may stay on the CPU (where CUDA takes CPU scalars: TensorIterator ops)."""
    shape = list(shape)
    kind = rng.choice(["contiguous", "transposed", "strided", "offset", "permuted", "expanded"]) if layouts \
        else "contiguous"
    nd = len(shape)
    if nd == 0 and host_ok and rng.random() < 0.25:
        return T(values(rng, [], dtype), lambda t: t, f"cpu-scalar {dtype}", host=True)
    if kind == "transposed" and nd >= 2:
        base = values(rng, shape[:-2] + [shape[-1], shape[-2]], dtype)
        return T(base, lambda t: t.transpose(-1, -2), f"{shape} {dtype} transposed")
    if kind == "strided" and nd >= 1:
        base = values(rng, shape[:-1] + [2 * shape[-1] + 1], dtype)
        return T(base, lambda t: t[..., 1::2], f"{shape} {dtype} strided")
    if kind == "offset":
        n = 1
        for s in shape:
            n *= s
        off = rng.randint(1, 9)
        base = values(rng, [n + off], dtype)
        return T(base, lambda t: t[off:].view(shape), f"{shape} {dtype} offset {off}")
    if kind == "permuted" and nd >= 3:
        perm = list(range(nd))
        rng.shuffle(perm)
        inv = [perm.index(i) for i in range(nd)]
        base = values(rng, [shape[p] for p in inv], dtype)
        return T(base, lambda t: t.permute(perm), f"{shape} {dtype} permuted {perm}")
    if kind == "expanded" and nd >= 1:
        small = [1 if rng.random() < 0.5 else s for s in shape]
        base = values(rng, small, dtype)
        return T(base, lambda t: t.expand(shape), f"{shape} {dtype} expanded from {small}")
    return T(values(rng, shape, dtype), lambda t: t, f"{shape} {dtype}")


def broadcast_partner(rng: random.Random, shape: List[int], invalid: bool) -> List[int]:
    other = list(shape[rng.randint(0, len(shape)):]) if shape else []
    other = [1 if rng.random() < 0.3 else s for s in other]
    if invalid and other and any(s > 1 for s in other):
        i = rng.choice([i for i, s in enumerate(other) if s > 1])
        other[i] += 1  # neither equal nor 1
    return other


UNARY = {
    "abs": torch.abs, "neg": torch.neg, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
    "sin": torch.sin, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu, "floor": torch.floor,
    "round": torch.round, "sign": torch.sign, "bitwise_not": torch.bitwise_not, "logical_not": torch.logical_not,
    "isnan": torch.isnan, "reciprocal": torch.reciprocal, "square": torch.square, "erf": torch.erf,
    "clamp": lambda t: torch.clamp(t, -1, 2), "nan_to_num": torch.nan_to_num, "frac": torch.frac,
    "gelu": torch.nn.functional.gelu, "softmax": lambda t: torch.softmax(t, -1),
    "cumsum": lambda t: torch.cumsum(t, -1), "sort": lambda t: torch.sort(t, -1), "flip": lambda t: t.flip(-1),
}
BINARY = {
    "add": torch.add, "add_alpha": lambda a, b: torch.add(a, b, alpha=2), "sub": torch.sub, "mul": torch.mul,
    "div": torch.div, "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"), "remainder": torch.remainder,
    "fmod": torch.fmod, "pow": torch.pow, "maximum": torch.maximum, "minimum": torch.minimum, "eq": torch.eq,
    "lt": torch.lt, "logical_and": torch.logical_and, "bitwise_and": torch.bitwise_and, "atan2": torch.atan2,
    "where": lambda a, b: torch.where(a > 0 if not a.dtype.is_complex else a.real > 0, a, b),
    "lerp": lambda a, b: torch.lerp(a, b, 0.25), "hypot": torch.hypot, "copysign": torch.copysign,
}
INPLACE = {
    "add_": lambda a, b: a.add_(b), "mul_": lambda a, b: a.mul_(b), "sub_": lambda a, b: a.sub_(b),
    "div_": lambda a, b: a.div_(b), "copy_": lambda a, b: a.copy_(b), "clamp_min_": lambda a, b: a.clamp_min_(0),
    "masked_fill_": lambda a, b: a.masked_fill_(b > 0 if not b.dtype.is_complex else b.real > 0, 7),
}
REDUCE = {
    "sum": torch.sum, "mean": torch.mean, "amax": torch.amax, "amin": torch.amin, "prod": torch.prod,
    "std": torch.std, "var": torch.var, "any": torch.any, "all": torch.all, "logsumexp": torch.logsumexp,
    "norm": lambda t, dim, keepdim: torch.linalg.vector_norm(t, dim=dim, keepdim=keepdim),
    "argmax": lambda t, dim, keepdim: torch.argmax(t, dim=dim[0] if dim else None, keepdim=keepdim),
    "max": lambda t, dim, keepdim: torch.max(t, dim=dim[0] if dim else 0, keepdim=keepdim),
}


def case_unary(rng, invalid):
    name = rng.choice(sorted(UNARY))
    x = tensor(rng, shape_of(rng), rng.choice(ALL))
    return Case("unary", UNARY[name], [x], f"{name}({x.words})")


def case_binary(rng, invalid):
    name = rng.choice(sorted(BINARY))
    s = shape_of(rng)
    a = tensor(rng, s, rng.choice(ALL))
    if rng.random() < 0.15:
        b = rng.choice([2, -3, 0.5, True])
        return Case("binary", lambda a: BINARY[name](a, b), [a], f"{name}({a.words}, {b!r})")
    bs = broadcast_partner(rng, s, invalid)
    # (logical_and and where are composite: their output follows the first argument's device)
    host_ok = name not in ("logical_and", "where")
    a = tensor(rng, s, a.base.dtype, host_ok=host_ok) if host_ok and not s else a
    b = tensor(rng, bs, rng.choice(ALL) if rng.random() < 0.4 else a.base.dtype, host_ok=host_ok)
    if rng.random() < 0.5:
        a, b = b, a
    return Case("binary", BINARY[name], [a, b], f"{name}({a.words}, {b.words})")


def case_inplace(rng, invalid):
    name = rng.choice(sorted(INPLACE))
    s = shape_of(rng)
    # (self stays a device tensor: writing a CPU tensor from a device op raises, as on CUDA)
    a = tensor(rng, s, rng.choice(ALL))
    b = tensor(rng, broadcast_partner(rng, s, invalid), rng.choice(ALL), host_ok=True)
    return Case("inplace", lambda a, b: (INPLACE[name](a, b), a)[1], [a, b], f"{name}({a.words}, {b.words})")


def case_reduce(rng, invalid):
    name = rng.choice(sorted(REDUCE))
    s = shape_of(rng)
    x = tensor(rng, s, rng.choice(ALL))
    nd = max(len(s), 1)
    dims = sorted(rng.sample(range(-nd, nd), rng.randint(0, min(2, nd)))) if rng.random() < 0.8 else []
    if len({d % nd for d in dims}) < len(dims):
        dims = dims[:1]
    if invalid:
        dims = [nd + rng.randint(0, 2)]
    keep = rng.random() < 0.5
    fn = REDUCE[name]
    if name in ("argmax", "max", "norm"):
        call = lambda t: fn(t, dims, keep)  # noqa: E731
    else:
        call = lambda t: fn(t, dim=dims, keepdim=keep) if dims else fn(t)  # noqa: E731
    return Case("reduce", call, [x], f"{name}({x.words}, dim={dims}, keepdim={keep})")


def case_matmul(rng, invalid):
    m, k, n, b = (rng.choice(SIZES[:9]) for _ in range(4))
    k2 = k + 1 if invalid else k
    dt = rng.choice([torch.float32, torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.complex64])
    dt2 = dt if rng.random() < 0.85 else rng.choice(ALL)
    kind = rng.choice(["mm", "bmm", "matmul", "addmm", "linear"])
    if kind == "bmm":
        a, c = tensor(rng, [b, m, k], dt), tensor(rng, [b, k2, n], dt2)
        fn = torch.bmm
    elif kind == "matmul":
        lead = [b] if rng.random() < 0.5 else []
        a = tensor(rng, lead + [m, k], dt)
        c = tensor(rng, [k2, n] if rng.random() < 0.5 else [k2], dt2)
        fn = torch.matmul
    elif kind == "addmm":
        bias = tensor(rng, [n] if rng.random() < 0.5 else [m, n], dt)
        a, c = tensor(rng, [m, k], dt), tensor(rng, [k2, n], dt2)
        return Case("matmul", lambda bias, a, c: torch.addmm(bias, a, c, beta=0.5, alpha=2), [bias, a, c],
                    f"addmm({bias.words}, {a.words}, {c.words})")
    elif kind == "linear":
        a, c = tensor(rng, [m, k], dt), tensor(rng, [n, k2], dt2)
        fn = torch.nn.functional.linear
    else:
        a, c = tensor(rng, [m, k], dt), tensor(rng, [k2, n], dt2)
        fn = torch.mm
    return Case("matmul", fn, [a, c], f"{kind}({a.words}, {c.words})")


def case_shape(rng, invalid):
    s = shape_of(rng)
    dt = rng.choice(ALL)
    x = tensor(rng, s, dt)
    nd = len(s)
    numel = 1
    for d in s:
        numel *= d
    kind = rng.choice(["cat", "stack", "reshape", "permute", "narrow", "repeat", "roll", "squeeze", "chunk",
                       "contiguous", "unsqueeze", "t_copy"])
    if kind in ("cat", "stack"):
        d = rng.randint(-max(nd, 1), max(nd, 1) - 1) if nd else 0
        parts = [x]
        for _ in range(rng.randint(1, 3)):
            ps = list(s)
            if kind == "cat" and nd:
                ps[d] = rng.choice([0, 1, 3])
            if invalid and nd:
                ps[(d + 1) % nd] += 1
            parts.append(tensor(rng, ps, rng.choice([dt, dt, rng.choice(ALL)])))
        fn = (lambda *ts: torch.cat(ts, d)) if kind == "cat" else (lambda *ts: torch.stack(ts, d))
        return Case("shape", fn, parts, f"{kind}([{', '.join(p.words for p in parts)}], {d})")
    if kind == "reshape":
        target = [-1] if rng.random() < 0.3 else [numel]
        if nd >= 2 and rng.random() < 0.5:
            target = [s[0], -1] if s[0] else [0, -1 if numel == 0 and rng.random() < 0.5 else 3]
        if invalid:
            target = [numel + 1]
        return Case("shape", lambda t: t.reshape(target), [x], f"reshape({x.words}, {target})")
    if kind == "permute":
        perm = list(range(nd))
        rng.shuffle(perm)
        if invalid and nd:
            perm[0] = nd
        return Case("shape", lambda t: t.permute(perm) * 1, [x], f"permute({x.words}, {perm})")
    if kind == "narrow" and nd:
        d = rng.randrange(nd)
        start = rng.randint(0, s[d])
        length = rng.randint(0, s[d] - start) + (2 if invalid else 0)
        return Case("shape", lambda t: t.narrow(d, start, length).clone(), [x],
                    f"narrow({x.words}, {d}, {start}, {length})")
    if kind == "repeat":
        reps = [rng.choice([1, 2, 3, 0]) for _ in range(nd + rng.randint(0, 1))]
        if invalid:
            reps = reps[:-1] if len(reps) > nd else reps + [-1]
        return Case("shape", lambda t: t.repeat(reps), [x], f"repeat({x.words}, {reps})")
    if kind == "roll" and nd:
        d, shift = rng.randrange(nd), rng.randint(-5, 5)
        return Case("shape", lambda t: t.roll(shift, d), [x], f"roll({x.words}, {shift}, dim {d})")
    if kind == "chunk" and nd:
        n = rng.randint(0 if invalid else 1, 4)
        d = rng.randrange(nd)
        return Case("shape", lambda t: torch.cat(t.chunk(n, d), d) * 1, [x], f"chunk({x.words}, {n}, {d})")
    if kind == "unsqueeze":
        d = rng.randint(-nd - 1, nd) + (nd + 2 if invalid else 0)
        return Case("shape", lambda t: t.unsqueeze(d) + 0, [x], f"unsqueeze({x.words}, {d})")
    if kind == "t_copy" and nd >= 2:
        y = tensor(rng, s[:-2] + [s[-1], s[-2]], rng.choice(ALL))
        return Case("shape", lambda t, u: (u.transpose(-1, -2).copy_(t), u)[1], [x, y],
                    f"copy_ into a transposed view({x.words} -> {y.words})")
    return Case("shape", lambda t: t.contiguous() + 0 if t.dtype != torch.bool else t.contiguous(), [x],
                f"contiguous({x.words})")


def case_index(rng, invalid):
    s = [rng.choice(SIZES[1:]) for _ in range(rng.randint(1, 3))]
    x = tensor(rng, s, rng.choice(ALL))
    nd = len(s)
    d = rng.randrange(nd)
    n = rng.choice([0, 1, 3, 8, 40])
    hi = s[d] + (3 if invalid else 0)
    idx_vals = torch.randint(-s[d] if not invalid else 0, max(hi, 1), (n,),
                             generator=torch.Generator().manual_seed(rng.getrandbits(31)))
    kind = rng.choice(["index_select", "getitem", "gather", "scatter_add_", "index_put_", "mask", "index_add_",
                       "take_along"])
    if kind == "index_select":
        idx = T(idx_vals.clamp(min=0) if not invalid else idx_vals, lambda t: t, f"idx{n}")
        return Case("index", lambda t, i: torch.index_select(t, d, i), [x, idx],
                    f"index_select({x.words}, {d}, {idx_vals.tolist()[:6]})")
    if kind == "getitem":
        idx = T(idx_vals, lambda t: t, f"idx{n}")
        return Case("index", lambda t, i: t[(slice(None),) * d + (i,)], [x, idx],
                    f"{x.words}[dim {d} <- {idx_vals.tolist()[:6]}]")
    if kind in ("gather", "take_along"):
        ishape = list(s)
        ishape[d] = n
        g = torch.Generator().manual_seed(rng.getrandbits(31))
        iv = torch.randint(0, s[d] + (3 if invalid else 0), ishape, generator=g)
        idx = T(iv, lambda t: t, f"idx{ishape}")
        if kind == "gather":
            return Case("index", lambda t, i: torch.gather(t, d, i), [x, idx], f"gather({x.words}, {d}, {ishape})")
        return Case("index", lambda t, i: torch.take_along_dim(t, i, d), [x, idx],
                    f"take_along_dim({x.words}, {ishape}, {d})")
    if kind == "scatter_add_":
        ishape = list(s)
        ishape[d] = n
        g = torch.Generator().manual_seed(rng.getrandbits(31))
        iv = torch.randint(0, s[d] + (3 if invalid else 0), ishape, generator=g)
        src = tensor(rng, ishape, x.base.dtype, layouts=False)
        idx = T(iv, lambda t: t, f"idx{ishape}")
        return Case("index", lambda t, i, u: t.clone().scatter_add_(d, i, u), [x, idx, src],
                    f"scatter_add_({x.words}, {d}, {ishape})")
    if kind == "index_add_":
        vshape = list(s)
        vshape[d] = n
        src = tensor(rng, vshape, x.base.dtype)
        idx = T(idx_vals.clamp(min=0) if not invalid else idx_vals, lambda t: t, f"idx{n}")
        return Case("index", lambda t, i, u: t.clone().index_add_(d, i, u, alpha=2), [x, idx, src],
                    f"index_add_({x.words}, {d}, {vshape})")
    if kind == "index_put_":
        acc = rng.random() < 0.5
        if not acc:
            # Which of several writes to one place wins is undefined (CPU's own runs differ):
            # distinct places only, some of them counted from the end.
            g = torch.Generator().manual_seed(rng.getrandbits(31))
            rows = torch.randperm(s[0], generator=g)[:n]
            idx_vals = torch.where(torch.rand(rows.shape, generator=g) < 0.5, rows - s[0], rows)
            if invalid:
                idx_vals = torch.cat([idx_vals, torch.tensor([s[0] + 2])])
            n = idx_vals.numel()
        idx = T(idx_vals, lambda t: t, f"idx{n}")
        vshape = [n] + s[1:]
        v = tensor(rng, vshape if rng.random() < 0.7 else vshape[1:], x.base.dtype)
        return Case("index", lambda t, i, u: t.clone().index_put_((i,), u, accumulate=acc), [x, idx, v],
                    f"index_put_({x.words}, {idx_vals.tolist()[:6]}, {v.words}, accumulate={acc})")
    mshape = s if not invalid else s[:-1] + [s[-1] + 1]
    m = tensor(rng, mshape, torch.bool, layouts=False)
    return Case("index", lambda t, mk: t[mk], [x, m], f"{x.words}[mask {mshape}]")


FAMILIES = {"unary": case_unary, "binary": case_binary, "inplace": case_inplace, "reduce": case_reduce,
            "matmul": case_matmul, "shape": case_shape, "index": case_index}


def make_case(seed: int, i: int) -> Case:
    rng = random.Random(seed * 1_000_003 + i)
    family = rng.choice(sorted(FAMILIES))
    invalid = rng.random() < 0.15
    case = FAMILIES[family](rng, invalid)
    if invalid:
        case.words += " [invalid]"
    return case


def _flat(out) -> list:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat(o)]
    return [out]


def _run(case: Case, device: str):
    try:
        out = case.fn(*[a.on(device) for a in case.args])
        flat = [o.cpu() if isinstance(o, torch.Tensor) else o for o in _flat(out)]
        if device != "cpu":
            torch.neuron.synchronize()
        return flat, None
    except Exception as e:  # the outcome compared with CPU's
        if device != "cpu":
            try:
                torch.neuron.synchronize()
            except Exception:
                pass
        return None, e


def _differs(a, b) -> Optional[str]:
    if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
        return f"result kinds differ: {type(a).__name__} vs {type(b).__name__}"
    if not isinstance(a, torch.Tensor):
        return None if a == b else f"{a!r} vs {b!r}"
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"cpu {tuple(a.shape)} {a.dtype} vs neuron {tuple(b.shape)} {b.dtype}"
    tol = {torch.bfloat16: 1e-2, torch.float16: 1e-3}.get(a.dtype, 1e-5)
    try:
        torch.testing.assert_close(b, a, rtol=tol, atol=tol, equal_nan=True)
    except AssertionError as e:
        return str(e).splitlines()[0] + " " + " ".join(str(e).splitlines()[1:3])
    return None


def _device_works() -> Optional[str]:
    try:
        x = torch.arange(6, device=DEV, dtype=torch.float32)
        if (x * 2).sum().item() != 30.0:
            return "probe op gave a wrong value"
    except Exception as e:
        return f"probe op raised {type(e).__name__}: {e}"
    return None


def run(seed: int, cases: int, start: int = 0, case_timeout_s: float = 120.0, log=None) -> dict:
    """Runs cases [start, start+cases) of `seed`; returns counts per family and the failures."""
    warnings.simplefilter("ignore")  # (CPU's own warnings: deprecated forms, degrees of freedom)
    stats = {"cases": 0, "cpu_raised": 0, "failures": [], "families": {f: 0 for f in FAMILIES}, "seconds": 0.0}
    t0 = time.perf_counter()
    for i in range(start, start + cases):
        case = make_case(seed, i)
        stats["cases"] += 1
        stats["families"][case.family] += 1
        # A hang is a failure too: print every thread's stack and exit rather than wait forever.
        faulthandler.dump_traceback_later(case_timeout_s, exit=True)
        try:
            ref, ref_err = _run(case, "cpu")
            got, got_err = _run(case, DEV)
        finally:
            faulthandler.cancel_dump_traceback_later()
        problem = None
        if ref_err is not None:
            stats["cpu_raised"] += 1
            if got_err is None:
                problem = f"CPU raised {type(ref_err).__name__} ({str(ref_err)[:160]}), neuron did not"
            elif type(got_err) is not type(ref_err):
                problem = (f"CPU raised {type(ref_err).__name__} ({str(ref_err)[:120]}), neuron raised "
                           f"{type(got_err).__name__} ({str(got_err)[:200]})")
        elif got_err is not None:
            problem = f"neuron raised {type(got_err).__name__}: {str(got_err)[:300]}"
        elif len(ref) != len(got):
            problem = f"{len(ref)} results on CPU, {len(got)} on neuron"
        else:
            for a, b in zip(ref, got):
                problem = problem or _differs(a, b)
        health = _device_works()
        if health:
            problem = (problem + "; " if problem else "") + "device unusable after the case: " + health
        if problem:
            stats["failures"].append({"seed": seed, "index": i, "case": case.words, "problem": problem})
            if log:
                print(f"FAIL seed={seed} index={i} {case.words}: {problem}", file=log, flush=True)
    stats["seconds"] = time.perf_counter() - t0
    return stats


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cases", type=int, default=2000)
    p.add_argument("--start", type=int, default=0, help="first case index (to rerun one: --start N --cases 1)")
    args = p.parse_args()
    s = run(args.seed, args.cases, args.start, log=sys.stdout)
    print(f"seed {args.seed}: {s['cases']} cases ({s['cpu_raised']} where CPU raises) in {s['seconds']:.1f} s; "
          f"{len(s['failures'])} failures; per family {s['families']}")
    sys.exit(1 if s["failures"] else 0)


if __name__ == "__main__":
    main()
