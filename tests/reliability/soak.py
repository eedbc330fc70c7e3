"""Soak: many training steps of the nanoGPT reference model on `neuron`, watching for anything that
grows. Every `--every` steps (after a synchronize) it samples device memory (allocated and
reserved), host RSS, open file descriptors and threads; after warm-up each series must be flat
(its least-squares slope over the run within the metric's noise allowance), and the loss at each
sample must equal the loss of a reference run of the same program on CPU, stepped alongside.

    python tests/reliability/soak.py --mode eager --steps 10000
    python tests/reliability/soak.py --mode compiled --steps 10000
    python tests/reliability/soak.py --mode ddp --steps 2000       # 2 ranks, neuron c10d backend

Modes: `eager` (reference: the same model on CPU, losses must match to float rounding of the same
kernels), `compiled` (`torch.compile(backend="neuron")`; reference: CPU eager, within the compile
tier's contraction tolerance), `ddp` (2 ranks, DDP over the `neuron` backend; reference: the same
DDP program on CPU tensors over Gloo in the same ranks). `--plant-leak` keeps one device tensor per
step alive (a planted leak, to show the check finds one). Exits 1 with the failing series.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

import torch_neuronx  # noqa: F401
from torch_neuronx.testing.models import NanoGPT

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ranks  # noqa: E402

MiB = 2**20
CONFIG = dict(vocab=512, d=64, layers=2, heads=4, seq=64)
# --config full: the reference model at the size the benchmarks train it (6.9M parameters in 77 tensors,
# sequences of 256), for fewer steps.
FULL = dict(vocab=4096, d=256, layers=6, heads=8, seq=256)
BATCH = 8
# What a series may grow by over the run after warm-up (fitted slope x steps), per metric: device
# memory and descriptors and threads exactly flat; RSS within allocator noise (glibc arenas, the
# Python heap) but far below one step's worth of leaked activations over thousands of steps.
ALLOWANCE = {"allocated_mib": 0.0, "reserved_mib": 0.0, "rss_mib": 8.0, "fds": 0.0, "threads": 0.0}
TOLERANCE = {"eager": 1e-5, "compiled": 1e-4, "ddp": 1e-5}
# AdamW where the reference runs the same kernels; SGD with momentum for the compiled step, whose
# contracted multiply-adds differ from eager in the last bit: Adam's m/sqrt(v) turns such noise in
# near-zero gradients into full-size updates (1e-3 relative loss difference within 10 steps), where
# SGD keeps it at rounding level over the whole run.
OPTIMIZER = {"eager": lambda ps: torch.optim.AdamW(ps, lr=1e-3),
             "compiled": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
             "ddp": lambda ps: torch.optim.AdamW(ps, lr=1e-3)}


def _rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MiB


def _threads():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))


def sample(device):
    torch.neuron.synchronize(device)
    return {"allocated_mib": torch.neuron.memory_allocated(device) / MiB,
            "reserved_mib": torch.neuron.memory_reserved(device) / MiB,
            "rss_mib": _rss_mib(), "fds": len(os.listdir("/proc/self/fd")), "threads": _threads()}


def slope(xs, ys):
    """Least-squares slope of ys over xs."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0


def check(samples, warmup):
    """Per metric: fitted growth after warm-up against ALLOWANCE. Returns (series, failures)."""
    kept = [s for s in samples if s["step"] >= warmup]
    series, failures = {}, []
    if len(kept) < 3:
        return series, [f"only {len(kept)} samples after warm-up (step {warmup}): run more steps"]
    steps = [s["step"] for s in kept]
    span = steps[-1] - steps[0]
    for metric, allowed in ALLOWANCE.items():
        ys = [s[metric] for s in kept]
        k = slope(steps, ys)
        growth = k * span
        series[metric] = {"first": ys[0], "last": ys[-1], "min": min(ys), "max": max(ys),
                          "slope_per_1000_steps": k * 1000, "growth": growth}
        # exact-flat metrics: any change at all after warm-up; the others: fitted growth
        grew = (max(ys) != min(ys)) if allowed == 0 else growth > allowed
        if grew:
            failures.append(f"{metric} grows after warm-up: {ys[0]:.2f} -> {ys[-1]:.2f} "
                            f"(min {min(ys):.2f}, max {max(ys):.2f}, fitted {growth:+.2f} over {span} steps, "
                            f"allowed {allowed})")
    return series, failures


def batch(step, n=BATCH, generator_seed=1234):
    """Random token sequences (inputs, next-token targets), the same for a step on every device."""
    g = torch.Generator().manual_seed(generator_seed + step)
    x = torch.randint(0, CONFIG["vocab"], (n, CONFIG["seq"] + 1), generator=g)
    return x[:, :-1], x[:, 1:]


def train_step(model, opt, x, y):
    """One optimizer step on next-token cross entropy; returns the loss (a device tensor)."""
    logits = model(x)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def _pair(mode, device, wrap=lambda m, d: m):
    """The model and optimizer on `device` and an identical pair on CPU (the reference)."""
    torch.manual_seed(0)
    ref = NanoGPT(**CONFIG)
    dev = NanoGPT(**CONFIG)
    dev.load_state_dict(ref.state_dict())
    ref, dev = wrap(ref, "cpu"), wrap(dev.to(device), device)
    return (dev, OPTIMIZER[mode](dev.parameters())), (ref, OPTIMIZER[mode](ref.parameters()))


def run(mode, steps, every=100, warmup=None, plant_leak=False, rank=0, world=1):
    device = torch.device("neuron", rank % torch.neuron.device_count())
    torch.neuron.set_device(device)
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        (dev, dopt), (ref, ropt) = _pair(mode, device, lambda m, d: DDP(m, device_ids=[device.index] if d != "cpu" else None))
    else:
        (dev, dopt), (ref, ropt) = _pair(mode, device)
    step_fn = torch.compile(train_step, backend="neuron") if mode == "compiled" else train_step
    warmup = warmup if warmup is not None else max(2 * every, steps // 10)
    leaked, samples, worst = [], [], 0.0
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        x, y = batch(step * world + rank)
        loss = step_fn(dev, dopt, x.to(device, non_blocking=True), y.to(device, non_blocking=True))
        ref_loss = train_step(ref, ropt, x, y)
        if plant_leak:
            leaked.append(loss.detach() * 1)
        if step % every == 0:
            s = sample(device)
            got, want = loss.item(), ref_loss.item()
            diff = abs(got - want) / max(abs(want), 1e-12)
            worst = max(worst, diff)
            s.update(step=step, loss=got, ref_loss=want, seconds=time.perf_counter() - t0)
            samples.append(s)
            if diff > TOLERANCE[mode]:
                raise SystemExit(f"step {step}: loss {got!r} on neuron, {want!r} on the CPU reference "
                                 f"(relative difference {diff:.2e} > {TOLERANCE[mode]})")
    series, failures = check(samples, warmup)
    return {"mode": mode, "steps": steps, "every": every, "warmup": warmup, "rank": rank, "world": world,
            "seconds": time.perf_counter() - t0, "worst_loss_rel_diff": worst, "series": series,
            "failures": failures, "samples": samples}


def launch_ddp(args):
    """Start 2 ranks of this script (each checks its own series); their exit codes."""
    return ranks.launch(__file__, sys.argv[1:], 2,
                        lambda r: {"SOAK_RANK_OUT": f"{args.out or '/dev/null'}.rank{r}"})


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("eager", "compiled", "ddp"), default="eager")
    p.add_argument("--steps", type=int, default=10000)
    p.add_argument("--every", type=int, default=100)
    p.add_argument("--warmup", type=int, default=None, help="steps before the series must be flat")
    p.add_argument("--plant-leak", action="store_true")
    p.add_argument("--config", choices=("small", "full"), default="small")
    p.add_argument("--out", help="write the report (JSON) here")
    args = p.parse_args()
    if args.mode == "ddp" and "RANK" not in os.environ:
        codes = launch_ddp(args)
        print(f"ranks exited {codes}")
        raise SystemExit(0 if codes == [0, 0] else 1)
    if args.config == "full":
        CONFIG.update(FULL)
    rank, world, out = 0, 1, args.out
    if args.mode == "ddp":
        import datetime
        import torch.distributed as dist
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        torch.neuron.set_device(rank % torch.neuron.device_count())
        dist.init_process_group("cpu:gloo,neuron:neuron", timeout=datetime.timedelta(seconds=120),
                                device_id=torch.device("neuron", rank % torch.neuron.device_count()))
        out = os.environ["SOAK_RANK_OUT"] if args.out else None
    report = run(args.mode, args.steps, args.every, args.warmup, args.plant_leak, rank, world)
    if out:
        with open(out, "w") as f:
            json.dump(report, f, indent=1)
    head = f"[{args.mode} rank {rank}] " if world > 1 else f"[{args.mode}] "
    print(head + f"{report['steps']} steps in {report['seconds']:.0f} s; worst loss difference "
          f"{report['worst_loss_rel_diff']:.1e}; after step {report['warmup']}:")
    for metric, s in report["series"].items():
        print(head + f"  {metric:14s} {s['first']:10.2f} -> {s['last']:10.2f}  "
              f"slope {s['slope_per_1000_steps']:+.3f}/1000 steps")
    for f in report["failures"]:
        print(head + "FAIL " + f)
    if args.mode == "ddp":
        import torch.distributed as dist
        dist.destroy_process_group()
    raise SystemExit(1 if report["failures"] else 0)


if __name__ == "__main__":
    main()
