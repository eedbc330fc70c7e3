"""Command line of the conformance sweep."""
import argparse
import fnmatch
import os
import platform
import sys
import time

import torch

from . import report
from .runner import progress_printer, run_units, write_outputs

HERE = os.path.dirname(os.path.abspath(__file__))
QUICK_BASELINE = os.path.join(HERE, "quick_baseline.txt")
QUICK_COMPILE_BASELINE = os.path.join(HERE, "quick_compile_baseline.txt")

# The CI subset: common ops across the areas where a backend goes wrong (views, indexing,
# reductions, dtype promotion, scatter/gather, linear algebra, random, convolution, attention).
QUICK_OPS = [
    "add", "sub", "mul", "div.no_rounding_mode", "pow", "abs", "neg", "exp", "log", "sqrt", "sigmoid",
    "tanh", "clamp", "where", "eq", "lt", "logical_and", "bitwise_and", "sum", "mean", "amax", "argmax",
    "var", "cumsum", "softmax", "log_softmax", "mm", "matmul", "bmm", "addmm", "linalg.norm",
    "cat", "stack", "view", "reshape", "permute", "transpose", "expand", "narrow", "select",
    "index_select", "index_add", "index_put", "gather", "scatter", "scatter_add", "masked_fill",
    "masked_select", "nonzero", "unique", "sort", "topk", "flip", "roll", "repeat", "tril",
    "to", "clone", "contiguous", "fill", "zeros_like", "arange", "full", "nn.functional.linear",
    "nn.functional.relu", "nn.functional.gelu", "nn.functional.silu", "nn.functional.layer_norm",
    "nn.functional.embedding", "nn.functional.cross_entropy", "nn.functional.conv2d",
    "nn.functional.scaled_dot_product_attention", "nn.functional.dropout", "bernoulli", "multinomial",
    "randn_like", "item", "as_strided",
]
QUICK_DTYPES = ["float32", "int64", "bool", "bfloat16", "complex64"]
QUICK_SAMPLES = 3


def _select(names, patterns):
    if not patterns:
        return list(names)
    # "div" selects div and its variants (div.trunc_rounding, ...); globs work too.
    return [n for n in names if any(fnmatch.fnmatchcase(n, p) or n.startswith(p + ".") for p in patterns)]


def build_units(args):
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.testing._internal.common_modules import module_db
    from torch.testing._internal.common_optimizers import optim_db

    from .module_checks import module_key
    from .op_checks import op_key
    from .optim_checks import optim_key

    dtypes = set(args.dtypes.split(",")) if args.dtypes else None
    name = lambda d: str(d).replace("torch.", "")  # noqa: E731
    units = []
    kinds = set(args.kinds.split(","))
    ms = args.max_samples
    if "ops" in kinds:
        ops = {op_key(o): o for o in op_db}
        if getattr(args, "compile", False):  # the compile sweep: forward samples through torch.compile
            for key in _select(ops, args.ops):
                for d in sorted(ops[key].supported_dtypes("cpu"), key=str):
                    if dtypes is None or name(d) in dtypes:
                        units.append({"kind": "op", "name": key, "dtype": name(d), "max_samples": ms,
                                      "categories": ["compile"]})
            return units
        quick_ops = set(_select(ops, QUICK_OPS)) if args.quick else set()
        for key in _select(ops, args.ops):
            op = ops[key]
            dts = [name(d) for d in sorted(op.supported_dtypes("cpu"), key=str)]
            if args.quick and key not in quick_ops:
                # Every other op once: float32 (or its first dtype).
                dts = ["float32"] if "float32" in dts else dts[:1]
                for d in dts:
                    units.append({"kind": "op", "name": key, "dtype": d, "max_samples": ms})
                if op.error_inputs_func is not None:
                    units.append({"kind": "op", "name": key, "dtype": "any", "max_samples": ms})
                continue
            for d in dts:
                if dtypes is None or d in dtypes:
                    units.append({"kind": "op", "name": key, "dtype": d, "max_samples": ms})
            if op.error_inputs_func is not None and (dtypes is None or args.quick or "any" in dtypes):
                units.append({"kind": "op", "name": key, "dtype": "any", "max_samples": ms})
    if "modules" in kinds:
        mods = {module_key(m): m for m in module_db}
        for key in _select(mods, args.modules):
            for d in sorted(mods[key].dtypes, key=str):
                if (dtypes is None or name(d) in dtypes) or (args.quick and name(d) == "float32"):
                    units.append({"kind": "module", "name": key, "dtype": name(d), "max_samples": ms})
    if "optims" in kinds:
        opts = {optim_key(o): o for o in optim_db}
        for key in _select(opts, args.optims):
            for d in ("float32", "float64", "complex64"):
                if dtypes is None or d in dtypes:
                    units.append({"kind": "optim", "name": key, "dtype": d, "max_samples": ms})
    return units


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m torch_neuronx.conformance", description=__doc__)
    p.add_argument("--ops", type=lambda s: s.split(","), help="comma-separated OpInfo names or globs (e.g. add,mm,linalg.*)")
    p.add_argument("--modules", type=lambda s: s.split(","), help="comma-separated nn module class names or globs")
    p.add_argument("--optims", type=lambda s: s.split(","), help="comma-separated optimizer class names or globs")
    p.add_argument("--kinds", default="ops,modules,optims", help="which databases to sweep (default: all three)")
    p.add_argument("--dtypes", help="comma-separated dtypes, e.g. float32,int64 (default: every dtype CPU supports)")
    p.add_argument("--max-samples", type=int, help="at most this many samples per op, dtype and category")
    p.add_argument("--quick", action="store_true",
                   help=f"the CI subset: {QUICK_SAMPLES} samples of every op, module and optimizer at float32, "
                        f"and of {len(QUICK_OPS)} common ops at {','.join(QUICK_DTYPES)}; checked against the "
                        "committed baseline")
    p.add_argument("--compile", action="store_true",
                   help="the compile sweep: every op sample through torch.compile(backend='neuron') against eager "
                        "CPU (ops only; combine with --quick for float32 and 3 samples per op)")
    p.add_argument("--jobs", "-j", type=int, default=os.cpu_count() or 1, help="worker processes")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one case may run before its worker is killed")
    p.add_argument("--out", default="conformance-results", help="directory for results.json, report.md and worker.log")
    p.add_argument("--docs", help="also write the Markdown report here (docs/op_support.md for the full sweep)")
    p.add_argument("--baseline", help="fail if any case listed in this file (one id per line) does not pass "
                                      "(default with --quick: the packaged quick baseline)")
    p.add_argument("--write-baseline", help="write the ids of all passing cases to this file")
    p.add_argument("--case", help="run one case in this process and show its sample and traceback "
                                  "(an id from results.json, e.g. 'add|float32|out|3')")
    args = p.parse_args(argv)
    if args.compile:
        args.kinds = "ops"
        if args.quick:  # float32 only: the compiler's own paths, not every dtype again
            args.dtypes = args.dtypes or "float32"
            args.max_samples = args.max_samples or QUICK_SAMPLES
            if args.baseline is None and args.write_baseline is None:
                args.baseline = QUICK_COMPILE_BASELINE
    if args.quick:
        args.dtypes = args.dtypes or ",".join(QUICK_DTYPES)
        args.max_samples = args.max_samples or QUICK_SAMPLES
        if args.baseline is None and args.write_baseline is None:
            args.baseline = QUICK_BASELINE
    return args


def show_case(case_id):
    """Run one case in-process, printing the sample and the full traceback."""
    import traceback

    from .worker import Registry
    reg = Registry()
    name, dtype = case_id.split("|")[:2]
    kind = "op" if name in reg.ops else "module" if name in reg.modules else "optim"
    for cid, cat, thunk in reg.cases({"kind": kind, "name": name, "dtype": dtype}):
        if cid != case_id:
            continue
        closure = dict(zip(thunk.__code__.co_freevars, (c.cell_contents for c in thunk.__closure__ or ())))
        for v in closure.values():
            if hasattr(v, "summary"):
                print("sample:", v.summary())
        try:
            print("result:", thunk())
            return 0
        except Exception:
            traceback.print_exc()
            return 1
    print(f"no case {case_id!r}", file=sys.stderr)
    return 2


def main(argv=None):
    args = parse(argv if argv is not None else sys.argv[1:])
    if args.case:
        return show_case(args.case)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    units = build_units(args)
    if not units:
        print("no op, module or optimizer matches the selection", file=sys.stderr)
        return 2
    records = []

    def on_result(unit, ev):
        records.append({"kind": unit["kind"], "name": unit["name"], "dtype": unit["dtype"], **ev})

    progress = progress_printer("units", records)
    print(f"conformance: {len(units)} units on {args.jobs} worker(s)", flush=True)
    crashes = run_units(units, args.jobs, args.timeout, on_result, os.path.join(args.out, "worker.log"), progress)
    elapsed = time.time() - t0
    meta = {"torch": torch.__version__, "python": platform.python_version(), "jobs": args.jobs,
            "seconds": round(elapsed, 1), "crashes": crashes, "quick": args.quick,
            "argv": argv if argv is not None else sys.argv[1:], "date": time.strftime("%Y-%m-%d")}
    records.sort(key=lambda r: (r["kind"], r["name"], r["dtype"] or "", r["id"]))
    write_outputs(args.out, meta, records, report.markdown(records, meta), args.docs)
    print(report.summary_text(records, meta))
    if args.write_baseline:
        with open(args.write_baseline, "w") as f:
            f.write("".join(r["id"] + "\n" for r in records if r["outcome"] == "pass"))
        print(f"wrote {sum(r['outcome'] == 'pass' for r in records)} passing case ids to {args.write_baseline}")
    rc = 0
    if crashes:
        print(f"FAIL: {crashes} worker crash(es) or timeout(s); see {args.out}/worker.log")
        rc = 1
    if args.baseline:
        with open(args.baseline) as f:
            expected = {line.strip() for line in f if line.strip()}
        outcome = {r["id"]: r for r in records}
        regressed = sorted(i for i in expected if outcome.get(i, {}).get("outcome") != "pass")
        if regressed:
            print(f"FAIL: {len(regressed)} baseline case(s) no longer pass:")
            for i in regressed[:50]:
                r = outcome.get(i)
                print(f"  {i}: {r['outcome'] + ': ' + str(r['detail']) if r else 'not run'}")
            rc = 1
        else:
            print(f"baseline: all {len(expected)} cases in {os.path.relpath(args.baseline)} pass")
    return rc
