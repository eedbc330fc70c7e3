"""Concurrency stress: Python threads submitting work on shared streams, with cross-stream
event waits, allocation churn and host copies. Every result is checked against CPU, threads
are joined with a timeout (a hang fails the test instead of blocking the run), and the
allocator returns to its starting state.
"""
import gc
import threading
import time

import torch

N_THREADS = 8
DURATION_S = 3.0
JOIN_TIMEOUT_S = 60.0


def _run_threads(target, n):
    errors = []
    counts = [0] * n

    def wrap(i):
        try:
            counts[i] = target(i)
        except BaseException as e:  # reported by the main thread
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=wrap, args=(i,), daemon=True, name=f"neuron-stress-{i}") for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    alive = [t.name for t in threads if t.is_alive()]
    assert not alive, f"threads still running after {JOIN_TIMEOUT_S}s (deadlock?): {alive}"
    assert not errors, errors
    return counts


def _baseline(device=0):
    gc.collect()
    torch.neuron.synchronize(device)
    return torch.neuron.memory_allocated(device)


def test_threads_on_two_streams_match_cpu_and_free_memory():
    base = _baseline()
    streams = [torch.neuron.Stream(), torch.neuron.Stream()]
    torch.manual_seed(0)
    w_cpu = torch.randn(64, 64) / 8
    w = w_cpu.to("neuron")  # shared, read by every thread
    torch.neuron.synchronize()
    stop_at = time.monotonic() + DURATION_S

    def work(i):
        mine, other = streams[i % 2], streams[(i + 1) % 2]
        g = torch.Generator().manual_seed(1000 + i)
        acc = torch.zeros(64, device="neuron")  # thread-private running sum, checked at the end
        acc_cpu = torch.zeros(64)
        it = 0
        while time.monotonic() < stop_at:
            n = 16 + (it * 7 + i) % 48
            a_cpu = torch.randn(n, 64, generator=g)
            with torch.neuron.stream(mine):
                a = a_cpu.to("neuron")
                h = torch.relu(a @ w + 0.5)
                s = h.sum(0)
                acc.add_(s)
                tmp = torch.empty(4096 * (1 + it % 5), device="neuron")  # allocation churn
                tmp.fill_(float(i))
                ok = tmp.sum()
            acc_cpu.add_(torch.relu(a_cpu @ w_cpu + 0.5).sum(0))
            if it % 2:
                # Cross-stream: the other stream consumes h after an event wait.
                ev = mine.record_event()
                with torch.neuron.stream(other):
                    other.wait_event(ev)
                    out = (h * 2).mean(1).cpu()
                ref = (torch.relu(a_cpu @ w_cpu + 0.5) * 2).mean(1)
            else:
                with torch.neuron.stream(mine):
                    out = h.max(1).values.cpu()
                ref = torch.relu(a_cpu @ w_cpu + 0.5).max(1).values
            torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
            with torch.neuron.stream(mine):
                assert ok.item() == float(i) * tmp.numel()
            it += 1
        with torch.neuron.stream(streams[i % 2]):
            torch.testing.assert_close(acc.cpu(), acc_cpu, rtol=1e-4, atol=1e-3)
        return it

    counts = _run_threads(work, N_THREADS)
    assert all(c >= 2 for c in counts), f"some threads made almost no progress: {counts}"
    del w
    assert _baseline() == base
    for s in streams:
        assert s.query()


def test_threads_each_with_own_stream_and_device():
    base0, base1 = _baseline(0), _baseline(1)
    stop_at = time.monotonic() + 1.0

    def work(i):
        dev = i % 2
        with torch.neuron.device(dev):
            s = torch.neuron.Stream()
            it = 0
            with torch.neuron.stream(s):
                while time.monotonic() < stop_at:
                    x_cpu = torch.arange(1000, dtype=torch.float64) * (i + 1) + it
                    x = x_cpu.to("neuron")
                    assert x.device.index == dev
                    y = torch.cumsum(x.sin(), 0)
                    torch.testing.assert_close(y.cpu(), torch.cumsum(x_cpu.sin(), 0))
                    it += 1
            return it

    counts = _run_threads(work, N_THREADS)
    assert all(c >= 1 for c in counts)
    assert _baseline(0) == base0
    assert _baseline(1) == base1


def test_concurrent_host_to_device_copies():
    # transformers' from_pretrained copies weights to the device from 4 threads at once.
    base = _baseline()
    torch.manual_seed(1)
    sources = [torch.randn(256, 257) for _ in range(32)]
    results = [None] * len(sources)

    def work(i):
        for k in range(i, len(sources), 4):
            results[k] = sources[k].to("neuron")
        return 1

    _run_threads(work, 4)
    torch.neuron.synchronize()
    for src, dev in zip(sources, results):
        assert dev.device.type == "neuron"
        assert torch.equal(dev.cpu(), src)
    del results, dev
    assert _baseline() == base


def test_synchronize_from_many_threads_while_work_is_queued():
    s = torch.neuron.Stream()
    buf = torch.zeros(1 << 12, device="neuron")
    torch.neuron.synchronize()
    done = threading.Event()

    def producer(_):
        with torch.neuron.stream(s):
            for _ in range(300):
                buf.add_(1)
        done.set()
        return 1

    def syncer(_):
        n = 0
        while not done.is_set() or n < 3:
            torch.neuron.synchronize()
            s.synchronize()
            n += 1
        return n

    _run_threads(lambda i: producer(i) if i == 0 else syncer(i), 4)
    s.synchronize()
    assert torch.equal(buf.cpu(), torch.full((1 << 12,), 300.0))
