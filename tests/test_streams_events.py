"""Streams and events: torch.neuron.Stream/Event (torch.cuda names) and the generic
torch.Stream/torch.Event API on neuron. Ordering tests are built so that a missing wait
gives a wrong result: the side stream queues many in-place updates of a buffer that the
main stream then reads.
"""
import threading
import time

import pytest
import torch

N_STEPS = 200


def _queue_increments(buf, n=N_STEPS):
    for _ in range(n):
        buf.add_(1)


# --------------------------------------------------------------------------- streams


def test_stream_is_torch_stream():
    s = torch.neuron.Stream()
    assert isinstance(s, torch.Stream)
    assert s.device == torch.device("neuron", 0)
    assert s.device_index == 0
    assert s.stream_id != 0  # not the default stream
    assert s != torch.neuron.default_stream()
    assert "neuron" in repr(s)


def test_stream_on_other_device():
    s = torch.neuron.Stream(device=1)
    assert s.device == torch.device("neuron", 1)
    s2 = torch.neuron.Stream(device="neuron:1")
    assert s2.device_index == 1
    assert torch.neuron.current_device() == 0


def test_stream_priority():
    hi = torch.neuron.Stream(priority=-1)
    lo = torch.neuron.Stream(priority=0)
    assert hi.priority == -1
    assert lo.priority == 0
    assert torch.neuron.default_stream().priority == 0


def test_high_priority_stream_is_distinct_pool():
    # torch.cuda semantics: high- and normal-priority streams come from different pools, so
    # no high-priority stream is equal to a normal-priority one.
    hi = {torch.neuron.Stream(priority=-1).stream_id for _ in range(40)}
    lo = {torch.neuron.Stream(priority=0).stream_id for _ in range(40)}
    assert hi.isdisjoint(lo)
    assert 0 not in hi and 0 not in lo


def test_current_and_default_stream():
    d = torch.neuron.default_stream()
    assert d.stream_id == 0
    assert torch.neuron.current_stream() == d
    assert torch.neuron.default_stream(1).device_index == 1
    assert torch.neuron.current_stream(1) == torch.neuron.default_stream(1)
    assert torch.neuron.current_stream("neuron:1").device_index == 1


def test_stream_context_manager():
    s = torch.neuron.Stream()
    prev = torch.neuron.current_stream()
    with torch.neuron.stream(s):
        assert torch.neuron.current_stream() == s
        assert torch.accelerator.current_stream() == s
        t = torch.ones(4, device="neuron") * 3
    assert torch.neuron.current_stream() == prev
    s.synchronize()
    assert torch.equal(t.cpu(), torch.full((4,), 3.0))
    # None is a no-op.
    with torch.neuron.stream(None):
        assert torch.neuron.current_stream() == prev
    # Restored on exceptions.
    with pytest.raises(KeyError):
        with torch.neuron.stream(s):
            raise KeyError("x")
    assert torch.neuron.current_stream() == prev
    # StreamContext class form.
    with torch.neuron.StreamContext(s):
        assert torch.neuron.current_stream() == s
    assert torch.neuron.current_stream() == prev


def test_stream_context_on_other_device_switches_device():
    s1 = torch.neuron.Stream(device=1)
    with torch.neuron.stream(s1):
        assert torch.neuron.current_device() == 1
        assert torch.neuron.current_stream() == s1
        t = torch.arange(5, device="neuron")
    assert torch.neuron.current_device() == 0
    assert t.device == torch.device("neuron", 1)
    assert torch.equal(t.cpu(), torch.arange(5))


def test_set_stream():
    s = torch.neuron.Stream()
    try:
        torch.neuron.set_stream(s)
        assert torch.neuron.current_stream() == s
    finally:
        torch.neuron.set_stream(torch.neuron.default_stream())
    assert torch.neuron.current_stream().stream_id == 0


def test_current_stream_is_per_thread():
    s = torch.neuron.Stream()
    seen = {}
    with torch.neuron.stream(s):
        def worker():
            seen["id"] = torch.neuron.current_stream().stream_id

        th = threading.Thread(target=worker)
        th.start()
        th.join(timeout=30)
    assert not th.is_alive()
    assert seen["id"] == 0


def test_side_stream_then_wait_stream():
    side = torch.neuron.Stream()
    buf = torch.zeros(1 << 14, device="neuron")
    torch.neuron.synchronize()
    with torch.neuron.stream(side):
        _queue_increments(buf)
    torch.neuron.current_stream().wait_stream(side)
    out = buf * 2  # on the default stream, ordered after the side stream's work
    assert torch.equal(out.cpu(), torch.full((1 << 14,), 2.0 * N_STEPS))


def test_side_stream_waits_for_main_stream():
    side = torch.neuron.Stream()
    buf = torch.zeros(1 << 14, device="neuron")
    torch.neuron.synchronize()
    _queue_increments(buf)  # default stream
    side.wait_stream(torch.neuron.current_stream())
    with torch.neuron.stream(side):
        out = buf + 0.5
    side.synchronize()
    assert torch.equal(out.cpu(), torch.full((1 << 14,), N_STEPS + 0.5))


def test_wait_event_ordering():
    side = torch.neuron.Stream()
    buf = torch.zeros(1 << 14, device="neuron")
    torch.neuron.synchronize()
    with torch.neuron.stream(side):
        _queue_increments(buf)
        ev = torch.neuron.Event()
        ev.record()  # on the current (side) stream
    torch.neuron.current_stream().wait_event(ev)
    snap = buf.clone()  # on the default stream, after the side stream's increments
    assert torch.equal(snap.cpu(), torch.full((1 << 14,), float(N_STEPS)))


def test_event_marks_work_recorded_before_it():
    # An event recorded between two batches of side-stream work: waiting on it orders the main
    # stream after the first batch only; the second batch writes a different buffer.
    side = torch.neuron.Stream()
    first = torch.zeros(1 << 14, device="neuron")
    second = torch.zeros(1 << 14, device="neuron")
    torch.neuron.synchronize()
    with torch.neuron.stream(side):
        _queue_increments(first)
        ev = side.record_event()
        _queue_increments(second)
    torch.neuron.current_stream().wait_event(ev)
    out = first * 3
    assert torch.equal(out.cpu(), torch.full((1 << 14,), 3.0 * N_STEPS))
    side.synchronize()
    assert torch.equal(second.cpu(), torch.full((1 << 14,), float(N_STEPS)))


def test_event_wait_method_and_record_event():
    side = torch.neuron.Stream()
    buf = torch.zeros(1 << 14, device="neuron")
    torch.neuron.synchronize()
    with torch.neuron.stream(side):
        _queue_increments(buf)
    ev = side.record_event()
    assert isinstance(ev, torch.Event)
    ev.wait()  # the current stream waits
    total = buf.sum()
    assert total.item() == N_STEPS * (1 << 14)


def test_matmul_chain_on_side_stream_matches_cpu():
    torch.manual_seed(0)
    a = torch.randn(128, 128)
    x = a.to("neuron")
    side = torch.neuron.Stream(priority=-1)
    side.wait_stream(torch.neuron.current_stream())  # x's copy is on the default stream
    with torch.neuron.stream(side):
        y = x
        for _ in range(10):
            y = torch.tanh(y @ x / 16)
    torch.neuron.current_stream().wait_stream(side)
    z = y.sum(0)
    ref = a
    for _ in range(10):
        ref = torch.tanh(ref @ a / 16)
    torch.testing.assert_close(z.cpu(), ref.sum(0))


def test_stream_synchronize_and_query():
    s = torch.neuron.Stream()
    buf = torch.zeros(1 << 14, device="neuron")
    torch.neuron.synchronize()
    with torch.neuron.stream(s):
        _queue_increments(buf)
    s.synchronize()
    assert s.query() is True
    # After the stream synchronized, its results are visible without further waits.
    assert torch.equal(buf.cpu(), torch.full((1 << 14,), float(N_STEPS)))
    torch.neuron.synchronize()
    assert torch.neuron.default_stream().query() is True


def test_device_synchronize_covers_all_streams():
    streams = [torch.neuron.Stream() for _ in range(3)]
    bufs = [torch.zeros(4096, device="neuron") for _ in streams]
    torch.neuron.synchronize()
    for s, b in zip(streams, bufs):
        with torch.neuron.stream(s):
            _queue_increments(b, 50)
    torch.neuron.synchronize()
    for s in streams:
        assert s.query() is True
    for b in bufs:
        with torch.neuron.stream(torch.neuron.Stream()):
            assert torch.equal(b.cpu(), torch.full((4096,), 50.0))


# --------------------------------------------------------------------------- events


def test_event_query_and_synchronize():
    ev = torch.neuron.Event()
    assert ev.query() is True  # never recorded
    buf = torch.zeros(1 << 14, device="neuron")
    _queue_increments(buf)
    ev.record()
    ev.synchronize()
    assert ev.query() is True
    # Everything before the event is done: reading buf on a different stream needs no wait.
    with torch.neuron.stream(torch.neuron.Stream()):
        assert buf[0].item() == N_STEPS


def test_event_elapsed_time_positive():
    start = torch.neuron.Event(enable_timing=True)
    end = torch.neuron.Event(enable_timing=True)
    a = torch.randn(256, 256, device="neuron")
    torch.neuron.synchronize()
    t0 = time.perf_counter()
    start.record()
    for _ in range(20):
        a = torch.tanh(a @ a / 256)
    end.record()
    end.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1000
    ms = start.elapsed_time(end)
    assert isinstance(ms, float)
    assert 0 < ms <= wall_ms + 1.0


def test_event_elapsed_time_requires_timing():
    a = torch.neuron.Event()
    b = torch.neuron.Event()
    a.record()
    b.record()
    b.synchronize()
    # torch.Event's contract (c10::Event::elapsedTime) is a ValueError naming the flag.
    with pytest.raises(ValueError, match="enable_timing"):
        a.elapsed_time(b)


def test_torch_stream_without_index_uses_current_device():
    # torch.Stream(device="cuda") creates a stream on the current device; same for neuron.
    s = torch.Stream(device="neuron")
    assert s.device == torch.device("neuron", 0)
    with torch.neuron.device(1):
        s1 = torch.Stream(device="neuron")
    assert s1.device == torch.device("neuron", 1)


def test_torch_event_generic_api():
    s = torch.Stream(device="neuron:0")
    assert s.device.type == "neuron"
    start = torch.Event(device="neuron", enable_timing=True)
    end = torch.Event(device="neuron", enable_timing=True)
    buf = torch.zeros(1 << 14, device="neuron")
    torch.neuron.synchronize()
    start.record(s)
    with s:
        assert torch.accelerator.current_stream() == s
        _queue_increments(buf)
    end.record(s)
    end.wait(torch.accelerator.current_stream())
    out = buf * 1
    end.synchronize()
    assert end.query() is True
    assert start.elapsed_time(end) > 0
    assert torch.equal(out.cpu(), torch.full((1 << 14,), float(N_STEPS)))
    s.synchronize()
    assert s.query() is True


def test_torch_stream_wait_stream_generic():
    s = torch.Stream(device="neuron:0")
    buf = torch.zeros(1 << 14, device="neuron")
    torch.neuron.synchronize()
    with s:
        _queue_increments(buf)
    torch.accelerator.current_stream().wait_stream(s)
    assert torch.equal((buf - 1).cpu(), torch.full((1 << 14,), N_STEPS - 1.0))


def test_accelerator_set_stream():
    s = torch.Stream(device="neuron:0")
    prev = torch.accelerator.current_stream()
    torch.accelerator.set_stream(s)
    try:
        assert torch.accelerator.current_stream() == s
        assert torch.neuron.current_stream().stream_id == s.stream_id
    finally:
        torch.accelerator.set_stream(prev)
    assert torch.neuron.current_stream().stream_id == 0


def test_record_stream_keeps_a_block_from_reuse_until_the_side_stream_has_read_it():
    # x is allocated on the default stream, read on a side stream that is still busy, recorded
    # there and freed: its block must not go to a new tensor of the default stream (which writes
    # 7s into it) before the side stream has read x, and must be reusable once it has.
    side = torch.neuron.Stream()
    n = 3 << 20  # 12 MiB: a size no other tensor here has
    x = torch.full((n,), 3.0, device="neuron")
    busy = torch.full((1024, 1024), 1e-3, device="neuron")
    with torch.neuron.stream(side):
        torch.tanh(busy @ busy) * 5  # (first calls of a signature run inline: not in the timed part)
        x * 5
    torch.neuron.synchronize()
    with torch.neuron.stream(side):
        for _ in range(20):  # keeps the side stream busy well past the default stream's writes
            busy = torch.tanh(busy @ busy)
        y = x * 5
    x.record_stream(side)
    x_ptr = x.data_ptr()
    del x
    z = torch.full((n,), 7.0, device="neuron")  # same size class: the freed block if allowed
    assert not side.query(), "the side stream finished too early for this test to mean anything"
    assert z.data_ptr() != x_ptr, "the block went to the default stream while the side stream still reads it"
    side.synchronize()
    assert torch.equal(y.cpu(), torch.full((n,), 15.0))
    del z
    torch.neuron.synchronize()
    # Take cached blocks of this size until the allocator must reserve more: x's is among them.
    reserved, taken = torch.neuron.memory_reserved(), []
    while len(taken) < 64:
        taken.append(torch.empty(n, device="neuron"))
        if torch.neuron.memory_reserved() != reserved:
            break
    assert x_ptr in {t.data_ptr() for t in taken}, "the recorded block did not return to the pool after the side stream"


def test_event_on_other_device():
    with torch.neuron.device(1):
        ev = torch.neuron.Event()
        buf = torch.zeros(4096, device="neuron")
        _queue_increments(buf, 30)
        ev.record()
    ev.synchronize()
    assert ev.query() is True
    assert torch.equal(buf.cpu(), torch.full((4096,), 30.0))


def test_pending_tasks_lists_queued_ops_in_order():
    # The debugging view docs/device.md names: queued, not yet started tasks, by name.
    import torch_neuronx

    x = torch.ones(4, device="neuron")
    (x + 1).cpu()  # signatures validated: the ops below are queued
    (x * 2).relu().cpu()
    torch.neuron._sleep(300)
    y = (x + 1) * 2
    y = y.relu()
    names = [n for _, ns in torch_neuronx._C._pending_tasks(0) for n in ns]
    tail = names[-3:]
    assert tail == ["aten::add.Tensor", "aten::mul.Tensor", "aten::relu"], names
    torch.neuron.synchronize()
    assert all(not ns for _, ns in torch_neuronx._C._pending_tasks(0))
    assert torch.equal(y.cpu(), torch.full((4,), 4.0))
