"""Stream-ordered memory reuse (CUDA's caching-allocator semantics).

A block freed on the host goes back to its stream's pool at once and is handed to later work
on the same stream (stream order makes that safe), so queued kernels do not keep their
operands' memory. Each rule has a test that fails if the rule is broken: a block reused too
early corrupts a result the test checks, and a block not reused shows in its address or in
the allocator's statistics. The device is kept busy with ``torch.neuron._sleep`` so that the
host frees and reallocates while the readers are still queued.
"""
import json
import random
import subprocess
import sys
import textwrap

import pytest
import torch
from helpers import clean_env, fresh_large_size

SLEEP_MS = 400


def _sizes(device=0):
    """Elements of a float32 tensor whose block no cached block can serve (its own segment)."""
    return fresh_large_size(device) // 4


def _warm(n, device="neuron"):
    # First calls of a signature run inline (to validate it): do them before the timed part.
    x = torch.full((n,), 1.0, device=device)
    ((x * 5) + 1).cpu()
    (x * 1.0 + 1.0).cpu()
    torch.neuron.synchronize()


def _busy(stream=None):
    """The stream (default: current) is busy for SLEEP_MS: what is queued behind waits."""
    if stream is None:
        torch.neuron._sleep(SLEEP_MS)
    else:
        with torch.neuron.stream(stream):
            torch.neuron._sleep(SLEEP_MS)


def test_a_freed_block_returns_to_its_stream_at_once_and_later_work_there_reuses_it():
    n = _sizes()
    _warm(n)
    x = torch.full((n,), 3.0, device="neuron")
    _busy()
    y = x * 5  # queued: reads x after the sleep
    allocated = torch.neuron.memory_allocated()
    x_ptr = x.data_ptr()
    del x
    # Back in the pool at once, though its reader has not run.
    assert torch.neuron.memory_allocated() == allocated - 4 * n
    z = torch.full((n,), 7.0, device="neuron")
    assert not torch.neuron.current_stream().query(), "the stream finished too early for this test to mean anything"
    assert z.data_ptr() == x_ptr, "a block freed on the host was not reused by the next work on its stream"
    # Stream order: the reader of x ran before the fill of z.
    assert torch.equal(y.cpu(), torch.full((n,), 15.0))
    assert torch.equal(z.cpu(), torch.full((n,), 7.0))


def test_a_temporary_chain_reuses_one_block_while_everything_is_queued():
    # y = ((x + 1) * 2 + 1) ... : every temporary dies on the host as the next op is queued, so
    # the chain needs a bounded number of blocks however long it is, before any of it has run.
    n = _sizes()
    _warm(n)
    x = torch.full((n,), 1.0, device="neuron")
    torch.neuron.synchronize()
    torch.neuron.reset_peak_memory_stats()
    base = torch.neuron.memory_allocated()
    _busy()
    y = x
    for _ in range(50):
        y = y * 1.0 + 1.0
    assert not torch.neuron.current_stream().query()
    # y and at most two temporaries alive at any time (the op's input and output, plus x).
    assert torch.neuron.max_memory_allocated() - base <= 3 * 4 * n
    assert torch.equal(y.cpu(), torch.full((n,), 51.0))


def test_a_buffer_read_on_another_stream_is_not_reused_before_that_stream_read_it():
    # Without record_stream the kernel queued on the side stream keeps the buffer (safer than
    # CUDA, where this would be a use-after-free).
    side = torch.neuron.Stream()
    n = _sizes()
    _warm(n)
    with torch.neuron.stream(side):
        _warm(n)
    x = torch.full((n,), 3.0, device="neuron")
    torch.neuron.synchronize()
    _busy(side)
    with torch.neuron.stream(side):
        y = x * 5
    x_ptr = x.data_ptr()
    del x
    z = torch.full((n,), 7.0, device="neuron")
    assert not side.query()
    assert z.data_ptr() != x_ptr, "the block went to the default stream while the side stream still reads it"
    side.synchronize()
    assert torch.equal(y.cpu(), torch.full((n,), 15.0))
    assert torch.equal(z.cpu(), torch.full((n,), 7.0))


def test_record_stream_holds_a_block_until_that_stream_has_passed_the_free():
    # A use the allocator cannot see (e.g. a raw address handed to other code on the side
    # stream) is declared with record_stream: the block is reused only after the side stream
    # has run what was queued on it when the tensor was freed.
    side = torch.neuron.Stream()
    n = _sizes()
    x = torch.full((n,), 3.0, device="neuron")
    torch.neuron.synchronize()
    _busy(side)
    x.record_stream(side)
    x_ptr = x.data_ptr()
    del x
    z = torch.empty(n, device="neuron")
    assert not side.query()
    assert z.data_ptr() != x_ptr, "record_stream did not hold the block for the side stream"
    held = [b for seg in torch.neuron.memory_snapshot(0) for b in seg["blocks"] if b["state"] == "active_pending_free"]
    assert held and not side.query(), "the snapshot does not show the block held for the side stream"
    side.synchronize()  # (z stays alive: x's block is then the only free one of the size)
    w = torch.empty(n, device="neuron")
    assert w.data_ptr() == x_ptr, "the recorded block did not return to its stream's pool after the side stream"


def test_a_buffer_handed_over_with_an_event_is_safe_to_free_on_the_producer_stream():
    # Produced on a side stream, consumed on the default stream after an event wait, then freed
    # while the consumer is still queued: new work on the producer stream must not get it early.
    side = torch.neuron.Stream()
    n = _sizes()
    with torch.neuron.stream(side):
        _warm(n)
    _warm(n)
    with torch.neuron.stream(side):
        x = torch.full((n,), 3.0, device="neuron")
        ev = torch.neuron.Event()
        ev.record()
    _busy()
    ev.wait()
    y = x * 5  # default stream, after the sleep
    x_ptr = x.data_ptr()
    del x
    with torch.neuron.stream(side):
        z = torch.full((n,), 7.0, device="neuron")
    assert not torch.neuron.current_stream().query()
    assert z.data_ptr() != x_ptr
    torch.neuron.synchronize()
    assert torch.equal(y.cpu(), torch.full((n,), 15.0))
    assert torch.equal(z.cpu(), torch.full((n,), 7.0))


def test_non_blocking_copies_to_and_from_pinned_memory_with_the_sources_freed():
    n = 1 << 20
    _warm(n)
    dev_src = torch.full((n,), 2.0, device="neuron")
    host_dst = torch.empty(n, pin_memory=True)
    pinned_src = torch.full((n,), 4.0).pin_memory()
    dev_dst = torch.empty(n, device="neuron")
    torch.neuron.synchronize()
    _busy()
    tmp = dev_src * 3  # 6.0
    host_dst.copy_(tmp, non_blocking=True)
    del tmp  # the copy still reads it; the next allocation of the stream may take the block
    torch.full((n,), -1.0, device="neuron")
    dev_dst.copy_(pinned_src, non_blocking=True)
    del pinned_src  # the copy task keeps the pinned buffer
    torch.full((n,), -1.0).pin_memory()
    assert not torch.neuron.current_stream().query()
    torch.neuron.synchronize()
    assert torch.equal(host_dst, torch.full((n,), 6.0))
    assert torch.equal(dev_dst.cpu(), torch.full((n,), 4.0))


def test_empty_cache_waits_for_queued_readers_of_freed_blocks():
    n = _sizes()
    _warm(n)
    x = torch.full((n,), 3.0, device="neuron")
    torch.neuron.synchronize()
    reserved = torch.neuron.memory_reserved()
    _busy()
    y = x * 5
    del x  # its segment is idle on the host, but y's kernel has not read it yet
    torch.neuron.empty_cache()  # waits for the reader, then unmaps the segment
    assert torch.neuron.current_stream().query(), "empty_cache returned before the reader of a freed block ran"
    assert torch.neuron.memory_reserved() <= reserved - 4 * n
    assert torch.equal(y.cpu(), torch.full((n,), 15.0))


def test_out_of_memory_retry_waits_for_queued_readers_then_succeeds():
    # 64 MiB device: x (40 MiB) is freed while its reader is queued; a 44 MiB tensor does not
    # fit beside x's idle segment, which may be unmapped only after the reader ran.
    code = textwrap.dedent("""
        import json, torch
        x = torch.full((10 << 20,), 3.0, device="neuron")
        x.sum().item()  # first calls of the signatures, run inline
        torch.neuron._sleep(300)
        y = x.sum()
        del x
        z = torch.full((11 << 20,), 7.0, device="neuron")
        print(json.dumps({"y": y.item(), "z": z.sum().item(),
                          "retries": torch.neuron.memory_stats()["num_alloc_retries"]}))
    """)
    r = subprocess.run([sys.executable, "-c", code], env=clean_env(TORCH_NEURONX_SIM_HBM="64MiB"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["y"] == torch.full((10 << 20,), 3.0).sum().item()
    assert out["z"] == torch.full((11 << 20,), 7.0).sum().item()
    assert out["retries"] >= 1


def test_streams_stress_matches_cpu():
    # Four streams; tensors made on one, consumed on others after events or wait_stream, freed
    # at random points; every result compared with the same program on CPU.
    rng = random.Random(0)
    streams = [torch.neuron.current_stream()] + [torch.neuron.Stream() for _ in range(3)]
    n = 1 << 16
    live_dev, live_cpu = {}, {}
    results = []
    for step in range(600):
        s = rng.randrange(4)
        with torch.neuron.stream(streams[s]):
            if not live_dev or rng.random() < 0.3:
                v = float(rng.randint(1, 9))
                live_dev[step] = torch.full((n,), v, device="neuron")
                live_cpu[step] = torch.full((n,), v)
                if rng.random() < 0.5:
                    torch.neuron._sleep(rng.choice([0.2, 1.0]))
                continue
            k = rng.choice(sorted(live_dev))
            # The producer's stream may differ: order after it as a user must.
            if rng.random() < 0.5:
                streams[s].wait_stream(streams[rng.randrange(4)])
            ev = torch.neuron.Event()
            for other in streams:
                if other is not streams[s]:
                    ev.record(other)
                    streams[s].wait_event(ev)
                    ev = torch.neuron.Event()
            a = live_dev[k] * 0.5 + 1.0
            b = live_cpu[k] * 0.5 + 1.0
            op = rng.randrange(3)
            if op == 0:
                live_dev[step], live_cpu[step] = a, b
            elif op == 1:
                results.append((a.sum(), b.sum()))
            else:
                del live_dev[k], live_cpu[k]
    torch.neuron.synchronize()
    for d, c in results:
        torch.testing.assert_close(d.cpu(), c)
    for k in live_dev:
        torch.testing.assert_close(live_dev[k].cpu(), live_cpu[k])
    assert len(results) > 50


PEAK = textwrap.dedent("""
    import json, sys, torch, torch_neuronx
    torch.manual_seed(0)
    def pending():
        return sum(len(ns) for _, ns in torch_neuronx._C._pending_tasks(0))
    out = {}
    # An MLP step (~30 kernels): 10 steps fit in the queue, so 10 are really in flight.
    mlp = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(1024, 1024), torch.nn.GELU())]).to("neuron")
    opt = torch.optim.AdamW(mlp.parameters())
    xb = torch.randn(512, 1024, device="neuron")
    def mlp_step():
        mlp(xb).square().mean().backward(); opt.step(); opt.zero_grad()
    # The 4-layer TransformerEncoder of the issue (d=256, batch 8x256).
    enc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True, dropout=0.0), 4).to("neuron")
    eopt = torch.optim.AdamW(enc.parameters())
    xe = torch.randn(8, 256, 256, device="neuron")
    def enc_step():
        enc(xe).square().mean().backward(); eopt.step(); eopt.zero_grad()
    for name, step, ks in (("mlp", mlp_step, (1, 3, 10)), ("encoder", enc_step, (3,))):
        step(); step(); torch.neuron.synchronize()
        for k in ks:
            torch.neuron.synchronize(); torch.neuron.reset_peak_memory_stats()
            base = torch.neuron.memory_allocated()
            torch.neuron._sleep(3000 if sys.argv[1] == "ahead" else 0)
            queued = 0
            for _ in range(k):
                step()
                queued = max(queued, pending())
            torch.neuron.synchronize()
            out[f"{name}{k}"] = {"peak": torch.neuron.max_memory_allocated() - base, "queued": queued}
    print(json.dumps(out))
""")


def test_peak_memory_with_steps_in_flight_matches_launch_blocking():
    def run(mode):
        env = clean_env(NEURON_LAUNCH_BLOCKING="1" if mode == "blocking" else "0")
        r = subprocess.run([sys.executable, "-c", PEAK, mode], env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        return json.loads(r.stdout.strip().splitlines()[-1])

    ahead, blocking = run("ahead"), run("blocking")
    for key, a in ahead.items():
        b = blocking[key]
        assert a["peak"] <= 1.15 * b["peak"], (key, a, b)
    # The run-ahead measurement had the steps queued, not already run.
    assert ahead["mlp10"]["queued"] >= 9 * ahead["mlp1"]["queued"], ahead
    assert ahead["encoder3"]["queued"] > 500, ahead
