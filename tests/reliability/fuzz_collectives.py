"""Collective fuzzer: seeded random collectives across 2-3 ranks on the `neuron` c10d backend.

Every rank draws the same cases: an op (all_reduce, reduce, broadcast, all_gather, all_gather_into_tensor,
reduce_scatter_tensor, all_to_all_single with random splits), a dtype (float32/64, float16, bfloat16,
int8/32/64, uint8, bool), a size (0 and sizes past the transport's chunking included) and a reduce
op valid for the dtype, and in 10% of cases an invalid argument (an output of the wrong size, a
bitwise reduction of floats, a root out of range, splits that do not add up). Each rank knows every
rank's input (seeded), so the expected result is computed locally: values must match (exactly for
integers, min/max and data movement; to the dtype's rounding for floating sums and products), an
invalid case must raise on every rank, and after every case a probe all_reduce checks the group
still works. A hang is caught by the group's timeout.

    python tests/reliability/fuzz_collectives.py --world 3 --cases 2000 --seed 1

Starts its ranks itself; exits 1 with the failures (seed and index reproduce a case).
"""
import argparse
import os
import random
import sys
import time

import torch
import torch.distributed as dist

import torch_neuronx  # noqa: F401

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ranks  # noqa: E402

R = dist.ReduceOp
OPS = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
       "all_to_all_single")
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int32, torch.int64,
          torch.uint8, torch.bool)
SIZES = (0, 1, 3, 1000, 65_537, 1 << 20)
REDUCING = {"all_reduce", "reduce", "reduce_scatter_tensor"}
TOL = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-12, 1e-12), torch.float16: (1e-2, 1e-2),
       torch.bfloat16: (2e-2, 5e-2)}


def reduce_ops(dtype):
    if dtype == torch.bool:
        return [R.MIN, R.MAX]
    if dtype.is_floating_point:
        return [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.AVG]
    return [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR]


def make_case(seed, i, world):
    rng = random.Random(seed * 1_000_003 + i)
    op, dtype = rng.choice(OPS), rng.choice(DTYPES)
    n = rng.choice(SIZES) if rng.random() < 0.5 else rng.randint(1, 5000)
    case = {"index": i, "op": op, "dtype": str(dtype).replace("torch.", ""), "n": n, "root": rng.randrange(world),
            "reduce": None, "invalid": None, "splits": None}
    if op in REDUCING:
        case["reduce"] = rng.choice(reduce_ops(dtype))
    if op == "all_to_all_single":  # splits[r][j]: what rank r sends to rank j
        case["splits"] = [[rng.choice((0, 1, 2, 5, 300)) for _ in range(world)] for _ in range(world)]
    if rng.random() < 0.1:
        kinds = ["root"] if op in ("reduce", "broadcast") else []
        if op in ("all_gather_into_tensor", "reduce_scatter_tensor"):
            kinds.append("size")
        if op == "all_to_all_single":
            kinds.append("splits")
        if op in REDUCING and dtype.is_floating_point:
            kinds.append("bitwise")
        if kinds:
            case["invalid"] = rng.choice(kinds)
            if case["invalid"] == "bitwise":
                case["reduce"] = rng.choice([R.BAND, R.BOR, R.BXOR])
    return case


def data(seed, case, rank, n=None):
    n = case["n"] if n is None else n
    g = torch.Generator().manual_seed(seed * 7919 + case["index"] * 31 + rank)
    dtype = getattr(torch, case["dtype"])
    if dtype == torch.bool:
        return torch.rand(n, generator=g) < 0.5
    if dtype.is_floating_point:
        return torch.randn(n, generator=g, dtype=torch.float64).to(dtype)
    lo = 0 if dtype == torch.uint8 else -3  # small values: products of 3 ranks do not overflow
    return torch.randint(lo, 4, (n,), generator=g, dtype=torch.int64).to(dtype)


def combine(xs, op):
    """The reduction of the ranks' tensors, computed in float64 (or int64) from rank 0 up."""
    wide = torch.float64 if xs[0].dtype.is_floating_point else torch.int64
    ys = [x.to(wide) for x in xs]
    out = ys[0].clone()
    for y in ys[1:]:
        if op in (R.SUM, R.AVG):
            out = out + y
        elif op == R.PRODUCT:
            out = out * y
        elif op == R.MIN:
            out = torch.minimum(out, y)
        elif op == R.MAX:
            out = torch.maximum(out, y)
        elif op == R.BAND:
            out = out & y
        elif op == R.BOR:
            out = out | y
        elif op == R.BXOR:
            out = out ^ y
    if op == R.AVG:
        out = out / len(xs)
    return out.to(xs[0].dtype)


def run_case(seed, case, rank, world, dev):
    """(got, want) per output tensor on this rank; raises what the collective raises."""
    op, n, root = case["op"], case["n"], case["root"]
    if case["invalid"] == "root":
        root = world + 1
    ins = [data(seed, case, r) for r in range(world)]
    mine = ins[rank].to(dev)
    if op == "all_reduce":
        dist.all_reduce(mine, op=case["reduce"])
        return [(mine, combine(ins, case["reduce"]))]
    if op == "reduce":
        dist.reduce(mine, dst=root, op=case["reduce"])
        return [(mine, combine(ins, case["reduce"]))] if rank == root else []
    if op == "broadcast":
        dist.broadcast(mine, src=root)
        return [(mine, ins[root])]
    if op == "all_gather":
        outs = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(outs, mine)
        return list(zip(outs, ins))
    if op == "all_gather_into_tensor":
        out = torch.empty(world * n + (1 if case["invalid"] == "size" else 0), dtype=mine.dtype, device=dev)
        dist.all_gather_into_tensor(out, mine)
        return [(out, torch.cat(ins))]
    if op == "reduce_scatter_tensor":
        full = [data(seed, case, r, world * n) for r in range(world)]
        out = torch.empty(n + (1 if case["invalid"] == "size" else 0), dtype=mine.dtype, device=dev)
        dist.reduce_scatter_tensor(out, full[rank].to(dev), op=case["reduce"])
        return [(out, combine([f[rank * n:(rank + 1) * n] for f in full], case["reduce"]))]
    if op == "all_to_all_single":
        s = case["splits"]
        send = [s[rank][j] for j in range(world)]
        recv = [s[i][rank] for i in range(world)]
        if case["invalid"] == "splits":
            recv[rank] += 1  # expects one element more from itself than it sends itself: every rank sees it
        full = [data(seed, case, r, sum(s[r])) for r in range(world)]
        out = torch.empty(sum(recv), dtype=mine.dtype, device=dev)
        dist.all_to_all_single(out, full[rank].to(dev), recv, send)
        offs = [[sum(s[i][:j]) for j in range(world)] for i in range(world)]
        want = torch.cat([full[i][offs[i][rank]:offs[i][rank] + s[i][rank]] for i in range(world)])
        return [(out, want)]
    raise ValueError(op)


def check(case, pairs):
    dtype = getattr(torch, case["dtype"])
    for got, want in pairs:
        got = got.cpu()
        if got.shape != want.shape or got.dtype != want.dtype:
            return f"shape/dtype {tuple(got.shape)} {got.dtype}, expected {tuple(want.shape)} {want.dtype}"
        exact = not dtype.is_floating_point or case["op"] not in REDUCING or case["reduce"] in (R.MIN, R.MAX)
        if exact:
            if not torch.equal(got, want):
                return f"values differ at {(got != want).nonzero()[:3].flatten().tolist()}"
        else:
            rtol, atol = TOL[dtype]
            try:
                torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
            except AssertionError as e:
                return str(e).split("\n")[1] if "\n" in str(e) else str(e)
    return None


def fuzz(seed, cases, rank, world, dev):
    failures, raised_cases, t0 = [], 0, time.perf_counter()
    for i in range(cases):
        case = make_case(seed, i, world)
        if os.environ.get("FUZZ_TRACE"):
            print(f"[rank {rank}] case {i}: {case}", file=sys.stderr, flush=True)
        problem, raised = None, 0
        try:
            problem = check(case, run_case(seed, case, rank, world, dev))
            if case["invalid"]:
                problem = f"invalid ({case['invalid']}) but no error"
        except Exception as e:  # noqa: BLE001
            raised = 1
            if os.environ.get("FUZZ_TRACE"):
                print(f"[rank {rank}] case {i} raised {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            if not case["invalid"]:
                problem = f"raised {type(e).__name__}: {str(e).splitlines()[0][:300]}"
        # Every rank raised, or none did; and the group still works.
        try:
            flag = torch.tensor([float(raised), 1.0], device=dev)
            dist.all_reduce(flag)
            flag = flag.cpu().tolist()
        except Exception as e:  # noqa: BLE001  (the group is broken: report and stop)
            failures.append({"index": i, "case": {k: str(v) for k, v in case.items()},
                             "problem": problem or f"probe all_reduce raised {type(e).__name__}: {str(e)[:300]}"})
            break
        if flag[1] != world:
            problem = problem or f"probe all_reduce gave {flag[1]}, expected {world}"
        elif flag[0] not in (0, world):
            problem = problem or f"{int(flag[0])} of {world} ranks raised"
        raised_cases += raised
        if problem:
            failures.append({"index": i, "case": {k: str(v) for k, v in case.items()}, "problem": problem})
    return {"rank": rank, "world": world, "seed": seed, "cases": cases, "raised": raised_cases,
            "seconds": time.perf_counter() - t0, "failures": failures}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=3)
    p.add_argument("--cases", type=int, default=2000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", help="write each rank's report to OUT.rank<r> (JSON)")
    args = p.parse_args()
    if "RANK" not in os.environ:
        codes = ranks.launch(__file__, sys.argv[1:], args.world)
        print(f"ranks exited {codes}")
        raise SystemExit(0 if not any(codes) else 1)
    rank, world, dev = ranks.join_group(60)
    report = fuzz(args.seed, args.cases, rank, world, dev)
    ranks.finish(report, args.out,
                 f"seed {args.seed}: {report['cases']} cases ({report['raised']} raised as expected or not) in "
                 f"{report['seconds']:.0f} s, {len(report['failures'])} failures",
                 [f"case {f['index']}: {f['case']}: {f['problem']}" for f in report["failures"]])

if __name__ == "__main__":
    main()
