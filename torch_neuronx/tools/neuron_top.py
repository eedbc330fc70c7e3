"""``neuron-top``: a live view of the simulated NeuronCores: per-core memory, queue
occupancy and kernel throughput of every process using them. ``q`` or Ctrl-C quits."""
import argparse
import json
import os
import select
import sys
import termios
import time
import tty

from .telemetry import fmt_bytes, machine_cores, read_processes


def _key(s):
    return (s.pid, s.start_unix_ns)


def sample(prev, cur):
    """Rates between two reads (``prev``/``cur``: lists of ProcessSample) as a dict."""
    before = {_key(p): p for p in prev}
    num, hbm = machine_cores()
    cores = {c: {"core": c, "capacity": hbm, "reserved": 0, "allocated": 0, "queued": 0,
                 "kernels_per_s": 0.0, "busy": 0.0} for c in range(num)}
    procs = []
    for p in cur:
        old = before.get(_key(p))
        old_cores = {c.index: c for c in old.cores} if old else {}
        dt = (p.time - old.time) if old else 0.0
        for c in p.cores:
            if c.reserved == 0 and c.kernels == 0:
                continue  # a device this process has not used
            o = old_cores.get(c.index)
            rate = (c.kernels - o.kernels) / dt if o and dt > 0 else 0.0
            busy = min(1.0, (c.busy_ns - o.busy_ns) / (dt * 1e9)) if o and dt > 0 else 0.0
            row = {"pid": p.pid, "command": p.command, "device": f"neuron:{c.index}", "core": c.core,
                   "allocated": c.allocated, "reserved": c.reserved, "peak_allocated": c.peak_allocated,
                   "queued": c.queued, "kernels": c.kernels, "kernels_per_s": rate, "busy": busy}
            procs.append(row)
            agg = cores.setdefault(c.core, {"core": c.core, "capacity": c.capacity, "reserved": 0, "allocated": 0,
                                            "queued": 0, "kernels_per_s": 0.0, "busy": 0.0})
            agg["capacity"] = c.capacity
            for k in ("reserved", "allocated", "queued", "kernels_per_s"):
                agg[k] += row[k]
            agg["busy"] = min(1.0, agg["busy"] + busy)
    return {"cores": [cores[k] for k in sorted(cores)], "processes": procs}


def _bar(frac: float, width: int = 20) -> str:
    n = int(round(max(0.0, min(1.0, frac)) * width))
    return "[" + "#" * n + "." * (width - n) + "]"


def render(s) -> str:
    lines = [f"neuron-top  {time.strftime('%H:%M:%S')}  ({len(s['cores'])} simulated NeuronCores, "
             f"{len(s['processes'])} process-device(s))", "",
             f"{'CORE':>4}  {'MEMORY (reserved / capacity)':<45}  {'QUEUED':>6}  {'KERNELS/S':>10}  {'BUSY':>5}"]
    for c in s["cores"]:
        frac = c["reserved"] / c["capacity"] if c["capacity"] else 0.0
        mem = f"{_bar(frac)} {fmt_bytes(c['reserved'])} / {fmt_bytes(c['capacity'])}"
        lines.append(f"{c['core']:>4}  {mem:<45}  {c['queued']:>6}  {c['kernels_per_s']:>10.1f}  {c['busy']:>5.0%}")
    lines += ["", f"{'PID':>7}  {'DEVICE':<9} {'CORE':>4}  {'ALLOCATED':>10}  {'RESERVED':>10}  {'PEAK':>10}  "
                  f"{'QUEUED':>6}  {'KERNELS':>9}  {'KERNELS/S':>10}  {'BUSY':>5}  COMMAND"]
    for p in s["processes"]:
        lines.append(f"{p['pid']:>7}  {p['device']:<9} {p['core']:>4}  {fmt_bytes(p['allocated']):>10}  "
                     f"{fmt_bytes(p['reserved']):>10}  {fmt_bytes(p['peak_allocated']):>10}  {p['queued']:>6}  "
                     f"{p['kernels']:>9}  {p['kernels_per_s']:>10.1f}  {p['busy']:>5.0%}  {p['command'][:60]}")
    if not s["processes"]:
        lines.append("    (no process is using a neuron device)")
    return "\n".join(lines)


def _live(interval: float, iterations: int) -> None:
    interactive = sys.stdin.isatty()
    old = termios.tcgetattr(sys.stdin) if interactive else None
    if interactive:
        tty.setcbreak(sys.stdin.fileno())
    try:
        prev = read_processes()
        n = 0
        while iterations <= 0 or n < iterations:
            ready = select.select([sys.stdin], [], [], interval)[0] if interactive else time.sleep(interval)
            if ready and os.read(sys.stdin.fileno(), 1) in (b"q", b"Q"):
                break
            cur = read_processes()
            sys.stdout.write("\x1b[H\x1b[2J" + render(sample(prev, cur)) + "\n")
            sys.stdout.flush()
            prev = cur
            n += 1
    except KeyboardInterrupt:
        pass
    finally:
        if old is not None:
            termios.tcsetattr(sys.stdin, termios.TCSADRAIN, old)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="neuron-top", description=__doc__)
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    ap.add_argument("--iterations", type=int, default=0, help="stop after N refreshes (default: run until q)")
    ap.add_argument("--json", action="store_true",
                    help="print one sample (rates over --interval) as JSON and exit")
    args = ap.parse_args(argv)
    if args.interval <= 0:
        ap.error(f"--interval must be positive, got {args.interval}")
    if args.json:
        prev = read_processes()
        time.sleep(args.interval)
        print(json.dumps(sample(prev, read_processes()), indent=2))
        return 0
    _live(args.interval, args.iterations)
    return 0


if __name__ == "__main__":
    sys.exit(main())
