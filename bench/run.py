"""Benchmarks side by side: every `neuron` figure is a ratio to CPU measured in the same run.

Modes per workload, interleaved (A B C A B C ...), medians over repetitions after
warm-up: CPU eager, CPU torch.compile (Inductor; compile time reported apart),
neuron eager, and neuron adaptive eager (torch_neuronx.set_execution_mode("adaptive"):
the same eager program, queued pointwise ops fused by the device). Results are checked equal (within tolerance) across modes before
timings are accepted; every timed call ends with a synchronize.

    python bench/run.py              # full run, writes bench/results/<date>.json
    python bench/run.py --quick      # tiny sizes, 2 repetitions: a smoke test of the harness
"""
import os

# Inductor's on-disk caches would turn "first call" into a cache load: report cold compiles.
os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")

import argparse  # noqa: E402
import datetime
import json
import math
import pathlib
import platform
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODES = ("cpu_eager", "cpu_inductor", "neuron_eager", "neuron_adaptive")
# Workloads that compare eager paths only (no Inductor column).
EAGER_MODES = ("cpu_eager", "neuron_eager", "neuron_adaptive")


def in_mode(mode, fn):
    """fn run in the neuron execution mode `mode` names (adaptive or eager), then back to eager."""
    import torch_neuronx

    exec_mode = "adaptive" if mode == "neuron_adaptive" else "eager"

    def run():
        torch_neuronx.set_execution_mode(exec_mode)
        try:
            return fn()
        finally:
            torch_neuronx.set_execution_mode("eager")
    return run


def sync(device):
    if device == "neuron":
        torch.neuron.synchronize()


# ---------------------------------------------------------------- models (torch_neuronx.testing.models)

from torch_neuronx.testing.models import BasicBlock, BertEncoder, Block, NanoGPT, ResNet18, mlp  # noqa: E402,F401


# ---------------------------------------------------------------- workloads
# Each workload builds per-device state once and returns a callable that runs
# one measured unit of work and returns a CPU tensor for the equality check.

def make_training_step(model_fn, data_fn, loss_fn, autocast_dtype=None):
    def setup(device, compiled):
        torch.manual_seed(0)
        model = model_fn().to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        inputs, targets = (t.to(device) for t in data_fn())
        fwd = torch.compile(model) if compiled else model

        def step():
            opt.zero_grad(set_to_none=True)
            # Mixed precision: forward and loss under torch.autocast (bf16 needs no loss scaling).
            with torch.autocast(device, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
                loss = loss_fn(fwd(inputs), targets)
            loss.backward()
            opt.step()
            return loss

        def check():
            # equality check: the first step's loss from identical initial weights
            return step().detach().cpu()

        return step, check
    return setup


def make_inference(model_fn, data_fn):
    def setup(device, compiled):
        torch.manual_seed(0)
        model = model_fn().to(device).eval()
        x = data_fn().to(device)
        fwd = torch.compile(model) if compiled else model

        def run():
            with torch.no_grad():
                return fwd(x)

        return run, lambda: run().cpu()
    return setup


def pointwise_setup(n):
    def setup(device, compiled):
        g = torch.Generator().manual_seed(0)
        x, bias, res = (torch.randn(n, generator=g).to(device) for _ in range(3))

        def chain(x, bias, res, train):
            return F.dropout(F.gelu(x + bias), p=0.1, training=train) + res

        fn = torch.compile(chain) if compiled else chain
        # Timed runs use dropout in training mode; the check runs it as identity,
        # since Inductor's dropout draws from its own random stream.
        return (lambda: fn(x, bias, res, True)), (lambda: fn(x, bias, res, False).cpu())
    return setup


def dispatch_setup(ops):
    def setup(device, compiled):
        g = torch.Generator().manual_seed(0)
        a = torch.randn(16, generator=g).to(device)
        b = torch.randn(16, generator=g).to(device)

        def loop(a, b):
            c = a
            for _ in range(ops):
                c = c + b
            return c

        fn = torch.compile(loop) if compiled else loop
        return (lambda: fn(a, b)), (lambda: fn(a, b).cpu())
    return setup


def optimizer_setup(n, impl):
    """One AdamW step over n parameters of a model's mixed shapes (one op over thousands of tensors)."""
    def setup(device, compiled):
        g = torch.Generator().manual_seed(0)
        shapes = [(64, 64), (64,), (256,), (16, 64)]
        params = []
        for i in range(n):
            p = torch.nn.Parameter(torch.randn(shapes[i % len(shapes)], generator=g).to(device))
            p.grad = torch.randn(p.shape, generator=g).to(device)
            params.append(p)
        opt = torch.optim.AdamW(params, lr=1e-3, **{impl: True})
        return (lambda: opt.step()), (lambda: (opt.step(), params[-1].detach().cpu())[1])
    return setup


def workloads(quick):
    if quick:
        return {
            "dispatch": dict(setup=dispatch_setup(200), ops=200, modes=EAGER_MODES,
                             note="200 tiny adds"),
            "pointwise_chain": dict(setup=pointwise_setup(1 << 16), bytes=4 * (1 << 16) * 4,
                                    note="GELU/bias/dropout/residual, 64K elements"),
            "adamw_fused_1000_params": dict(setup=optimizer_setup(1000, "fused"), modes=EAGER_MODES,
                                        note="fused AdamW step over 1,000 parameters"),
        "mlp_train_step": dict(setup=make_training_step(lambda: mlp(64, 128), lambda: (
                torch.randn(32, 64, generator=torch.Generator().manual_seed(1)),
                torch.randint(0, 10, (32,), generator=torch.Generator().manual_seed(2))), F.cross_entropy),
                modes=EAGER_MODES, train=True, note="MLP 64-128-128-10"),
        }
    tokens = lambda n, vocab, seq: torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(3))
    return {
        # Inductor would unroll the Python loop into one graph: not a dispatch measurement.
        "dispatch": dict(setup=dispatch_setup(2000), ops=2000, inner=100, modes=EAGER_MODES,
                         note="2000 tiny (16-element) adds + sync, 100 times per measurement"),
        # An optimizer step is one call over thousands of tensors: per-tensor costs on the
        # per-op path (keys, alias lookups) show up here as they do not in per-op dispatch.
        "adamw_fused_1000_params": dict(setup=optimizer_setup(1000, "fused"), inner=10,
                                        modes=EAGER_MODES,
                                        note="fused AdamW step over 1,000 parameters (~1.4M elements), 10 per measurement"),
        "adamw_foreach_1000_params": dict(setup=optimizer_setup(1000, "foreach"), inner=10,
                                          modes=EAGER_MODES,
                                          note="foreach AdamW step over 1,000 parameters, 10 per measurement"),
        "pointwise_chain": dict(setup=pointwise_setup(1 << 22), bytes=4 * (1 << 22) * 4, inner=12,
                                note="GELU/bias/dropout/residual on 4M elements, 12 times per measurement"),
        "mlp_train_step": dict(
            setup=make_training_step(mlp, lambda: (torch.randn(256, 1024, generator=torch.Generator().manual_seed(1)),
                                                   torch.randint(0, 10, (256,),
                                                                 generator=torch.Generator().manual_seed(2))),
                                     F.cross_entropy),
            train=True, inner=2, flops=6 * 256 * (1024 * 4096 + 4096 * 4096 + 4096 * 10),
            note="MLP 1024-4096-4096-10, batch 256, forward+backward+AdamW"),
        "nanogpt_train_step": dict(
            setup=make_training_step(lambda: NanoGPT(vocab=8192, layers=8),
                                     lambda: (tokens(4, 8192, 256), tokens(4, 8192, 256)),
                                     lambda logits, t: F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                                       t.reshape(-1))),
            train=True, inner=2,
            flops=6 * 4 * 256 * (8 * 12 * 256 * 256 + 256 * 8192),
            note="nanoGPT decoder, 8 layers d=256, vocab 8192, ~10.5M params, seq 256, batch 4"),
        "nanogpt_train_step_bf16": dict(
            setup=make_training_step(lambda: NanoGPT(vocab=8192, layers=8),
                                     lambda: (tokens(4, 8192, 256), tokens(4, 8192, 256)),
                                     lambda logits, t: F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                                                       t.reshape(-1)),
                                     autocast_dtype=torch.bfloat16),
            train=True, inner=2, modes=EAGER_MODES, check_tol=2e-2,
            flops=6 * 4 * 256 * (8 * 12 * 256 * 256 + 256 * 8192),
            note="the nanoGPT step under torch.autocast(dtype=torch.bfloat16), CPU autocast vs neuron autocast"),
        "bert_base_inference": dict(
            setup=make_inference(BertEncoder, lambda: tokens(8, 30522, 128)),
            flops=2 * 8 * 128 * 12 * 12 * 768 * 768, reps=5,
            note="BERT-base-sized encoder (12 layers, d=768), seq 128, batch 8, random weights"),
        "resnet18_inference": dict(
            setup=make_inference(ResNet18, lambda: torch.randn(8, 3, 224, 224,
                                                               generator=torch.Generator().manual_seed(4))),
            flops=2 * 8 * 1.82e9, reps=5, inner=3, note="ResNet-18-sized CNN, batch 8, 224x224"),
    }


# ---------------------------------------------------------------- measurement

def timed(fn, device, inner):
    t = time.perf_counter()
    for _ in range(inner):
        fn()
    sync(device)
    return (time.perf_counter() - t) / inner


def run_workload(name, w, reps, log, quick):
    modes = w.get("modes", MODES)
    fns, checks, first_call = {}, {}, {}
    for mode in modes:
        device = "neuron" if mode.startswith("neuron") else "cpu"
        torch._dynamo.reset()
        t0 = time.perf_counter()
        run, check = w["setup"](device, compiled=mode.endswith("inductor"))
        if device == "neuron":
            run, check = in_mode(mode, run), in_mode(mode, check)
        checks[mode] = check()  # Inductor compiles here: first_call_s includes the compile time
        first_call[mode] = time.perf_counter() - t0
        fns[mode] = (run, device)
    # Equality before timing: every mode agrees with CPU eager.
    base = checks["cpu_eager"]
    for mode, out in checks.items():
        t = w.get("check_tol", 2e-3)  # bf16 autocast: CPU's policy differs from neuron's (CUDA's) in a few ops
        tol = dict(rtol=t, atol=t) if mode != "cpu_eager" else dict(rtol=0, atol=0)
        torch.testing.assert_close(out.float(), base.float(), **tol,
                                   msg=lambda m: f"{name}/{mode} disagrees with cpu_eager: {m}")
    for mode, (run, device) in fns.items():  # warm-up (adaptive: first sight, then its kernels built)
        run()
        sync(device)
        if mode == "neuron_adaptive":
            import torch_neuronx

            torch_neuronx._C._compiler._adaptive_wait_for_builds(600)
            run()
            sync(device)
    # Each measurement repeats the unit of work `inner` times (about 0.5 s or
    # more in the full run) and reports the time per unit.
    inner = w.get("inner", 1)
    times = {m: [] for m in fns}
    for _ in range(w.get("reps", reps)):
        for mode, (run, device) in fns.items():  # interleaved
            times[mode].append(timed(run, device, inner))
    res = {"note": w.get("note", ""), "inner": inner, "modes": {}}
    for mode, ts in times.items():
        res["modes"][mode] = dict(median_s=statistics.median(ts), min_s=min(ts), max_s=max(ts), reps=len(ts),
                                  first_call_s=first_call[mode])
    ce = res["modes"]["cpu_eager"]["median_s"]
    ci = res["modes"].get("cpu_inductor", {}).get("median_s")
    ne = res["modes"]["neuron_eager"]["median_s"]
    # Throughput ratios (>1 means neuron is faster).
    res["neuron_vs_cpu_eager"] = ce / ne
    res["neuron_vs_cpu_inductor"] = ci / ne if ci else None
    if "neuron_adaptive" in res["modes"]:
        res["adaptive_vs_neuron_eager"] = ne / res["modes"]["neuron_adaptive"]["median_s"]
    if "ops" in w:
        res["us_per_op"] = {m: v["median_s"] / w["ops"] * 1e6 for m, v in res["modes"].items()}
    for key in ("bytes", "flops"):
        if key in w:
            res[key] = w[key]
    if w.get("train") and "neuron_eager" in modes:
        res["memory"] = measure_memory(name, quick)
    log(f"{name:<24}" + "".join(f"{m}={v['median_s'] * 1e3:9.2f} ms  " for m, v in res["modes"].items())
        + f"neuron/cpu_eager throughput {res['neuron_vs_cpu_eager']:.2f}x"
        + (f", adaptive/neuron eager {res['adaptive_vs_neuron_eager']:.2f}x" if "adaptive_vs_neuron_eager" in res else ""))
    return res


def vm_hwm_bytes():
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


STEPS_IN_FLIGHT = (1, 3, 10)


def neuron_step_peaks(w):
    """Peak device memory above the resident model while k steps are queued, for each k in
    STEPS_IN_FLIGHT: the device is held by a sleep kernel so the host queues all k steps before
    the first one runs (under NEURON_LAUNCH_BLOCKING=1 each op runs as it is issued instead)."""
    blocking = os.environ.get("NEURON_LAUNCH_BLOCKING") == "1"
    run, _ = w["setup"]("neuron", compiled=False)
    run()
    torch.neuron.synchronize()
    peaks = {}
    for k in STEPS_IN_FLIGHT:
        torch.neuron.synchronize()
        torch.neuron.reset_peak_memory_stats()
        base = torch.neuron.memory_allocated()
        if not blocking:
            torch.neuron._sleep(2000)
        for _ in range(k):
            run()
        torch.neuron.synchronize()
        peaks[str(k)] = torch.neuron.max_memory_allocated() - base
    return peaks


def measure_memory(name, quick):
    """Peak device memory of the training step with 1, 3 and 10 steps in flight, the same under
    NEURON_LAUNCH_BLOCKING=1 (a subprocess: the setting is read at start-up), and the peak RSS
    growth of one step on CPU."""
    w = workloads(quick)[name]
    ahead = neuron_step_peaks(w)
    env = dict(os.environ, NEURON_LAUNCH_BLOCKING="1")
    cmd = [sys.executable, __file__, "--memory-of", name] + (["--quick"] if quick else [])
    blocking = json.loads(subprocess.check_output(cmd, env=env, text=True).strip().splitlines()[-1])
    run_cpu, _ = w["setup"]("cpu", compiled=False)
    run_cpu()
    try:
        # Give glibc's cached free memory back first (else a step reuses it and
        # shows no growth), then reset the process's peak RSS.
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
        pathlib.Path("/proc/self/clear_refs").write_text("5")
        rss0 = vm_hwm_bytes()
        run_cpu()
        cpu_growth = vm_hwm_bytes() - rss0
    except OSError:
        cpu_growth = None
    return {"neuron_step_peak_bytes": ahead["1"], "neuron_peak_bytes_in_flight": ahead,
            "neuron_peak_bytes_launch_blocking": blocking, "cpu_step_rss_growth_bytes": cpu_growth}


def machine_context(quick):
    n = (1 << 20) if quick else (1 << 25)
    a, b, c = torch.empty(n), torch.randn(n), torch.randn(n)
    ts = []
    for _ in range(5):
        t = time.perf_counter()
        torch.add(b, c, alpha=3.0, out=a)
        ts.append(time.perf_counter() - t)
    triad = 3 * 4 * n / min(ts)
    m = 512 if quick else 2048
    x, y = torch.randn(m, m), torch.randn(m, m)
    torch.mm(x, y)
    ts = []
    for _ in range(3):
        t = time.perf_counter()
        torch.mm(x, y)
        ts.append(time.perf_counter() - t)
    flops = 2 * m ** 3 / min(ts)
    return {"triad_bytes_per_s": triad, "matmul_flops_per_s": flops}


def git_commit():
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes, 2 repetitions (harness smoke test)")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--only", default="", help="comma-separated workload names")
    p.add_argument("--out", default="", help="result JSON path (default bench/results/<date>.json)")
    p.add_argument("--memory-of", default="", help=argparse.SUPPRESS)  # measure_memory's subprocess
    args = p.parse_args()
    if args.memory_of:
        print(json.dumps(neuron_step_peaks(workloads(args.quick)[args.memory_of])))
        return
    reps = 2 if args.quick else args.reps
    log = lambda s: print(s, flush=True)
    ws = workloads(args.quick)
    if args.only:
        ws = {k: v for k, v in ws.items() if k in args.only.split(",")}
    log(f"torch {torch.__version__}, {os.cpu_count()} cores, {torch.get_num_threads()} threads, commit {git_commit()}")
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "cores": os.cpu_count(), "threads": torch.get_num_threads(),
        "commit": git_commit(), "python": platform.python_version(), "quick": args.quick,
        "context": machine_context(args.quick), "workloads": {},
    }
    for name, w in ws.items():
        result["workloads"][name] = run_workload(name, w, reps, log, args.quick)
    out = pathlib.Path(args.out) if args.out else ROOT / "bench" / "results" / (
        ("quick-" if args.quick else "") + datetime.date.today().isoformat() + ".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    log(f"wrote {out}")
    if not all(math.isfinite(w["neuron_vs_cpu_eager"]) for w in result["workloads"].values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
