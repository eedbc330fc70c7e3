"""Gen-2 (NKI 0.6) behaviours the NKI library relies on: ``tensor.buffer`` is the memory space,
``NKIObject`` built from keywords, ``.ap(dtype=)`` reinterprets bytes, operands of one element
count in different shapes, unary ALU operators, a stride-0 destination, fp32 immediates, and
NumPy arguments that are not row-major."""
from dataclasses import dataclass

import numpy as np
import pytest

from torch_neuronx import nki
import torch_neuronx.nki.v2.isa as nisa
import torch_neuronx.nki.v2.language as nl


def _sbuf(x):
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    return t


def test_tensor_buffer_is_its_memory_space():
    seen = {}

    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        t = _sbuf(x)
        p = nl.ndarray((128, 4), nl.float32, buffer=nl.psum)
        seen.update(arg=x.buffer, sbuf=t.buffer, psum=p.buffer, out=out.buffer, view=t[:, 0:2].buffer)
        nisa.dma_copy(dst=out, src=t)
        return out
    k(np.zeros((128, 4), np.float32))
    assert seen == {"arg": nl.hbm, "sbuf": nl.sbuf, "psum": nl.psum, "out": nl.shared_hbm, "view": nl.sbuf}
    assert seen["sbuf"] is nl.sbuf and seen["out"] in (nl.hbm, nl.shared_hbm, nl.private_hbm)


def test_nki_object_from_keywords():
    @dataclass
    class Params(nl.NKIObject):
        scale = None      # unannotated: no dataclass field
        shift = 1.0

    class Dims(nl.NKIObject):
        rows: int

    @dataclass
    class Partial(nl.NKIObject):
        a: int
        b: float

    assert Dims(rows=3).rows == 3 and Partial(a=1).b is None and Partial(1, 2.0).b == 2.0

    @nki.jit
    def k(x):
        p = Params(scale=2.0)
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        t = _sbuf(x)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=p.scale, op1=nl.add, operand1=p.shift)
        nisa.dma_copy(dst=out, src=t)
        return out
    x = np.random.rand(128, 8).astype(np.float32)
    assert np.allclose(k(x), 2 * x + 1)


def test_ap_dtype_reinterprets_bytes():
    @nki.jit
    def k(x):
        same = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x.ap(pattern=[[64, 128], [1, 64]], offset=0, dtype=x.dtype))
        nisa.dma_copy(dst=same, src=t)
        raw = nl.ndarray((128, 256), nl.uint8, buffer=nl.shared_hbm)  # each fp32 as its 4 bytes
        nisa.dma_copy(dst=raw, src=t.ap(pattern=[[256, 128], [1, 256]], dtype=nl.uint8))
        return same, raw
    x = np.random.rand(128, 64).astype(np.float32)
    same, raw = k(x)
    assert np.array_equal(same, x)
    assert np.array_equal(raw.view(np.float32), x)


def test_operands_of_one_element_count_in_different_shapes():
    # qk (128, 1280) minus a per-(row, head) max broadcast over 20 columns: (128, 64, 20)
    @nki.jit
    def k(qk, m):
        out = nl.ndarray(qk.shape, qk.dtype, buffer=nl.shared_hbm)
        a, mx = _sbuf(qk), _sbuf(m)
        r = nl.ndarray(qk.shape, qk.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=r, data1=a, data2=mx.ap(pattern=[[64, 128], [1, 64], [0, 20]]), op=nl.subtract)
        nisa.dma_copy(dst=out, src=r)
        return out
    qk = np.random.rand(128, 1280).astype(np.float32)
    m = np.random.rand(128, 64).astype(np.float32)
    assert np.allclose(k(qk, m), (qk.reshape(128, 64, 20) - m[:, :, None]).reshape(128, 1280))


def test_unary_alu_operators_and_a_stride_0_destination():
    @nki.jit
    def k(x):
        out = nl.ndarray((2, 128, 64), nl.float32, buffer=nl.shared_hbm)
        t = _sbuf(x)
        a = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        amax = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(dst=a, data=t, op0=nl.abs, operand0=0.0, reduce_op=nl.maximum, reduce_res=amax)
        nisa.dma_copy(dst=out[0], src=a)
        junk = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        sq = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)  # only the reduction is wanted
        nisa.activation_reduce(dst=junk.ap(pattern=[[1, 128], [0, 64]]), op=nl.square, data=t, reduce_op=nl.add,
                               reduce_res=sq)
        r = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=r, data=t, op0=nl.multiply, operand0=0.0, op1=nl.add, operand1=sq)
        nisa.tensor_tensor(dst=r, data1=r, data2=t, op=nl.subtract)
        nisa.tensor_scalar(dst=r, data=r, op0=nl.add, operand0=amax)
        nisa.dma_copy(dst=out[1], src=r)
        return out
    x = np.random.default_rng(0).normal(size=(128, 64)).astype(np.float32)
    out = k(x)
    assert np.array_equal(out[0], np.abs(x))
    expect = (x * x).sum(1, keepdims=True) - x + np.abs(x).max(1, keepdims=True)
    assert np.allclose(out[1], expect, rtol=1e-5, atol=1e-4)


def test_fp32_immediates_and_non_row_major_numpy_arguments():
    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        t = _sbuf(x)
        # -3.4028235e38 as Python writes float32's minimum (a double a hair past it)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.maximum, operand0=-3.4028235e38)
        nisa.dma_copy(dst=out, src=t.ap(pattern=[[32, 128], [1, 32]]))
        return out
    base = np.random.rand(32, 128).astype(np.float32)
    x = base.T  # column-major: HBM arguments are dense row-major, as on NKI
    assert not x.flags.c_contiguous
    assert np.array_equal(k(x), x)

    @nki.jit
    def writes(x):
        t = _sbuf(x)
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
        nisa.dma_copy(dst=x, src=t)
    y = np.asfortranarray(np.random.rand(128, 16).astype(np.float32))
    expect = 2 * y
    writes(y)
    assert np.array_equal(y, expect)  # written back into the caller's array


def test_nki_object_positional_overflow_is_an_error():
    class Dims(nl.NKIObject):
        rows: int
    with pytest.raises(TypeError, match="takes 1 positional arguments, got 2"):
        Dims(1, 2)


def test_dma_compute_sums_and_read_modify_writes(tmp_path):
    np.save(tmp_path / "bias.npy", np.full((128, 32), 0.5, np.float32))

    @nki.jit
    def k(a, b, idx):
        out = nl.ndarray((128, 32), nl.float32, buffer=nl.shared_hbm)
        x, y = _sbuf(a), _sbuf(b)
        s = nl.ndarray((128, 32), nl.float32, buffer=nl.sbuf)
        nisa.dma_compute(dst=s, srcs=[x, y], reduce_op=nl.add)              # s = a + b
        c = nl.shared_constant(str(tmp_path / "bias.npy"))                 # a constant from a .npy file
        nisa.dma_compute(dst=s, srcs=[c, s], reduce_op=nl.add, scales=[1.0, 1.0])  # s += 0.5 (RMW)
        nisa.dma_copy(dst=out, src=s)
        table = nl.ndarray((1000, 32), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=table, src=nl.shared_constant(np.zeros((1000, 32), np.float32)))
        r = nl.ndarray((128, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=r, src=idx)
        rows = table.ap([[32, 128], [1, 32]], offset=0, vector_offset=r, indirect_dim=0)
        nisa.dma_compute(dst=rows, srcs=[rows, s], reduce_op=nl.add)       # scatter-add into the rows
        return out, table
    a = np.random.rand(128, 32).astype(np.float32)
    b = np.random.rand(128, 32).astype(np.float32)
    idx = np.random.default_rng(4).permutation(1000)[:128].reshape(128, 1).astype(np.int32)
    out, table = k(a, b, idx)
    assert np.allclose(out, a + b + 0.5)
    expect = np.zeros((1000, 32), np.float32)
    expect[idx[:, 0]] = a + b + 0.5
    assert np.allclose(table, expect)
    with pytest.raises(ValueError, match="reduce_op=nl.add only"):
        nki.jit(lambda a, b, idx: nisa.dma_compute(dst=_sbuf(a), srcs=[_sbuf(a)], reduce_op=nl.maximum))(a, b, idx)


def test_packed_mx_dtypes_and_gen2_names_exist():
    import torch_neuronx.nki.v2 as nki2
    for name in ("float8_e4m3fn_x4", "float8_e5m2_x4", "float4_e2m1fn_x4", "float8_e8m0fnu"):
        assert isinstance(getattr(nl, name), nki2.dtype)
    assert nl.float8_e4m3fn_x4.itemsize == 4 and nl.float4_e2m1fn_x4.itemsize == 2
    assert nisa.dma_engine.dma.value == 1

    @nki.jit
    def k(words):  # packed words move through memory unchanged
        out = nl.ndarray(words.shape, nl.float8_e4m3fn_x4, buffer=nl.shared_hbm)
        t = nl.ndarray(words.shape, nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=words)
        nisa.dma_copy(dst=out, src=t)
        return out
    w = np.random.default_rng(5).integers(0, 2**32, size=(128, 8), dtype=np.uint32).view(nl.float8_e4m3fn_x4)
    assert np.array_equal(np.asarray(k(w)).view(np.uint32), w.view(np.uint32))


def test_gen2_range_select():
    @nki.jit
    def k(x, lo, hi):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        red = nl.ndarray((x.shape[0], 1), x.dtype, buffer=nl.shared_hbm)
        t, b0, b1 = _sbuf(x), _sbuf(lo), _sbuf(hi)
        r = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        m = nl.ndarray((x.shape[0], 1), x.dtype, buffer=nl.sbuf)
        nisa.range_select(dst=r, on_true_tile=t, comp_op0=nl.greater_equal, comp_op1=nl.less, bound0=b0, bound1=b1,
                          reduce_res=m, reduce_op=nl.maximum, range_start=10)
        nisa.dma_copy(dst=out, src=r)
        nisa.dma_copy(dst=red, src=m)
        return out, red
    x = np.random.rand(128, 64).astype(np.float32)
    lo = np.full((128, 1), 20, np.float32)
    hi = np.full((128, 1), 50, np.float32)
    out, red = k(x, lo, hi)
    i = 10 + np.arange(64)
    ref = np.where((i >= 20) & (i < 50), x, np.finfo(np.float32).min)
    assert np.array_equal(out, ref) and np.array_equal(red[:, 0], ref.max(1))


def test_logical_cores_exchange_tiles_with_sendrecv():
    # each core reduces its half of the columns, then they swap partials (an LNC all-reduce)
    @nki.jit
    def k(x):
        out = nl.ndarray((2, 128, 1), x.dtype, buffer=nl.shared_hbm)
        core = nl.program_id(0)
        half = x.shape[1] // 2
        t = nl.ndarray((128, half), x.dtype, buffer=nl.sbuf, address=(0, 0))  # the same address on both cores
        nisa.dma_copy(dst=t, src=x[:, core * half:(core + 1) * half])
        mine = nl.ndarray((128, 1), x.dtype, buffer=nl.sbuf, address=(0, 65536))
        nisa.tensor_reduce(dst=mine, op=nl.add, data=t, axis=1)
        theirs = nl.ndarray((128, 1), x.dtype, buffer=nl.sbuf, address=(0, 65600))
        for rnd in range(2):  # two rounds on one pipe
            nisa.sendrecv(src=mine, dst=theirs, send_to_rank=1 - core, recv_from_rank=1 - core, pipe_id=0)
        total = nl.ndarray((128, 1), x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=total, data1=mine, data2=theirs, op=nl.add)
        nisa.dma_copy(dst=out[core], src=total)
        return out
    x = np.random.rand(128, 2048).astype(np.float32)
    out = k[2](x)
    assert np.allclose(out[0, :, 0], x.sum(1), rtol=1e-5) and np.allclose(out[1], out[0])
    assert k.last_trace_stats.counts["sendrecv"] == 4  # 2 rounds x 2 directions


def test_core_barrier_orders_writes_to_shared_hbm():
    @nki.jit
    def k(x):
        shared = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        core = nl.program_id(0)
        rows = slice(core * 64, (core + 1) * 64)
        t = nl.ndarray((64, x.shape[1]), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[rows])
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=float(core + 1))
        nisa.dma_copy(dst=shared[rows], src=t)
        nisa.core_barrier(data=shared, cores=(0, 1))
        other = slice((1 - core) * 64, (2 - core) * 64)  # the half the other core wrote
        u = nl.ndarray((64, x.shape[1]), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=u, src=shared[other])
        nisa.dma_copy(dst=out[other], src=u)
        return out
    x = np.random.rand(128, 32).astype(np.float32)
    out = k[2](x)
    assert np.allclose(out[:64], x[:64]) and np.allclose(out[64:], 2 * x[64:])


def test_sendrecv_without_a_partner_is_an_error():
    @nki.jit
    def k(x):
        t = _sbuf(x)
        u = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        nisa.sendrecv(src=t, dst=u, send_to_rank=1, recv_from_rank=1, pipe_id=0)
    x = np.zeros((128, 4), np.float32)
    with pytest.raises(ValueError, match=r"launch the kernel as kernel\[2\]"):
        k(x)

    @nki.jit
    def one_sided(x):
        t = _sbuf(x)
        if nl.program_id(0) == 0:
            u = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
            nisa.sendrecv(src=t, dst=u, send_to_rank=1, recv_from_rank=1, pipe_id=0)
    with pytest.raises(RuntimeError, match="wait for partners that finished without meeting them"):
        one_sided[2](x)


def test_reduce_commands_chain_the_engine_registers():
    @nki.jit
    def k(a, b):
        out = nl.ndarray((4, 128, 1), nl.float32, buffer=nl.shared_hbm)
        x, y = _sbuf(a), _sbuf(b)
        junk = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        r = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        # Vector Engine: max over x, then over y on top (no reduce_res on the first), negated
        nisa.tensor_scalar_reduce(dst=junk, data=x, op0=nl.multiply, operand0=1.0, reduce_op=nl.maximum)
        nisa.tensor_scalar_reduce(dst=junk, data=y, op0=nl.multiply, operand0=1.0, reduce_op=nl.maximum,
                                  reduce_res=r, reduce_cmd=nisa.reduce_cmd.reduce, reduce_res_negate=True)
        nisa.dma_copy(dst=out[0], src=r)
        # load_reduce: start from 100 and add the row sums
        nisa.tensor_scalar_reduce(dst=junk, data=x, op0=nl.add, operand0=0.0, reduce_op=nl.add, reduce_res=r,
                                  reduce_cmd=nisa.reduce_cmd.load_reduce, reduce_init=100.0)
        nisa.dma_copy(dst=out[1], src=r)
        # Scalar Engine: sum of exp over x then y, read out by the second
        nisa.activation(dst=junk, op=nl.exp, data=x, reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.activation(dst=junk, op=nl.exp, data=y, reduce_op=nl.add, reduce_res=r,
                        reduce_cmd=nisa.reduce_cmd.reduce)
        nisa.dma_copy(dst=out[2], src=r)
        # reset, then reduce: the registers start from zero
        nisa.activation(dst=junk, op=nl.copy, data=x, reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reset)
        nisa.activation(dst=junk, op=nl.copy, data=y, reduce_op=nl.add, reduce_res=r,
                        reduce_cmd=nisa.reduce_cmd.reduce)
        nisa.dma_copy(dst=out[3], src=r)
        return out
    a = np.random.rand(128, 64).astype(np.float32)
    b = np.random.rand(128, 64).astype(np.float32)
    out = k(a, b)[:, :, 0]
    assert np.allclose(out[0], -np.maximum(a.max(1), b.max(1)))
    assert np.allclose(out[1], 100 + a.sum(1), rtol=1e-5)
    assert np.allclose(out[2], np.exp(a).sum(1) + np.exp(b).sum(1), rtol=1e-5)
    assert np.allclose(out[3], b.sum(1), rtol=1e-5)


def test_float_to_int_rounds_to_nearest_even_and_1d_hbm_stores():
    @nki.jit
    def k(x):
        out = nl.ndarray((x.shape[0],), nl.int32, buffer=nl.shared_hbm)
        t = _sbuf(x)
        q = nl.ndarray(x.shape, nl.int32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=q, src=t)
        nisa.dma_copy(dst=out[0:x.shape[0]], src=q[0:x.shape[0], 0])  # (n, 1) on chip to a 1-D HBM range
        return out
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.49, 2.51, -2.7] * 16, np.float32).reshape(128, 1)
    assert np.array_equal(k(x), np.rint(x[:, 0]).astype(np.int32))


def test_select_reduce_chains_the_vector_registers():
    @nki.jit
    def k(a, b, p):
        out = nl.ndarray((128, 1), nl.float32, buffer=nl.shared_hbm)
        x, y, pr = _sbuf(a), _sbuf(b), _sbuf(p)
        s = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        r = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.select_reduce(dst=s, predicate=pr, on_true=x, on_false=-1.0, reduce_op=nl.maximum,
                           reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.select_reduce(dst=s, predicate=pr, on_true=y, on_false=-1.0, reduce_op=nl.maximum, reduce_res=r,
                           reduce_cmd=nisa.reduce_cmd.reduce)
        nisa.dma_copy(dst=out, src=r)
        return out
    rng = np.random.default_rng(9)
    a, b = rng.random((128, 64)).astype(np.float32), rng.random((128, 64)).astype(np.float32)
    p = (rng.random((128, 64)) < 0.5).astype(np.float32)
    ref = np.maximum(np.where(p > 0, a, -1).max(1), np.where(p > 0, b, -1).max(1))
    assert np.allclose(k(a, b, p)[:, 0], ref)


def test_reshape_merges_contiguous_dims_and_indirect_scatter_keeps_its_rows():
    @nki.jit
    def k(x, idx, offs):
        out = nl.ndarray((128, 512), x.dtype, buffer=nl.shared_hbm)
        s = nl.ndarray((128, 32, 128), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=s, src=x)
        nisa.dma_copy(dst=out, src=s[:, 0:4, :].reshape((128, 512)))  # 4 x 128 contiguous per partition
        table = nl.ndarray((300, 64), x.dtype, buffer=nl.shared_hbm)
        z = nl.ndarray((100, 64), x.dtype, buffer=nl.sbuf)
        nisa.memset(dst=z, value=0.0)
        for r in range(3):
            nisa.dma_copy(dst=table[r * 100:(r + 1) * 100, :], src=z)
        ids = nl.ndarray((128, 1), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=ids, src=idx)
        # an indirect destination whose pattern has another shape than the source: rows stay rows
        nisa.dma_copy(dst=table.ap(pattern=[[64, 128], [1, 1], [1, 64]], offset=0, vector_offset=ids,
                                   indirect_dim=0), src=s[:, 0, 0:64])
        o = nl.ndarray((1, 2), nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=o, src=offs)
        for i in range(2):  # a run-time row outside the table is skipped under oob_mode.skip
            nisa.dma_copy(dst=table.ap(pattern=[[64, 1], [1, 64]], offset=0, scalar_offset=o[0:1, i:i + 1],
                                       indirect_dim=0), src=s[0:1, 1, 0:64], oob_mode=nisa.oob_mode.skip)
        return out, table
    rng = np.random.default_rng(10)
    x = rng.random((128, 32, 128)).astype(np.float32)
    idx = rng.permutation(300)[:128].reshape(128, 1).astype(np.int32)
    out, table = k(x, idx, np.array([[299, -1000000]], np.int32))
    assert np.array_equal(out, x[:, 0:4, :].reshape(128, 512))
    want = np.zeros((300, 64), np.float32)
    want[idx[:, 0]] = x[:, 0, 0:64]
    want[299] = x[0, 1, 0:64]
    assert np.array_equal(table, want)


def test_logical_cores_run_side_by_side():
    # core 1 initialises the output at once; core 0 writes it after a long computation. Cores that run
    # at the same pace (as on hardware) leave core 0's value; one core running ahead would not.
    import torch_neuronx.nki.v2 as nki2

    @nki2.jit  # Gen-2: kernel[lnc] launches logical cores
    def k(x):
        out = nl.ndarray((128, 8), nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 8), nl.float32, buffer=nl.sbuf, address=(0, 0))  # each core's own SBUF
        if nl.program_id(0) == 1:
            nisa.memset(dst=t, value=0.0)
            nisa.dma_copy(dst=out, src=t)
        else:
            nisa.memset(dst=t, value=1.0)
            for _ in range(8):
                nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=1.0)
            nisa.dma_copy(dst=out, src=t)
        return out
    assert (k[2](np.zeros((1,), np.float32)) == 1).all()


def test_collectives_of_one_rank_and_the_error_for_several():
    import torch_neuronx.nki.v2.collectives as ncc
    one = ncc.ReplicaGroup([[0]])

    @nki.jit
    def k(x, y):
        out = nl.ndarray((2,) + x.shape, x.dtype, buffer=nl.shared_hbm)
        a, b = _sbuf(x), _sbuf(y)
        g = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        ncc.all_gather(srcs=[a], dsts=[g], replica_group=one, collective_dim=1)
        s = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
        ncc.collective_permute_implicit_reduce([[g]], [[b]], [[s]], replica_group=one, op=nl.maximum)
        ncc.all_reduce(srcs=[x], dsts=[out[0]], replica_group=one, op=nl.add)  # HBM to HBM
        nisa.dma_copy(dst=out[1], src=s)
        return out
    x, y = np.random.rand(2, 128, 256).astype(np.float32)
    out = k(x, y)
    assert np.array_equal(out[0], x) and np.array_equal(out[1], np.maximum(x, y))

    @nki.jit
    def two(x):
        ncc.all_reduce(srcs=[x], dsts=[x], replica_group=ncc.ReplicaGroup([[0, 1]]), op=nl.add)
        return x
    with pytest.raises(NotImplementedError, match=r"replica group \[0, 1\] spans 2 ranks"):
        two(x)
