"""Concurrency stress: in each of 2 ranks, 8 Python threads at once for `--seconds`, each on a stream of
its own and spread over the devices: six train small models with autograd (every round is
compared with the same round run single-threaded on CPU beforehand), two run collectives on
process groups of their own (every result compared with the value both ranks' inputs give).
Threads are joined with a deadline (a hang dumps every thread's stack and fails); device memory
must come back to where it started.

    python tests/reliability/stress_threads.py --seconds 180

Starts its 2 ranks itself; exits 1 with the first mismatches.
"""
import argparse
import faulthandler
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import torch_neuronx  # noqa: F401

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ranks  # noqa: E402

N_THREADS, N_TRAINERS, VARIANTS, STEPS = 8, 6, 3, 4


_INIT = threading.Lock()  # parameter init draws from the process-wide CPU generator


def _model(seed):
    with _INIT:
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.LayerNorm(256),
                             nn.Linear(256, 8))


def _data(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(STEPS, 32, 64, generator=g), torch.randn(STEPS, 32, 8, generator=g)


def train_round(seed, device):
    """A few AdamW steps of a fresh model; the losses and the final weights (on CPU)."""
    model = _model(seed).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    xs, ys = _data(seed)
    losses = []
    for x, y in zip(xs.to(device), ys.to(device)):
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return [l.item() for l in losses], [p.detach().cpu() for p in model.parameters()]


def _seed(rank, thread, variant):
    return 1000 * rank + 10 * thread + variant


def _reduce_input(rank, thread, it):
    g = torch.Generator().manual_seed(7919 * thread + 104729 * rank + it)
    n = 1 + (it * 997) % 5000
    return torch.randn(n, generator=g)


def run(seconds, rank, world):
    ndev = torch.neuron.device_count()
    # Single-threaded references, on CPU, before any thread starts.
    refs = {(t, v): train_round(_seed(rank, t, v), "cpu") for t in range(N_TRAINERS) for v in range(VARIANTS)}
    groups = [dist.new_group(list(range(world))) for _ in range(N_THREADS - N_TRAINERS)] if world > 1 else []
    base = []
    for d in range(ndev):
        torch.neuron.synchronize(d)
        base.append(torch.neuron.memory_allocated(d))
    errors, counts = [], [0] * N_THREADS
    stop_at = time.monotonic() + seconds

    def trainer(t):
        dev = torch.device("neuron", t % ndev)
        with torch.neuron.device(dev), torch.neuron.stream(torch.neuron.Stream(dev)):
            while time.monotonic() < stop_at:
                v = counts[t] % VARIANTS
                losses, params = train_round(_seed(rank, t, v), dev)
                want_losses, want_params = refs[(t, v)]
                if losses != want_losses or not all(torch.equal(a, b) for a, b in zip(params, want_params)):
                    errors.append(f"rank {rank} thread {t} round {counts[t]}: {losses} != {want_losses}")
                counts[t] += 1

    def reducer(t):
        group = groups[t - N_TRAINERS]
        dev = torch.device("neuron", t % ndev)
        # Both ranks stop at the same round count (a collective needs every rank), so rounds are
        # bounded by time on rank 0 and the count is agreed on through the group first.
        with torch.neuron.device(dev), torch.neuron.stream(torch.neuron.Stream(dev)):
            it = 0
            while True:
                go = torch.tensor([1.0 if time.monotonic() < stop_at else 0.0], device=dev)
                dist.all_reduce(go, op=dist.ReduceOp.MIN, group=group)
                if go.item() == 0:
                    break
                x = _reduce_input(rank, t, it).to(dev)
                dist.all_reduce(x, group=group)
                want = sum(_reduce_input(r, t, it) for r in range(world))
                if not torch.allclose(x.cpu(), want, rtol=1e-6, atol=1e-6):
                    errors.append(f"rank {rank} thread {t} all_reduce {it}: wrong sum")
                it += 1
                counts[t] = it

    def wrap(t):
        try:
            (trainer if t < N_TRAINERS or world == 1 else reducer)(t)
        except BaseException as e:  # noqa: BLE001  (reported by the main thread)
            errors.append(f"rank {rank} thread {t}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=wrap, args=(t,), name=f"stress-{t}", daemon=True) for t in range(N_THREADS)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    deadline = time.monotonic() + seconds + 120
    for th in threads:
        th.join(timeout=max(0.0, deadline - time.monotonic()))
    alive = [th.name for th in threads if th.is_alive()]
    if alive:
        faulthandler.dump_traceback(all_threads=True)
        errors.append(f"rank {rank}: threads still running 120 s after the end (deadlock?): {alive}")
    after = []
    for d in range(ndev):
        torch.neuron.synchronize(d)
        after.append(torch.neuron.memory_allocated(d))
    if not alive and after != base:
        errors.append(f"rank {rank}: device memory allocated {base} before, {after} after")
    return {"rank": rank, "seconds": time.perf_counter() - t0, "rounds": counts, "errors": errors,
            "devices": ndev, "memory_before": base, "memory_after": after}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=180)
    p.add_argument("--out", help="write each rank's report to OUT.rank<r> (JSON)")
    args = p.parse_args()
    if "RANK" not in os.environ:
        codes = ranks.launch(__file__, sys.argv[1:], 2)
        print(f"ranks exited {codes}")
        raise SystemExit(0 if codes == [0, 0] else 1)
    rank, world, _ = ranks.join_group(120)
    faulthandler.dump_traceback_later(args.seconds + 60, exit=True)  # a hang shows where every thread is
    report = run(args.seconds, rank, world)
    ranks.finish(report, args.out,
                 f"{report['seconds']:.0f} s, rounds per thread {report['rounds']}, {len(report['errors'])} errors",
                 report["errors"])

if __name__ == "__main__":
    main()
