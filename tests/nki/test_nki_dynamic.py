"""Dynamic control flow (Gen-2): sequencer registers (``nisa.register_alloc/move/load/store``) and
loops whose trip count is read from device memory when the kernel runs (``nl.dynamic_range``,
``nl.fori_loop``). The body is traced once; one traced kernel serves every trip count."""
import numpy as np
import pytest

from torch_neuronx import nki
import torch_neuronx.nki.v2.isa as nisa
import torch_neuronx.nki.v2.language as nl

P, H = 128, 2048


@nki.jit
def add_rows(a, b, n_tiles, out):
    """out[:128 n] = a + b over the first n 128-row tiles, n read from n_tiles when the kernel runs;
    the row offset is an SBUF counter (the NKI library's dynamic_elementwise_add pattern)."""
    n_sb = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=n_sb, src=n_tiles)
    n = nisa.register_alloc()
    nisa.register_load(n, n_sb)
    row = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=row, value=0)
    for _ in nl.dynamic_range(0, n, 1):
        ta = nl.ndarray((P, H), dtype=a.dtype, buffer=nl.sbuf)
        tb = nl.ndarray((P, H), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=ta, src=a.ap(pattern=[[H, P], [1, H]], offset=0, scalar_offset=row, indirect_dim=0))
        nisa.dma_copy(dst=tb, src=b.ap(pattern=[[H, P], [1, H]], offset=0, scalar_offset=row, indirect_dim=0))
        nisa.tensor_tensor(dst=ta, data1=ta, data2=tb, op=nl.add)
        nisa.dma_copy(dst=out.ap(pattern=[[H, P], [1, H]], offset=0, scalar_offset=row, indirect_dim=0), src=ta)
        nisa.tensor_scalar(dst=row, data=row, op0=nl.add, operand0=P)
    return out


def test_dynamic_range_runs_the_trip_count_read_at_run_time():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((8 * P, H)).astype(np.float32)
    b = rng.standard_normal((8 * P, H)).astype(np.float32)
    for n in (8, 3, 0, 1):  # one traced kernel
        out = np.full((8 * P, H), -1.0, np.float32)
        add_rows(a, b, np.array([[n]], np.int32), out)
        np.testing.assert_array_equal(out[:n * P], a[:n * P] + b[:n * P])
        assert (out[n * P:] == -1).all()  # rows of tiles the loop did not reach are untouched
    assert len(add_rows._cache) == 1
    assert add_rows.last_trace_stats.counts["dma_copy"] == 4  # the body was traced once


@nki.jit
def weighted_sum(x, w, n_tiles):
    """out = sum over n tiles of (x_i * w) with w loaded before the loop and read in it, and the
    accumulator made before the loop but first written in it."""
    out = nl.ndarray((P, H), dtype=x.dtype, buffer=nl.shared_hbm)
    tw = nl.ndarray((P, H), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tw, src=w)
    acc = nl.ndarray((P, H), dtype=nl.float32, buffer=nl.sbuf)
    n_sb = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=n_sb, src=n_tiles)
    n = nisa.register_alloc(None)
    nisa.register_load(n, n_sb)
    first = nisa.register_alloc(1)
    zero = nl.ndarray((P, H), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=zero, value=0.0)
    nisa.tensor_copy(dst=acc, src=zero)
    row = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=row, value=0)

    def body(i):
        t = nl.ndarray((P, H), dtype=x.dtype, buffer=nl.sbuf)  # new every iteration
        nisa.dma_copy(dst=t, src=x.ap(pattern=[[H, P], [1, H]], offset=0, scalar_offset=row, indirect_dim=0))
        prod = nl.ndarray((P, H), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=prod, data1=t, data2=tw, op=nl.multiply)  # tw's last use is in the loop
        later = nl.ndarray((P, H), dtype=nl.float32, buffer=nl.sbuf)  # made after it: must not take its memory
        nisa.tensor_scalar(dst=later, data=prod, op0=nl.multiply, operand0=1.0)
        nisa.tensor_tensor(dst=acc, data1=acc, data2=later, op=nl.add)
        nisa.tensor_scalar(dst=row, data=row, op0=nl.add, operand0=P)
    nl.fori_loop(first, n, body)  # from 1 to n
    nisa.dma_copy(dst=out, src=acc)
    return out


def test_tiles_used_across_iterations_keep_their_memory():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6 * P, H)).astype(np.float32)
    w = rng.standard_normal((P, H)).astype(np.float32)
    out = weighted_sum(x, w, np.array([[6]], np.int32))  # iterations 1..5: tiles 0..4 of x
    want = (x[:5 * P].reshape(5, P, H) * w).sum(0)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@nki.jit
def count_to(n_hbm, out):
    n_sb = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=n_sb, src=n_hbm)
    n = nisa.register_alloc()
    nisa.register_load(n, n_sb)
    last = nisa.register_alloc(-7)
    for i in nl.dynamic_range(2, n, 3):
        nisa.register_move(last, i)
    res = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.register_store(res, last)
    nisa.dma_copy(dst=out, src=res)
    return out


@pytest.mark.parametrize("n, last", [(12, 11), (3, 2), (2, -7), (0, -7)])
def test_registers_move_load_and_store(n, last):
    out = np.zeros((1, 1), np.int32)
    count_to(np.array([[n]], np.int32), out)
    assert out[0, 0] == last  # range(2, n, 3)'s last value, or the initial -7 without iterations


@nki.jit
def per_core_loop(counts, x):
    out = nl.ndarray((2, P, 512), dtype=x.dtype, buffer=nl.shared_hbm)
    core = nl.program_id(0)
    c_sb = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=c_sb, src=counts[core:core + 1, :])
    n = nisa.register_alloc()
    nisa.register_load(n, c_sb)
    t = nl.ndarray((P, 512), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[core])
    for _ in nl.dynamic_range(n):
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
    nisa.dma_copy(dst=out[core], src=t)
    return out


def test_logical_cores_run_a_dynamic_loop_together():
    x = np.random.default_rng(2).standard_normal((2, P, 512)).astype(np.float32)
    out = per_core_loop[2](np.array([[3], [3]], np.int32), x)
    np.testing.assert_array_equal(out, x * 8)
    with pytest.raises(RuntimeError, match="trip counts differ \\(3 and 5\\)"):
        per_core_loop[2](np.array([[3], [5]], np.int32), x)


def test_dynamic_loop_errors():
    @nki.jit
    def bad_step(x):
        r = nisa.register_alloc(2)
        for _ in nl.dynamic_range(0, 4, r):
            pass
        return x
    with pytest.raises(ValueError, match="dynamic_range step must be a positive integer constant"):
        bad_step(np.zeros((1, 1), np.float32))

    @nki.jit
    def as_python_int(x):
        r = nisa.register_alloc(2)
        return x[:, range(4)[r]]
    with pytest.raises(TypeError, match="a register holds a value only when the kernel runs"):
        as_python_int(np.zeros((4, 4), np.float32))

    @nki.jit
    def wide(x):
        t = nl.ndarray((1, 2), dtype=nl.int32, buffer=nl.sbuf)
        nisa.register_load(nisa.register_alloc(), t)
        return x
    with pytest.raises(ValueError, match="register_load src must hold exactly one element"):
        wide(np.zeros((1, 1), np.float32))


@nki.jit
def columns(x, n_hbm):
    """Iteration i writes column i of a tile made before the loop (first written in it): the tile is
    filled once, before the loop, and keeps every iteration's column."""
    out = nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    res = nl.ndarray((P, 8), dtype=nl.float32, buffer=nl.sbuf)
    col = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=col, value=0)
    t = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    n_sb = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=n_sb, src=n_hbm)
    n = nisa.register_alloc()
    nisa.register_load(n, n_sb)
    for _ in nl.dynamic_range(n):
        nisa.tensor_scalar(dst=res.ap(pattern=[[8, P], [1, 1]], offset=0, scalar_offset=col, indirect_dim=1),
                           data=t, op0=nl.add, operand0=1.0)
        nisa.tensor_copy(dst=t, src=res.ap(pattern=[[8, P], [1, 1]], offset=0, scalar_offset=col, indirect_dim=1))
        nisa.tensor_scalar(dst=col, data=col, op0=nl.add, operand0=1)
    nisa.dma_copy(dst=out, src=res)
    return out


def test_a_tile_first_written_in_a_loop_is_filled_once_before_it():
    x = np.arange(P, dtype=np.float32).reshape(P, 1)
    out = columns(x, np.array([[8]], np.int32))
    np.testing.assert_array_equal(out, x + np.arange(1, 9, dtype=np.float32))
    out = columns(x, np.array([[5]], np.int32))
    np.testing.assert_array_equal(out[:, :5], x + np.arange(1, 6, dtype=np.float32))
    assert np.isnan(out[:, 5:]).all()  # never written: the allocation's NaN
