"""A conformance worker process: runs units (one op/module/optimizer at one dtype) sent as JSON
lines on stdin and reports each case on a private pipe, announcing a case before running it so
the parent can name the case that killed the process."""
import json
import os
import sys
import time
import traceback

import torch

from . import module_checks, op_checks, optim_checks
from .compare import Mismatch
from .op_checks import Outcome


def _dtype(name):
    return None if name in (None, "any") else getattr(torch, name)


class Registry:
    """Name → OpInfo / ModuleInfo / OptimizerInfo, loaded once per process."""

    def __init__(self):
        from torch.testing._internal.common_methods_invocations import op_db
        from torch.testing._internal.common_modules import module_db
        from torch.testing._internal.common_optimizers import optim_db

        self.ops = {op_checks.op_key(o): o for o in op_db}
        self.modules = {module_checks.module_key(m): m for m in module_db}
        self.optims = {optim_checks.optim_key(o): o for o in optim_db}

    def cases(self, unit):
        kind, name, dtype, ms = unit["kind"], unit["name"], _dtype(unit.get("dtype")), unit.get("max_samples")
        if kind == "op":
            return op_checks.cases(self.ops[name], dtype, ms, tuple(unit.get("categories") or op_checks.CATEGORIES))
        if kind == "module":
            return module_checks.cases(self.modules[name], dtype, ms)
        return optim_checks.cases(self.optims[name], dtype, ms)


def run_case(thunk):
    """Run one check; return (outcome, detail, max_error, bitwise)."""
    try:
        bitwise, note = thunk()
        return "pass", note, None, bool(bitwise)
    except Outcome as o:
        return o.outcome, o.detail, None, None
    except Mismatch as m:
        return "fail", str(m)[:500], m.max_error, None
    except Exception as e:
        tb = traceback.extract_tb(e.__traceback__)
        where = f" [{os.path.basename(tb[-1].filename)}:{tb[-1].lineno}]" if tb else ""
        msg = (str(e).strip().splitlines() or [""])[0]
        return "error", f"{type(e).__name__}: {msg[:300]}{where}", None, None


def _fault():
    # Test hook: "crash:<case id>" or "hang:<case id>" makes this worker die or stall at that case,
    # to prove the parent reports it and carries on.
    kind, _, cid = os.environ.get("_TORCH_NEURONX_CONFORMANCE_FAULT", "").partition(":")
    return kind, cid


def serve(make_registry):
    """The worker loop: ``make_registry()`` returns an object whose ``cases(unit)`` yields
    ``(case_id, category, thunk)``; each thunk returns ``(bitwise, note)`` or raises."""
    out = os.fdopen(int(sys.argv[1]), "w", buffering=1)
    fault, fault_id = _fault()
    reg = make_registry()
    out.write(json.dumps({"t": "ready"}) + "\n")
    for line in sys.stdin:
        unit = json.loads(line)
        skip = unit.get("skip", 0)
        n = 0
        try:
            for cid, cat, thunk in reg.cases(unit):
                n += 1
                if n <= skip:
                    continue
                out.write(json.dumps({"t": "start", "id": cid}) + "\n")
                if cid == fault_id:
                    if fault == "crash":
                        os.abort()
                    if fault == "hang":
                        time.sleep(3600)
                t0 = time.perf_counter()
                outcome, detail, err, bitwise = run_case(thunk)
                out.write(json.dumps({"t": "res", "id": cid, "cat": cat, "outcome": outcome, "detail": detail,
                                      "max_error": err, "bitwise": bitwise,
                                      "secs": round(time.perf_counter() - t0, 4)}) + "\n")
        except Exception as e:  # generating samples failed: the rest of the unit is one error
            cid = f"{unit['name']}|{unit.get('dtype')}|samples|{n}"
            out.write(json.dumps({"t": "res", "id": cid, "cat": "samples", "outcome": "error",
                                  "detail": f"generating cases: {type(e).__name__}: {str(e)[:300]}",
                                  "max_error": None, "bitwise": None, "secs": 0}) + "\n")
        out.write(json.dumps({"t": "done"}) + "\n")


if __name__ == "__main__":
    serve(Registry)
