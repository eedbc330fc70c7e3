"""The parent side of the sweep: a pool of worker processes fed one unit at a time, with crash
and hang recovery (the case in flight is reported as an error and the unit resumes after it)."""
import json
import os
import selectors
import signal
import subprocess
import sys
import time


class Worker:
    def __init__(self, log, module):
        r, w = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, str(w)],
            stdin=subprocess.PIPE, stdout=log, stderr=log, pass_fds=(w,), text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"})
        os.close(w)
        self.events = os.fdopen(r, "r")
        self.buf = ""
        self.ready = False
        self.unit = None
        self.seen = 0
        self.inflight = None
        self.deadline = None

    def send(self, unit, timeout):
        self.unit, self.seen, self.inflight = unit, unit.get("skip", 0), None
        self.deadline = time.monotonic() + timeout
        self.proc.stdin.write(json.dumps(unit) + "\n")
        self.proc.stdin.flush()

    def kill(self):
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.events.close()


def progress_printer(what, records, every=10.0):
    """A ``progress`` callback for ``run_units`` printing ``done/total <what>`` at most every
    ``every`` seconds (and at the end), with the number of case results so far."""
    t0, last = time.time(), [0.0]

    def progress(done, total):
        if time.time() - last[0] > every or done == total:
            last[0] = time.time()
            print(f"  {done}/{total} {what}, {len(records)} cases, {time.time() - t0:.0f} s", flush=True)
    return progress


def write_outputs(out_dir, meta, records, markdown, docs=None):
    """Write results.json and report.md under ``out_dir`` (and the report to ``docs``)."""
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"meta": meta, "results": records}, f)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(markdown)
    if docs:
        # The upstream test files' table (conformance.upstream) lives in the same document.
        from .upstream import keep_section

        text = keep_section(docs_text=_read(docs), markdown=markdown)
        with open(docs, "w") as f:
            f.write(text)


def _read(path):
    return open(path).read() if os.path.exists(path) else ""


def run_units(units, jobs, timeout, on_result, log_path=os.devnull, progress=None,
              worker_module="torch_neuronx.conformance.worker"):
    """Run ``units`` on ``jobs`` workers; ``on_result(unit, record)`` receives every case result.
    ``worker_module`` is the worker's ``python -m`` name (it speaks ``worker.serve``'s protocol)."""
    pending = list(units)
    total = len(pending)
    log = open(log_path, "a")
    sel = selectors.DefaultSelector()
    workers = []
    crashes = 0
    done_units = 0

    def spawn():
        w = Worker(log, worker_module)
        sel.register(w.events, selectors.EVENT_READ, w)
        workers.append(w)
        return w

    def feed(w):
        if pending:
            w.send(pending.pop(0), timeout)
        else:
            w.unit = None

    def fail_inflight(w, why):
        nonlocal crashes
        crashes += 1
        u = w.unit
        cid = w.inflight or f"{u['name']}|{u.get('dtype')}|case|{w.seen + 1}"
        on_result(u, {"id": cid, "cat": cid.split("|")[2] if cid.count("|") >= 2 else "case",
                      "outcome": "error", "detail": why, "max_error": None, "bitwise": None, "secs": None})
        # Resume the unit after the case that killed the worker; give up on a unit that keeps
        # dying before it reports anything (its sample generation itself crashes).
        stuck = u.get("stuck", 0) + 1 if w.seen == u.get("skip", 0) else 0
        if stuck < 3:
            pending.insert(0, {**u, "skip": w.seen + 1, "stuck": stuck})

    for _ in range(min(jobs, len(pending)) or 1):
        spawn()
    while any(w.unit is not None or not w.ready for w in workers) or pending:
        for key, _ in sel.select(timeout=1.0):
            w = key.data
            chunk = os.read(w.events.fileno(), 1 << 16).decode()
            if not chunk:  # the worker died
                sel.unregister(w.events)
                rc = w.proc.wait()
                why = f"worker process died ({'signal ' + signal.Signals(-rc).name if rc < 0 else 'exit ' + str(rc)})"
                if w.unit is not None:
                    fail_inflight(w, why)
                elif not w.ready:
                    raise RuntimeError(f"sweep worker failed to start ({why}); see {log_path}")
                workers.remove(w)
                w.events.close()
                spawn()
                continue
            w.buf += chunk
            *lines, w.buf = w.buf.split("\n")
            for line in lines:
                ev = json.loads(line)
                if ev["t"] == "ready":
                    w.ready = True
                    feed(w)
                elif ev["t"] == "start":
                    w.inflight = ev["id"]
                    w.deadline = time.monotonic() + timeout
                elif ev["t"] == "res":
                    w.seen += 1
                    w.inflight = None
                    on_result(w.unit, ev)
                elif ev["t"] == "done":
                    done_units += 1
                    if progress:
                        progress(done_units, total)
                    feed(w)
        now = time.monotonic()
        for w in list(workers):
            if w.unit is not None and w.deadline is not None and now > w.deadline:
                sel.unregister(w.events)
                fail_inflight(w, f"timed out after {timeout:.0f} s (worker killed)")
                w.kill()
                workers.remove(w)
                spawn()
        if not pending and all(w.unit is None and w.ready for w in workers):
            break
    for w in workers:
        w.proc.stdin.close()
        w.proc.wait()
    log.close()
    return crashes
