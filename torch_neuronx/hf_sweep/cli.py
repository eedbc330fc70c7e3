"""Command line of the architecture sweep: select tables and architectures, run them on a pool
of worker processes (a crash or hang is reported and the sweep goes on), write JSON and the
Markdown table (``--docs docs/hf_support.md``)."""
import argparse
import fnmatch
import os
import platform
import sys
import time

from ..conformance.runner import progress_printer, run_units, write_outputs
from . import report
from .checks import TABLES, architectures


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m torch_neuronx.hf_sweep", description=__doc__)
    p.add_argument("--tables", default=",".join(TABLES),
                   help=f"comma-separated tables (default: all of {', '.join(TABLES)})")
    p.add_argument("--archs", default="*", help="comma-separated model types or globs (default: all)")
    p.add_argument("--modes", default="eager,compile",
                   help="comma-separated: eager (the model as is), compile (torch.compile(backend='neuron')); "
                        "default both")
    p.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per check before the worker is killed")
    p.add_argument("--out", default="hf_sweep_out", help="directory for results.json, report.md, worker.log")
    p.add_argument("--docs", help="also write the Markdown report here (docs/hf_support.md)")
    p.add_argument("--update", action="store_true",
                   help="rerun only the selected architectures and modes, replacing their results in --out's "
                        "results.json (the rest of the previous run is kept)")
    return p.parse_args(argv)


def build_units(args):
    tables = [t.strip() for t in args.tables.split(",") if t.strip()]
    bad = [t for t in tables if t not in TABLES]
    if bad:
        raise SystemExit(f"unknown table(s) {', '.join(bad)}; choose from {', '.join(TABLES)}")
    pats = [a.strip() for a in args.archs.split(",") if a.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in ("eager", "compile")]
    if bad:
        raise SystemExit(f"unknown mode(s) {', '.join(bad)}; choose from eager, compile")
    return [{"kind": "arch", "name": f"{t}/{a}", "dtype": mode}
            for mode in modes for t in tables for a in architectures(t) if any(fnmatch.fnmatchcase(a, p) for p in pats)]


def main(argv=None):
    args = parse(argv if argv is not None else sys.argv[1:])
    units = build_units(args)
    if not units:
        print("no architecture matches the selection", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    records = []

    def on_result(unit, ev):
        table, _, arch = unit["name"].partition("/")
        records.append({"table": table, "arch": arch, "mode": unit["dtype"], **ev})

    progress = progress_printer("architectures", records, every=15.0)
    print(f"hf_sweep: {len(units)} architectures on {args.jobs} worker(s)", flush=True)
    crashes = run_units(units, args.jobs, args.timeout, on_result, os.path.join(args.out, "worker.log"),
                        progress, worker_module="torch_neuronx.hf_sweep.worker")
    import torch
    import transformers
    meta = {"torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "jobs": args.jobs, "seconds": round(time.time() - t0, 1),
            "crashes": crashes, "modes": args.modes, "date": time.strftime("%Y-%m-%d")}
    if args.update:
        import json

        with open(os.path.join(args.out, "results.json")) as f:
            prev = json.load(f)
        rerun = {(r["table"], r["arch"], r["mode"]) for r in records}
        records = [r for r in prev["results"] if (r["table"], r["arch"], r["mode"]) not in rerun] + records
        meta = {**prev["meta"], "crashes": prev["meta"]["crashes"] + crashes, "date": meta["date"],
                "updated": prev["meta"].get("updated", 0) + len(rerun)}
    records.sort(key=lambda r: (list(TABLES).index(r["table"]), r["arch"], r["mode"] != "eager", r["id"]))
    write_outputs(args.out, meta, records, report.markdown(records, meta), args.docs)
    print(report.summary_text(records))
    return 0
