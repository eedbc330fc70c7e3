"""GpSimd selection instructions (match_replace8, stream_shuffle, sequence_bounds, local_gather)
and indices read at run time (Gen-1 ``t[i_p, off[0, j] + i_f]``, Gen-2 ``.ap(scalar_offset=)``,
``.ap(vector_offset=)``, ``select``/``vector_select``), each against a NumPy reference."""
import numpy as np
import pytest

from torch_neuronx import nki
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl
import torch_neuronx.nki.v2.isa as nisa2
import torch_neuronx.nki.v2.language as nl2


def _match_replace_reference(a, vals, imm):
    out, idx = a.copy(), np.full(vals.shape, -1, np.int64)
    for p in range(a.shape[0]):
        taken = np.zeros(a.shape[1], bool)
        for k, v in enumerate(vals[p]):
            hits = np.nonzero((out[p] == v) & ~taken)[0]
            if hits.size:
                idx[p, k] = hits[0]
                taken[hits[0]] = True
                out[p, hits[0]] = imm
    return out, idx


def test_match_replace8_replaces_the_top8_and_returns_indices():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        idx_out = nl.ndarray((a.shape[0], 8), nl.uint32, buffer=nl.shared_hbm)
        t = nl.load(a)
        idx = nl.ndarray((a.shape[0], 8), nl.uint32)
        r = nisa.nc_match_replace8(data=t, vals=nisa.max8(src=t), imm=-1.0, dst_idx=idx)
        nl.store(out, value=r)
        nl.store(idx_out, value=idx)
        return out, idx_out
    a = np.random.rand(128, 1000).astype(np.float32)
    a[:, 7] = a[:, 3] = 2.0  # a repeated maximum: the second match takes the next occurrence
    out, idx = k(a)
    ref, ref_idx = _match_replace_reference(a, -np.sort(-a, axis=1)[:, :8], -1.0)
    assert np.array_equal(out, ref)
    assert np.array_equal(idx.astype(np.int64), ref_idx)
    assert (idx[:, :2] == [3, 7]).all()


def test_match_replace8_gen2_and_checks():
    @nki.jit
    def k(a):
        out = nl2.ndarray(a.shape, a.dtype, buffer=nl2.shared_hbm)
        t = nl2.ndarray(a.shape, a.dtype, buffer=nl2.sbuf)
        nisa2.dma_copy(dst=t, src=a)
        m = nl2.ndarray((a.shape[0], 8), a.dtype, buffer=nl2.sbuf)
        nisa2.max8(dst=m, src=t)
        r = nl2.ndarray(a.shape, a.dtype, buffer=nl2.sbuf)
        nisa2.nc_match_replace8(dst=r, data=t, vals=m, imm=0.0)
        nisa2.dma_copy(dst=out, src=r)
        return out
    a = np.random.rand(64, 32).astype(np.float32)
    assert np.array_equal(k(a), _match_replace_reference(a, -np.sort(-a, axis=1)[:, :8], 0.0)[0])

    @nki.jit
    def bad(a):
        t = nl.load(a)
        nisa.nc_match_replace8(data=t, vals=t[:, 0:4], imm=0.0)
    with pytest.raises(ValueError, match="vals must hold 8 values per partition, got 4"):
        bad(np.zeros((8, 16), np.float32))


def test_stream_shuffle_within_quadrants_broadcast_and_skip():
    @nki.jit
    def k(a, b):
        out = nl.ndarray((2, 128, 64), nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        nisa.nc_stream_shuffle(src=t, dst=t, shuffle_mask=[(i + 5) % 32 for i in range(32)])  # in place
        nl.store(out[0], value=t)
        row = nl.load(b)
        u = nl.full((32, 64), 7.0, nl.float32)
        nisa.nc_stream_shuffle(src=row, dst=u, shuffle_mask=[0] * 16 + [255] * 16)  # broadcast, half skipped
        nl.store(out[1, 0:32], value=u)
        return out
    a = np.random.rand(128, 64).astype(np.float32)
    b = np.random.rand(1, 64).astype(np.float32)
    out = k(a, b)
    perm = [q * 32 + (i + 5) % 32 for q in range(4) for i in range(32)]
    assert np.array_equal(out[0], a[perm])
    assert np.array_equal(out[1][:16], np.repeat(b, 16, 0)) and (out[1][16:32] == 7).all()

    @nki.jit
    def too_few(b):
        row = nl.load(b)
        u = nl.ndarray((128, 64), nl.float32)
        nisa.nc_stream_shuffle(src=row, dst=u, shuffle_mask=[1] * 32)
    with pytest.raises(IndexError, match="takes source partition 1 but src has 1 partitions"):
        too_few(b)


def _bounds_reference(seq):
    n = len(seq)
    lo, hi = np.zeros(n), np.zeros(n)
    for i in range(n):
        lo[i] = n if seq[i] == 0 else (lo[i - 1] if i and seq[i] == seq[i - 1] else i)
    for i in range(n - 1, -1, -1):
        hi[i] = -1 if seq[i] == 0 else (hi[i + 1] if i < n - 1 and seq[i] == seq[i + 1] else i + 1)
    return np.stack([lo, hi])


def test_sequence_bounds_with_padding():
    @nki.jit
    def k(ids):
        out = nl.ndarray((ids.shape[0], 2, ids.shape[1]), ids.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nisa.sequence_bounds(segment_ids=nl.load(ids)))
        return out
    rng = np.random.default_rng(0)
    ids = np.sort(rng.integers(0, 40, size=(128, 512)), axis=1).astype(np.float32)
    ids[:, -20:] = 0  # trailing padding
    out = k(ids)
    assert np.array_equal(out, np.stack([_bounds_reference(r) for r in ids]))


def test_local_gather_per_core():
    @nki.jit
    def k(src, index):
        out = nl.ndarray((128, 40 * 4), src.dtype, buffer=nl.shared_hbm)
        g = nisa.local_gather(nl.load(src), nl.load(index), num_elem_per_idx=4, num_valid_indices=40)
        nl.store(out, value=g.reshape((128, 160)))
        return out
    rng = np.random.default_rng(1)
    src = rng.random((128, 2048)).astype(np.float32)
    rows = rng.integers(0, 512, size=(128, 4))
    out = k(src, (rows * 4).astype(np.uint16))
    ref = np.empty((128, 40, 4), np.float32)
    for c in range(8):
        idx = rows[c * 16:(c + 1) * 16].flatten(order="F")[:40]  # partition dim first
        ref[c * 16:(c + 1) * 16] = src[c * 16:(c + 1) * 16].reshape(16, 512, 4)[:, idx]
    assert np.array_equal(out, ref.reshape(128, 160))

    @nki.jit
    def bad(src, index):
        nisa.local_gather(nl.load(src), nl.load(index), num_elem_per_idx=3)
    with pytest.raises(ValueError, match="num_elem_per_idx must be one of"):
        bad(src, (rows * 4).astype(np.uint16))


def test_copy_from_an_offset_read_at_run_time():
    @nki.jit
    def k(src, offsets):
        out = nl.ndarray((128, 64), src.dtype, buffer=nl.shared_hbm)
        s, off = nl.load(src), nl.load(offsets)
        o = nl.ndarray((128, 64), src.dtype)
        ix, iy = nl.mgrid[0:128, 0:1]
        for j in nl.affine_range(64):
            o[ix, j] = nisa.tensor_copy_dynamic_src(s[ix, off[0, j] + iy])
        nl.store(out, value=o)
        return out
    src = np.random.rand(128, 512).astype(np.float32)
    offsets = np.random.default_rng(2).integers(0, 512, size=(1, 64)).astype(np.int32)
    assert np.array_equal(k(src, offsets), src[:, offsets[0]])
    # an index past the end is caught when the instruction runs
    with pytest.raises(IndexError, match=r"run-time index 512 reaches outside dimension 1 .*size 512.*\[0, 511\]"):
        k(src, np.full((1, 64), 512, np.int32))


def test_gen2_run_time_offsets():
    @nki.jit
    def k(a, which):
        out = nl2.ndarray((3, 128, 256), a.dtype, buffer=nl2.shared_hbm)
        i = nl2.ndarray((1, 1), nl2.int32, buffer=nl2.sbuf)
        nisa2.dma_copy(dst=i, src=which)
        # batch `i` of a (4, 128, 256): element offset i * 128 * 256
        nisa2.dma_copy(dst=out[0], src=a.ap([[256, 128], [1, 256]], offset=0, scalar_offset=i, indirect_dim=0))
        nisa2.dma_copy(dst=out[1], src=a.select(0, i))
        t = nl2.ndarray((128, 4, 256), a.dtype, buffer=nl2.sbuf)
        for b in range(4):
            nisa2.dma_copy(dst=t[:, b, :], src=a[b])
        u = nl2.ndarray((128, 256), a.dtype, buffer=nl2.sbuf)
        nisa2.tensor_copy(dst=u, src=t.ap([[1024, 128], [1, 256]], offset=0, scalar_offset=i, indirect_dim=1))
        nisa2.dma_copy(dst=out[2], src=u)
        return out
    a = np.random.rand(4, 128, 256).astype(np.float32)
    out = k(a, np.array([[2]], np.int32))
    assert all(np.array_equal(out[j], a[2]) for j in range(3))


def test_gen2_vector_select_gathers_rows():
    @nki.jit
    def k(a, rows):
        out = nl2.ndarray((64, 512), a.dtype, buffer=nl2.shared_hbm)
        r = nl2.ndarray((64, 1), nl2.int32, buffer=nl2.sbuf)
        nisa2.dma_copy(dst=r, src=rows)
        g = nl2.ndarray((64, 512), a.dtype, buffer=nl2.sbuf)
        nisa2.dma_copy(dst=g, src=a.vector_select(0, r))
        nisa2.dma_copy(dst=out, src=g)
        return out
    a = np.random.rand(1000, 512).astype(np.float32)
    rows = np.random.default_rng(3).integers(0, 1000, size=(64, 1)).astype(np.int32)
    assert np.array_equal(k(a, rows), a[rows[:, 0]])


def test_nonzero_with_count_per_gpsimd_core():
    @nki.jit
    def k(x):
        out = nl2.ndarray((128, 65), nl2.int32, buffer=nl2.shared_hbm)
        t = nl2.ndarray(x.shape, x.dtype, buffer=nl2.sbuf)
        nisa2.dma_copy(dst=t, src=x)
        r = nl2.ndarray((128, 65), nl2.int32, buffer=nl2.sbuf)
        nisa2.memset(dst=r, value=7)
        nisa2.nonzero_with_count(dst=r, src=t, index_offset=16, padding_val=-1)
        nisa2.dma_copy(dst=out, src=r)
        return out
    x = (np.random.default_rng(6).random((128, 64)) < 0.3).astype(np.float32)
    out = k(x)
    for p in range(128):
        if p % 16:
            assert (out[p] == 7).all()  # only each core's first partition is written
            continue
        idx = np.nonzero(x[p])[0]
        assert out[p, -1] == len(idx)
        assert np.array_equal(out[p, :len(idx)], idx + 16) and (out[p, len(idx):64] == -1).all()


@pytest.mark.parametrize("dtype", [np.float32, np.uint32, np.int8])
def test_nc_n_gather_within_each_partition(dtype):
    @nki.jit
    def k(x, idx):
        out = nl2.ndarray((128, 4, 64), x.dtype, buffer=nl2.shared_hbm)
        t = nl2.ndarray(x.shape, x.dtype, buffer=nl2.sbuf)
        nisa2.dma_copy(dst=t, src=x)
        i = nl2.ndarray(idx.shape, nl2.uint32, buffer=nl2.sbuf)
        nisa2.dma_copy(dst=i, src=idx)
        g = nl2.ndarray((128, 4, 64), x.dtype, buffer=nl2.sbuf)
        nisa2.nc_n_gather(dst=g, data=t, indices=i)
        nisa2.dma_copy(dst=out, src=g)
        return out
    rng = np.random.default_rng(8)
    x = (rng.random((128, 8, 100)) * 100).astype(dtype)  # uint32: the top-k kernels gather indices
    idx = rng.integers(0, 800, size=(128, 4, 64)).astype(np.uint32)
    out = k(x, idx)
    assert np.array_equal(out, np.take_along_axis(x.reshape(128, -1), idx.reshape(128, -1).astype(np.int64),
                                                  1).reshape(128, 4, 64))
