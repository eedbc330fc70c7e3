"""Gen-2 instructions NKI 0.6 added to the Scalar, Vector and GpSimd Engines (``exponential``,
``activate2``, the XORWOW generators ``rng``/``rand2``/``set_rng_seed``/``rand_set_state``/
``rand_get_state``) and the language's ``while_loop``, ``no_reorder`` and ``gather_flattened``."""
import numpy as np
import pytest

from torch_neuronx import nki
import torch_neuronx.nki.v2.isa as nisa
import torch_neuronx.nki.v2.language as nl

P, F = 128, 2048


def _sbuf(x):
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    return t


def _out(t, shape=None):
    o = nl.ndarray(shape or t.shape, t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=o, src=t)
    return o


def test_exponential_subtracts_the_max_and_sums_in_the_vector_registers():
    @nki.jit
    def k(x, m):
        t, mt = _sbuf(x), _sbuf(m)
        e = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        s = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)
        half = x.shape[1] // 2
        nisa.exponential(dst=e[:, :half], src=t[:, :half], max_value=mt, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.exponential(dst=e[:, half:], src=t[:, half:], max_value=mt, reduce_res=s,
                         reduce_cmd=nisa.reduce_cmd.reduce)  # the sum continues across the two calls
        c = nl.ndarray(x.shape, nl.bfloat16, buffer=nl.sbuf)
        nisa.exponential(dst=c, src=t, max_value=2.0)
        return _out(e), _out(s), _out(c)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((P, F)).astype(np.float32)
    m = x.max(1, keepdims=True)
    e, s, c = k(x, m)
    np.testing.assert_allclose(e, np.exp(x - m), rtol=1e-6)
    np.testing.assert_allclose(s[:, 0], np.exp(x - m).sum(1), rtol=1e-5)
    np.testing.assert_allclose(c.astype(np.float32), np.exp(x - 2.0), rtol=8e-3)


@pytest.mark.parametrize("op0, op1, ref", [
    (nl.multiply, nl.add, lambda x, a, b: np.tanh(x * a + b)),
    (nl.multiply, nl.subtract, lambda x, a, b: np.tanh(x * a - b)),
    (nl.add, nl.bypass, lambda x, a, b: np.tanh(x + a)),
    (nl.bypass, nl.bypass, lambda x, a, b: np.tanh(x)),
])
def test_activate2_pipeline(op0, op1, ref):
    @nki.jit
    def k(x, a):
        t, at_ = _sbuf(x), _sbuf(a)
        y = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        r = nl.ndarray((P, 1), nl.float32, buffer=nl.sbuf)
        nisa.activate2(dst=y, op=nl.tanh, data=t, imm0=at_, imm1=0.25, op0=op0, op1=op1, reduce_op=nl.add,
                       reduce_res=r, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        return _out(y), _out(r)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((P, F)).astype(np.float32)
    a = rng.standard_normal((P, 1)).astype(np.float32)
    y, r = k(x, a)
    want = ref(x, a, 0.25)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(r[:, 0], want.sum(1), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="not one of the supported pairs"):
        @nki.jit
        def bad(x):
            t = _sbuf(x)
            nisa.activate2(dst=t, op=nl.exp, data=t, imm0=1.0, imm1=1.0, op0=nl.add, op1=nl.multiply)
            return x
        bad(x)


@nki.jit
def random_kernel(seed, state6):
    s = _sbuf(seed)
    nisa.set_rng_seed(src_seeds=s)
    bits = nl.ndarray((P, F), nl.uint32, buffer=nl.sbuf)
    nisa.rng(dst=bits)
    small = nl.ndarray((P, F), nl.int8, buffer=nl.sbuf)
    nisa.rng(dst=small)
    u = nl.ndarray((P, F), nl.float32, buffer=nl.sbuf)
    nisa.rand2(dst=u, min=-2.0, max=3.0)
    st = _sbuf(state6)
    nisa.rand_set_state(src_seeds=st)  # GpSimd lanes
    g = nl.ndarray((P, 8), nl.uint32, buffer=nl.sbuf)
    nisa.rng(dst=g, engine=nisa.engine.gpsimd)
    after = nl.ndarray((P, 6), nl.uint32, buffer=nl.sbuf)
    nisa.rand_get_state(dst=after)
    return _out(bits), _out(small), _out(u), _out(g), _out(after)


def _xorwow(s):
    t = s[4]
    x0 = s[0]
    s[4], s[3], s[2], s[1] = s[3], s[2], s[1], x0
    t ^= t >> 2
    t = (t ^ (t << 1)) & 0xFFFFFFFF
    t ^= x0 ^ ((x0 << 4) & 0xFFFFFFFF)
    s[0] = t
    s[5] = (s[5] + 362437) & 0xFFFFFFFF
    return (t + s[5]) & 0xFFFFFFFF


def test_random_generators_are_seeded_xorwow_lanes():
    rng_ = np.random.default_rng(2)
    state = rng_.integers(1, 2**32, size=(P, 6), dtype=np.uint64).astype(np.uint32)
    a = random_kernel(np.array([[1234]], np.uint32), state)
    b = random_kernel(np.array([[1234]], np.uint32), state)
    c = random_kernel(np.array([[99]], np.uint32), state)
    bits, small, u, g, after = a
    assert all(np.array_equal(x, y) for x, y in zip(a, b))  # the same seed repeats the draws
    assert not np.array_equal(bits, c[0])
    assert 0.45 < (bits >> 31).mean() < 0.55 and len(np.unique(bits)) > 0.99 * bits.size
    assert small.dtype == np.int8 and small.min() < -100 and small.max() > 100
    assert u.min() >= -2.0 and u.max() <= 3.0 and abs(u.mean() - 0.5) < 0.02
    # the GpSimd lanes were set from `state`: their draws and final state are XORWOW's
    for p in (0, 77):
        s = [int(v) for v in state[p]]
        assert [_xorwow(s) for _ in range(8)] == g[p].tolist() and s == after[p].tolist()


def test_while_loop_runs_while_its_register_is_nonzero():
    @nki.jit
    def k(count, data):
        val = _sbuf(data)
        acc = nl.ndarray((1, 1), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=0.0)
        n = _sbuf(count)
        one = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=one, value=1)
        reg = nisa.register_alloc()
        nisa.register_load(reg, n)

        def body(r):
            nisa.tensor_tensor(dst=acc, data1=acc, data2=val, op=nl.add)
            nisa.tensor_tensor(dst=n, data1=n, data2=one, op=nl.subtract)
            nisa.register_load(r, n)
            return r
        with pytest.raises(ValueError, match="not supported inside an nl.no_reorder"):
            with nl.no_reorder():
                nl.while_loop(reg, body)
        nl.while_loop(reg, body)
        return _out(acc)
    for n in (5, 0, 1):
        out = k(np.array([[n]], np.int32), np.array([[1.5]], np.float32))
        assert out[0, 0] == 1.5 * n


def test_no_reorder_and_gather_flattened():
    @nki.jit
    def k(x, idx):
        with nl.no_reorder():
            t = _sbuf(x)
            i = _sbuf(idx)
            g = nl.gather_flattened(t, i)
        return _out(g)
    x = np.random.default_rng(3).standard_normal((P, 64)).astype(np.float32)
    idx = np.random.default_rng(4).integers(0, 64, (P, 16)).astype(np.uint32)
    np.testing.assert_array_equal(k(x, idx), np.take_along_axis(x, idx.astype(np.int64), 1))
