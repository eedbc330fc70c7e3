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
    data_ns = 512 * 1024 / min(16 * 27 * 1.073741824, 3000 / 8)  # bytes at the shared DMA bandwidth
    assert loads[1][1] - loads[0][1] == pytest.approx(data_ns / 1e3)  # ...but its bytes follow the first's
