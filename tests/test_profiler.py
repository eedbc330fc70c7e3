"""torch.profiler on neuron: the Kineto PrivateUse1 plugin (device kernels and copies linked
to their CPU ops, stream tracks, device time in key_averages), the legacy use_device profiler,
and device time against a kernel of known length."""
import json
import os
import threading
import time

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from torch_neuronx.tools.telemetry import read_processes

ACTS = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


def _device_events(prof):
    return [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1]


def _kernels_executed():
    """Kernels the runtime executed in this process, from its published counters."""
    (me,) = [p for p in read_processes() if p.pid == os.getpid()]
    return sum(c.kernels for c in me.cores)


def test_private_use1_activity_is_supported():
    assert ProfilerActivity.PrivateUse1 in torch.profiler.supported_activities()


def test_training_step_trace_covers_every_kernel_with_streams():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.GELU(), torch.nn.LayerNorm(256),
                                torch.nn.Linear(256, 10)).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(64, 128, device="neuron")
    y = torch.randint(0, 10, (64,), device="neuron")
    side = torch.neuron.Stream()
    torch.neuron.synchronize()
    before = _kernels_executed()
    with profile(activities=ACTS) as prof:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        with torch.neuron.stream(side):
            extra = x.cos()
        side.synchronize()
        host = loss.cpu()
    executed = _kernels_executed() - before
    events = _device_events(prof)
    assert executed > 20
    assert len(events) >= 0.95 * executed, (len(events), executed)
    assert len(events) <= executed
    by_name = {}
    for e in events:
        by_name.setdefault(e.name, set()).add(e.device_resource_id)
    assert by_name["aten::cos"] == {side.stream_id}
    assert by_name["aten::addmm"] == {0}
    assert "neuron::copy_d2h" in by_name  # the .cpu() copy
    assert all(e.device_index == 0 and e.time_range.elapsed_us() >= 0 for e in events)
    # Device time is attributed to the launching ops (forward, backward thread and optimizer).
    avg = {e.key: e for e in prof.key_averages()}
    for op in ("aten::addmm", "aten::mm", "aten::native_layer_norm"):
        assert avg[op].self_device_time_total > 0, op
    assert avg["aten::linear"].device_time_total >= avg["aten::addmm"].self_device_time_total > 0
    assert torch.isfinite(host) and extra.shape == x.shape


def test_device_time_matches_a_kernel_of_known_length():
    torch.neuron.synchronize()
    with profile(activities=ACTS) as prof:
        t0 = time.perf_counter()
        torch.neuron._sleep(50)
        torch.neuron.synchronize()
        wall_us = (time.perf_counter() - t0) * 1e6
    (k,) = [e for e in _device_events(prof) if e.name == "neuron::sleep"]
    assert 50_000 <= k.time_range.elapsed_us() <= wall_us
    assert k.time_range.elapsed_us() >= 0.9 * wall_us - 5_000  # the kernel is most of the wall time


def test_chrome_trace_has_one_track_per_stream_and_launch_arrows(tmp_path):
    side = torch.neuron.Stream()
    a = torch.randn(256, 256, device="neuron")
    torch.neuron.synchronize()
    with profile(activities=ACTS) as prof:
        b = a @ a
        with torch.neuron.stream(side):
            c = a.exp()
        torch.neuron.synchronize()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())["traceEvents"]
    kernels = [e for e in trace if e.get("cat") == "kernel"]
    assert {(e["name"], e["tid"]) for e in kernels} >= {("aten::mm", 0), ("aten::exp", side.stream_id)}
    assert all(e["pid"] == 0 and e["args"]["stream"] == e["tid"] for e in kernels)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace if e.get("name") == "thread_name"}
    assert names[(0, 0)] == "stream 0 (default)" and names[(0, side.stream_id)] == f"stream {side.stream_id}"
    procs = {e["pid"]: e["args"]["name"] for e in trace if e.get("name") == "process_name"}
    assert procs[0] == "neuron:0"
    flows = [e for e in trace if e.get("cat") == "ac2g"]
    assert len(flows) >= 2 * len(kernels)  # a start (the launch) and an end (the kernel) each
    assert b.shape == c.shape


def test_profiles_back_to_back_and_cpu_only_profiles():
    a = torch.randn(64, 64, device="neuron")
    for _ in range(2):
        with profile(activities=ACTS) as prof:
            (a + 1).sum().item()
        names = {e.name for e in _device_events(prof)}
        assert {"aten::add.Tensor", "aten::sum.dim_IntList"} <= names
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        (a * 2).sum().item()
    assert not _device_events(prof)
    assert any(e.name == "aten::mul" for e in prof.events())


def test_ops_from_another_thread_are_attributed():
    a = torch.randn(128, 128, device="neuron")
    torch.neuron.synchronize()

    def work():
        (a @ a).sum().item()

    with profile(activities=ACTS) as prof:
        t = threading.Thread(target=work)
        t.start()
        t.join()
    avg = {e.key: e for e in prof.key_averages()}
    assert avg["aten::mm"].self_device_time_total > 0


def test_legacy_profiler_use_device():
    a = torch.randn(256, 256, device="neuron")
    torch.neuron.synchronize()
    with torch.autograd.profiler.profile(use_device="neuron") as prof:
        for _ in range(3):
            b = a @ a
        torch.neuron.synchronize()
    (mm,) = [e for e in prof.key_averages() if e.key == "aten::mm"]
    assert mm.count == 3 and mm.device_time_total > 0
    assert b.device.type == "neuron"


def test_failed_kernel_is_in_the_trace_and_marked(tmp_path):
    a = torch.randn(4, device="neuron")
    # Computed on the device: the kernel, not the host, finds 9 out of range (seen_values.h).
    idx = torch.arange(2, device="neuron") * 9
    with profile(activities=ACTS) as prof:
        a[idx]
        with pytest.raises(IndexError, match="out of bounds"):
            torch.neuron.synchronize()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    kernels = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "kernel"]
    bad = [e for e in kernels if e["name"] == "aten::index.Tensor"]
    assert bad and all(e["args"].get("status") == "failed" for e in bad)
    torch.neuron.synchronize()  # reported once: the device is usable again


@pytest.mark.parametrize("ms", [-1, 60_001, float("nan")])
def test_sleep_rejects_bad_durations(ms):
    with pytest.raises(ValueError, match="milliseconds must be in"):
        torch.neuron._sleep(ms)
