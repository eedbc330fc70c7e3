"""``neuron-ls``: the simulated NeuronCores of this machine, their memory, and the
processes holding memory on them."""
import argparse
import json
import sys

from .telemetry import fmt_bytes, machine_cores, read_processes


def collect():
    """The listing as a dict (what ``--json`` prints)."""
    num, hbm = machine_cores()
    cores = {c: {"core": c, "capacity": hbm, "allocated": 0, "reserved": 0, "processes": []} for c in range(num)}
    for p in read_processes():
        for c in p.cores:
            entry = cores.setdefault(c.core, {"core": c.core, "capacity": c.capacity, "allocated": 0,
                                              "reserved": 0, "processes": []})
            entry["capacity"] = c.capacity
            entry["allocated"] += c.allocated
            entry["reserved"] += c.reserved
            if c.reserved or c.allocated:
                entry["processes"].append({"pid": p.pid, "command": p.command, "device": f"neuron:{c.index}",
                                           "allocated": c.allocated, "reserved": c.reserved,
                                           "peak_allocated": c.peak_allocated})
    return {"simulated": True, "cores": [cores[k] for k in sorted(cores)]}


def render(info) -> str:
    lines = [f"{len(info['cores'])} NeuronCore(s) (simulated)", "",
             f"{'CORE':>4}  {'CAPACITY':>10}  {'RESERVED':>10}  {'ALLOCATED':>10}  PROCESSES"]
    for c in info["cores"]:
        procs = ", ".join(f"{p['pid']} ({p['device']}, {fmt_bytes(p['reserved'])}) {p['command'][:40]}"
                          for p in c["processes"]) or "-"
        lines.append(f"{c['core']:>4}  {fmt_bytes(c['capacity']):>10}  {fmt_bytes(c['reserved']):>10}  "
                     f"{fmt_bytes(c['allocated']):>10}  {procs}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="neuron-ls", description=__doc__)
    ap.add_argument("--json", action="store_true", help="print the listing as JSON")
    args = ap.parse_args(argv)
    info = collect()
    print(json.dumps(info, indent=2) if args.json else render(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
