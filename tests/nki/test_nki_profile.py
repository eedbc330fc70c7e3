"""``torch_neuronx.nki.profile``: the modeled NeuronCore time of a kernel — the published
per-instruction cycle formulas, engines running concurrently, ordered by the tiles they share."""
import numpy as np
import pytest

from torch_neuronx import nki
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl
from torch_neuronx.nki import samples

TENSOR_GHZ, VECTOR_GHZ, SCALAR_GHZ = 2.4, 0.96, 1.2  # Trainium2 (the default target)


def _matmul_kernel(n_moving, stationary_free=128):
    @nki.jit
    def k(a, b):
        out = nl.ndarray((stationary_free, n_moving), nl.float32, buffer=nl.shared_hbm)
        ps = nisa.nc_matmul(nl.load(a), nl.load(b))
        nl.store(out, value=nl.copy(ps))
        return out
    return k


@pytest.mark.parametrize("dtype, n_moving, stationary_free, cycles", [
    (np.float16, 512, 128, 512),       # max(min(64, 128), 512)
    (np.float16, 32, 128, 64),         # the 64-cycle floor
    (np.float16, 32, 16, 32),          # min(64, 16) = 16 < 32
    (np.float32, 512, 128, 4 * 512),   # fp32: 4x
])
def test_matmul_cycles_follow_the_published_formula(dtype, n_moving, stationary_free, cycles):
    a = np.ones((128, stationary_free), dtype)
    b = np.ones((128, n_moving), dtype)
    rep = nki.profile(_matmul_kernel(n_moving, stationary_free))(a, b)
    assert rep.busy_us["tensor"] == pytest.approx(cycles / TENSOR_GHZ / 1e3)
    assert rep.tensor_flops == 2 * 128 * stationary_free * n_moving
    np.testing.assert_allclose(rep.result, a.astype(np.float32).T @ b.astype(np.float32))
    assert "modeled" in str(rep)


def test_engines_overlap_unless_a_tile_orders_them():
    @nki.jit
    def independent(x):
        t = nl.load(x)
        a = nisa.activation(op=nl.exp, data=t)                      # Scalar Engine
        b = nisa.tensor_scalar(t, np.multiply, 2.0)                 # Vector Engine, same input
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.add(a, b))
        return out

    @nki.jit
    def chained(x):
        t = nl.load(x)
        a = nisa.activation(op=nl.exp, data=t)
        b = nisa.tensor_scalar(a, np.multiply, 2.0)                 # reads a: waits for it
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.add(a, b))
        return out
    x = np.random.rand(128, 2048).astype(np.float32)
    ind, ch = nki.profile(independent)(x), nki.profile(chained)(x)
    act = ind.busy_us["scalar"]
    assert act == pytest.approx(2048 / SCALAR_GHZ / 1e3)             # max(64, N) cycles
    assert ind.busy_us["vector"] == pytest.approx((2048 + 2 * 2048) / VECTOR_GHZ / 1e3)  # N + 2N (tensor_tensor)
    assert ch.busy_us == ind.busy_us and ch.latency_us > ind.latency_us  # same work, serialised by a
    steps = {name: (s, e) for name, _, s, e in ch.steps}
    assert steps["tensor_scalar"][0] >= steps["activation"][1]
    assert ind.latency_us < sum(ind.busy_us.values())                  # engines overlapped
    assert ind.dma_bytes == 2 * x.nbytes


def test_tiled_matmul_keeps_the_tensor_engine_busier_in_bf16_than_fp32():
    import ml_dtypes
    a = np.random.rand(512, 512).astype(np.float32)
    r32 = nki.profile(samples.matmul)(a, a)
    ab = a.astype(ml_dtypes.bfloat16)
    r16 = nki.profile(samples.matmul)(ab, ab)
    assert r32.tensor_flops == r16.tensor_flops == 2 * 512 ** 3
    assert r32.busy_us["tensor"] == pytest.approx(4 * r16.busy_us["tensor"])
    assert 0 < r16.tensor_utilization < 1 and 0 < r16.utilization("dma") <= 1


def test_writes_to_disjoint_parts_of_a_tile_overlap_and_dmas_share_bandwidth():
    @nki.jit
    def halves(x):
        t = nl.ndarray((128, 2, 1024), nl.float32, buffer=nl.sbuf)
        for i in range(2):
            t[:, i, :] = nl.load(x[:, i * 1024:(i + 1) * 1024])   # two blocks of one tile
        out = nl.ndarray((128, 2048), nl.float32, buffer=nl.shared_hbm)
        nl.store(out[:, 0:1024], value=nisa.tensor_scalar(t[:, 0, :], np.multiply, 1.0))
        return out
    r = nki.profile(halves)(np.random.rand(128, 2048).astype(np.float32))
    loads = [(s, e) for n, _, s, e in r.steps if n == "load"]
    assert loads[1][0] < loads[0][1]                 # the second load does not wait for the first
    # bytes (plus 512 bytes' time per contiguous 4 KiB row) at the shared DMA bandwidth (trn2: 16 x 23 B/ns)
    data_ns = (512 * 1024 + 128 * 512) / min(16 * 23, 3000 / 8)
    assert loads[1][1] - loads[0][1] == pytest.approx(data_ns / 1e3)  # ...but its bytes follow the first's


@pytest.mark.parametrize("row_bytes", [256, 2048, 4096])
def test_dma_bandwidth_grows_with_the_contiguous_bytes_per_partition(row_bytes):
    # AWS's DMA bandwidth guide: small runs per partition are overhead-bound, 2 KiB approaches
    # the peak and 4 KiB saturates it
    n = row_bytes // 4

    @nki.jit
    def copy(x):
        out = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(x))
        return out
    x = np.random.rand(128, n).astype(np.float32)
    r = nki.profile(copy)(x)
    np.testing.assert_array_equal(r.result, x)
    data_us = [e - s for name, _, s, e in r.steps if name == "load"][0] - 1.3  # less the fixed cost
    efficiency = (128 * row_bytes / (16 * 23)) / 1e3 / data_us
    assert efficiency == pytest.approx(row_bytes / (row_bytes + 512), rel=0.05)


def test_benchmark_reports_the_modeled_time_next_to_the_wall_clock():
    a = np.ones((128, 128), np.float16)
    b = np.ones((128, 512), np.float16)
    bench = nki.benchmark(_matmul_kernel(512), warmup=1, iters=3)
    out = bench(a, b)
    np.testing.assert_allclose(out, a.astype(np.float32).T @ b.astype(np.float32))
    res = bench.benchmark_result
    assert res.nc_latency.get_latency_percentile(50) > 0  # wall clock of the simulated launches
    modeled = res.modeled
    assert modeled.busy_us["tensor"] == pytest.approx(512 / TENSOR_GHZ / 1e3)
    assert modeled.latency_us == pytest.approx(nki.profile(_matmul_kernel(512))(a, b).latency_us)


def test_torch_profiler_shows_each_instruction_on_a_modeled_engine_track(tmp_path):
    import json

    import torch
    from torch.profiler import ProfilerActivity, profile
    a = torch.randn(128, 128).to(torch.bfloat16).to("neuron")
    b = torch.randn(128, 512).to(torch.bfloat16).to("neuron")
    k = _matmul_kernel(512)
    k(a, b)  # traced before the profiled region
    # ...and run: a launch reports its modeled steps when it runs, which could otherwise fall
    # inside the profiled region.
    torch.neuron.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        out = k(a, b)
        torch.neuron.synchronize()
    torch.testing.assert_close(out.cpu(), a.float().cpu().T @ b.float().cpu())
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    tracks = {e["args"]["name"]: e["tid"] for e in trace["traceEvents"]
              if e.get("ph") == "M" and e.get("name") == "thread_name"}
    modeled = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("args", {}).get("timing")]
    by_track = {}
    for e in modeled:
        by_track.setdefault(e["tid"], []).append(e)
    assert [e["name"] for e in by_track[tracks["tensor engine (modeled)"]]] == ["nc_matmul"]
    mm = by_track[tracks["tensor engine (modeled)"]][0]
    assert mm["dur"] == pytest.approx(512 / TENSOR_GHZ / 1e3, abs=0.01)   # the modeled cycles, in us
    dma = [e["name"] for e in by_track[tracks["dma queues (modeled)"]]]
    assert sorted(dma) == ["load", "load", "store"]
    assert all("modeled" in e["args"]["timing"] for e in modeled)


def test_modeled_launches_collects_every_launch_in_a_block():
    a = np.ones((128, 128), np.float16)
    b = np.ones((128, 512), np.float16)
    k = _matmul_kernel(512)
    with nki.modeled_launches() as launches:
        k(a, b)
        k(a, b)
    one = nki.profile(k)(a, b)
    assert len(launches) == 2 and launches.latency_us == pytest.approx(2 * one.latency_us)
    assert launches.tensor_utilization == pytest.approx(one.tensor_utilization)


def test_profile_of_a_grid_launch_counts_every_instance():
    a = np.ones((256, 512), np.float32)
    rep = nki.profile(samples.tensor_add)[2, 1](a, a)
    np.testing.assert_array_equal(rep.result, a + a)
    assert sum(1 for n, *_ in rep.steps if n == "tensor_tensor") == 2
