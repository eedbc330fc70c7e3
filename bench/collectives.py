"""Collective bandwidth side by side: the `neuron` c10d backend (neuron tensors) against Gloo on
CPU tensors, in the same two processes, interleaved, medians over repetitions.

    python bench/collectives.py                 # 4 KB .. 256 MB, writes bench/results/collectives-<date>.json
    python bench/collectives.py --quick         # 4 KB .. 1 MB, 2 repetitions (harness smoke test)
    python bench/collectives.py --control       # also Gloo against a second, identical Gloo group
    python bench/collectives.py --gloo-path     # also neuron with peer access off (the path between hosts)

Each timed sample issues `iters` asynchronous collectives back to back, cycling over a few distinct
buffers (as DDP's gradient buckets are), and waits for all of them (for neuron, then synchronizes the
device): algorithm bandwidth = bytes per rank / time per op. Distinct buffers keep the comparison
honest: Gloo runs queued collectives on the same tensor concurrently (racing on its memory), which
the neuron backend does not (a collective waits for earlier ones on overlapping memory).

`--gloo-path` adds a second `neuron` group with peer access off (TORCH_NEURONX_DIST_PEER_ACCESS=0):
every byte over Gloo, as between hosts, where ranks on one host otherwise read and write each
other's device memory directly.

`--control` adds a null comparison: a second Gloo group, identical to the first (its own
connections), measured in the same interleaving. Its ratio to the first would be 1.00 on a quiet
machine; how far it strays is the noise of the method, the margin a neuron ratio must clear before
it means anything.
"""
import argparse
import datetime
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import time

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
OPS = ("all_reduce", "all_gather_into_tensor")


def _iters(nbytes):
    # About 256 MB per sample (a quarter second or more): shorter samples on this shared 2-core
    # machine varied by 30% from one repetition to the next.
    return max(2, min(1000, (256 << 20) // nbytes))


def _buffers(nbytes):
    return 4 if nbytes <= (64 << 20) else 2


def rank_main(args):
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    torch.neuron.set_device(rank)
    # No device_id: PyTorch's new_group would look for a neuron backend in the Gloo group.
    dist.init_process_group("neuron")
    gloo = dist.new_group(backend="gloo")
    control = dist.new_group(backend="gloo") if args.control else None
    gloo_path = None
    if args.gloo_path:  # the setting is read when a group is created
        os.environ["TORCH_NEURONX_DIST_PEER_ACCESS"] = "0"
        gloo_path = dist.new_group(backend="neuron")
        del os.environ["TORCH_NEURONX_DIST_PEER_ACCESS"]
    modes = (("gloo_cpu", "neuron") + (("neuron_gloo_path",) if args.gloo_path else ())
             + (("gloo_cpu_control",) if args.control else ()))
    world = dist.get_world_size()
    sizes = [s for s in SIZES if s <= (1 << 20)] if args.quick else SIZES
    if args.sizes:
        sizes = [s for s in sizes if s in args.sizes]
    reps = 2 if args.quick else args.reps
    rows = []
    for op in args.ops or OPS:
        for nbytes in sizes:
            n = nbytes // 4
            bufs = {}
            for mode in modes:
                dev = "neuron" if mode.startswith("neuron") else "cpu"
                bufs[mode] = [(torch.ones(n, device=dev),
                               torch.empty(n * world, device=dev) if op == "all_gather_into_tensor" else None)
                              for _ in range(_buffers(nbytes))]

            def run(mode, iters):
                group = {"gloo_cpu": gloo, "gloo_cpu_control": control, "neuron_gloo_path": gloo_path}.get(mode)
                t0 = time.perf_counter()
                works = []
                for i in range(iters):
                    x, out = bufs[mode][i % len(bufs[mode])]
                    if op == "all_reduce":
                        works.append(dist.all_reduce(x, group=group, async_op=True))
                    else:
                        works.append(dist.all_gather_into_tensor(out, x, group=group, async_op=True))
                for w in works:
                    w.wait()
                if mode.startswith("neuron"):
                    torch.neuron.synchronize()
                return (time.perf_counter() - t0) / iters

            iters = _iters(nbytes)
            # Warm-up: one whole sample each. The kernel grows a TCP connection's buffers as it
            # carries more data, and a cold connection costs twice the CPU per byte.
            for mode in bufs:
                run(mode, iters)
            times = {m: [] for m in bufs}
            for _ in range(reps):  # interleaved
                for mode in bufs:
                    dist.barrier(group=gloo)
                    times[mode].append(run(mode, iters))
            med = {m: statistics.median(v) for m, v in times.items()}
            # every rank's medians: report the slowest rank (a collective is as fast as its slowest member)
            all_med = [None] * world
            dist.all_gather_object(all_med, med, group=gloo)
            worst = {m: max(r[m] for r in all_med) for m in med}
            row = {"op": op, "bytes": nbytes, "iters": iters,
                   "gloo_cpu_GBps": nbytes / worst["gloo_cpu"] / 1e9,
                   "neuron_GBps": nbytes / worst["neuron"] / 1e9,
                   "ratio": worst["gloo_cpu"] / worst["neuron"],
                   "samples_ms": {m: [round(t * 1e3, 4) for t in times[m]] for m in times}}
            if args.gloo_path:
                row["gloo_path_ratio"] = worst["gloo_cpu"] / worst["neuron_gloo_path"]
            if args.control:
                row["control_ratio"] = worst["gloo_cpu"] / worst["gloo_cpu_control"]
            rows.append(row)
            if rank == 0:
                control_note = f"  (peer access off {row['gloo_path_ratio']:.2f})" if args.gloo_path else ""
                control_note += f"  (Gloo / Gloo control {row['control_ratio']:.2f})" if args.control else ""
                print(f"{op:24s} {nbytes:>11d} B  gloo {row['gloo_cpu_GBps']:8.3f} GB/s  neuron {row['neuron_GBps']:8.3f} GB/s"
                      f"  ratio {row['ratio']:.2f}{control_note}", flush=True)
    if rank == 0:
        with open(args.result, "w") as f:
            json.dump({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "world_size": world, "repetitions": reps, "rows": rows}, f, indent=1)
    dist.destroy_process_group()


def markdown(result):
    extra = [(key, title) for key, title in (("gloo_path_ratio", "neuron, peer access off / Gloo"),
                                             ("control_ratio", "Gloo / Gloo (control)"))
             if all(key in r for r in result["rows"])]
    head = "| collective | size | Gloo CPU GB/s | neuron GB/s | neuron / Gloo |" + "".join(f" {t} |" for _, t in extra)
    lines = [head, "|---|---|---|---|---|" + "---|" * len(extra)]
    for r in result["rows"]:
        size = f"{r['bytes'] >> 20} MB" if r["bytes"] >= 1 << 20 else f"{r['bytes'] >> 10} KB"
        line = f"| {r['op']} | {size} | {r['gloo_cpu_GBps']:.3f} | {r['neuron_GBps']:.3f} | {r['ratio']:.2f}x |"
        lines.append(line + "".join(f" {r[key]:.2f}x |" for key, _ in extra))
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="4 KB .. 1 MB, 2 repetitions")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", default=None, help="result JSON (default bench/results/collectives-<date>.json)")
    p.add_argument("--docs", action="store_true", help="write the table into docs/distributed.md")
    p.add_argument("--sizes", type=lambda v: [int(x) << 10 for x in v.split(",")], default=None,
                   help="only these sizes, in KB, comma-separated (e.g. 1024,16384)")
    p.add_argument("--ops", type=lambda v: v.split(","), default=None, help=f"only these of {','.join(OPS)}")
    p.add_argument("--control", action="store_true",
                   help="also measure Gloo against a second, identical Gloo group (the method's noise)")
    p.add_argument("--gloo-path", action="store_true",
                   help="also measure a neuron group with peer access off (every byte over Gloo, as between hosts)")
    p.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args()
    unknown = [f"{s >> 10} KB" for s in sorted(set(args.sizes or []) - set(SIZES))] + sorted(set(args.ops or []) - set(OPS))
    if unknown:
        p.error(f"not measured by this bench: {unknown}; sizes are {[s >> 10 for s in SIZES]} KB, ops {list(OPS)}")
    if args.rank_main:
        return rank_main(args)
    out = pathlib.Path(args.out or pathlib.Path(__file__).parent / "results" /
                       f"collectives-{datetime.date.today().isoformat()}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        cmd = [sys.executable, __file__, "--rank-main", "--result", str(out), "--reps", str(args.reps)]
        if args.sizes:
            cmd += ["--sizes", ",".join(str(s >> 10) for s in args.sizes)]
        if args.ops:
            cmd += ["--ops", ",".join(args.ops)]
        if args.control:
            cmd.append("--control")
        if args.gloo_path:
            cmd.append("--gloo-path")
        procs.append(subprocess.Popen(cmd + (["--quick"] if args.quick else []), env=env))
    rcs = [p.wait() for p in procs]
    if any(rcs):
        sys.exit(f"a rank failed: exit codes {rcs}")
    result = json.loads(out.read_text())
    table = markdown(result)
    print(table)
    print(f"wrote {out}")
    if args.docs:
        doc = pathlib.Path(__file__).resolve().parent.parent / "docs" / "distributed.md"
        text = doc.read_text()
        begin, end = "<!-- collectives:begin -->", "<!-- collectives:end -->"
        head, rest = text.split(begin)
        _, tail = rest.split(end)
        note = (f"Measured {result['date']} on this machine (2 ranks, {result['repetitions']} interleaved "
                f"repetitions; above 1 means neuron moves more data per second"
                + ("; peer access off: a neuron group whose every byte goes through Gloo, as between hosts"
                   if all("gloo_path_ratio" in r for r in result["rows"]) else "")
                + ("; the control column is Gloo against a second, identical Gloo group, the method's noise"
                   if all("control_ratio" in r for r in result["rows"]) else "") + "):")
        doc.write_text(f"{head}{begin}\n{note}\n\n{table}\n{end}{tail}")
        print(f"updated {doc}")


if __name__ == "__main__":
    main()
