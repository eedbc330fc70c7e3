"""Each instruction against a NumPy reference, at its dtypes, with and without masks."""
import ml_dtypes
import numpy as np
import pytest

from torch_neuronx import nki
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl

rng = np.random.default_rng(0)
BF16 = np.dtype(ml_dtypes.bfloat16)


def rand(*shape, dtype=np.float32, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32).astype(dtype)


def unary_kernel(fn, out_shape=None, out_dtype=None):
    """A kernel loading its inputs as tiles, applying fn, storing the result."""
    def k(*args):
        tiles = [nl.load(a) for a in args]
        r = fn(*tiles)
        out = nl.ndarray(out_shape or r.shape, dtype=out_dtype or r.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=r)
        return out
    return nki.jit(k)


def run(fn, *arrays, **kw):
    return nki.simulate_kernel(unary_kernel(fn, **kw), *arrays)


def close(out, ref, dtype):
    tol = 1e-5 if dtype == np.float32 else 1e-2
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32), rtol=tol, atol=tol)


ALU = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "maximum": np.maximum,
       "minimum": np.minimum, "divide": np.divide}


@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("op", list(ALU))
def test_tensor_tensor(op, dtype):
    a, b = rand(128, 512, dtype=dtype), rand(128, 512, dtype=dtype, lo=0.5)
    out = run(lambda x, y: nisa.tensor_tensor(x, y, getattr(nl, op)), a, b)
    assert out.dtype == dtype
    ref = ALU[op](a.astype(np.float32), b.astype(np.float32)).astype(dtype)
    close(out, ref, dtype)


def test_numpy_ufuncs_are_accepted_as_ops():
    a, b = rand(64, 256), rand(64, 256)
    close(run(lambda x, y: nisa.tensor_tensor(x, y, np.maximum), a, b), np.maximum(a, b), np.float32)
    close(run(lambda x: nisa.activation(np.exp, x), a), np.exp(a), np.float32)


ACT = {"exp": np.exp, "tanh": np.tanh, "relu": lambda x: np.maximum(x, 0), "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
       "square": np.square, "abs": np.abs, "negative": np.negative, "sin": np.sin, "copy": lambda x: x,
       "silu": lambda x: x / (1 + np.exp(-x)), "softplus": lambda x: np.log1p(np.exp(x))}


@pytest.mark.parametrize("fn", list(ACT))
def test_activation_with_scale_and_bias(fn):
    # inputs within every function's valid range (sin: [-pi, pi])
    a, bias, scale = rand(128, 300, lo=-1.5, hi=1.5), rand(128, 1, lo=-1.5, hi=1.5), rand(128, 1, lo=0.5, hi=1.0)
    out = run(lambda x, b, s: nisa.activation(op=getattr(nl, fn) if fn != "copy" else "copy", data=x, bias=b, scale=s),
              a, bias, scale)
    close(out, ACT[fn](a * scale + bias), np.float32)
    out = run(lambda x: nisa.activation(op=getattr(nl, fn) if fn != "copy" else "copy", data=x, scale=0.5), a)
    close(out, ACT[fn](a * 0.5), np.float32)


@pytest.mark.parametrize("fn,bad", [("sin", 3.5), ("log", 0.0), ("rsqrt", -1.0), ("arctan", 2.0)])
def test_activation_input_outside_its_range_is_an_error(fn, bad):
    a = rand(128, 64, lo=0.5, hi=1.0)
    a[5, 7] = bad
    with pytest.raises(ValueError, match=f"activation {fn} input {bad:g} is outside its valid range"):
        run(lambda x: nisa.activation(op=getattr(nl, fn), data=x), a)
    # a masked-off position is not computed, so not checked
    out = run(lambda x: nisa.activation(op=getattr(nl, fn), data=x[0:128, 0:64],
                                        mask=(nl.arange(128)[:, None] < 5)), a)
    close(out[:5], getattr(np, {"rsqrt": "sqrt"}.get(fn, fn))(a[:5]) ** (-1 if fn == "rsqrt" else 1), np.float32)


def test_activation_reduce_and_tensor_scalar_reduce():
    a = rand(128, 512)

    def k(x):
        r = nl.ndarray((128, 1), nl.float32)
        nisa.activation_reduce(op=nl.exp, data=x, reduce_op=nl.add, reduce_res=r)
        return r
    close(run(k, a), np.exp(a).sum(1, keepdims=True), np.float32)

    def k2(x):
        r = nl.ndarray((128, 1), nl.float32)
        nisa.tensor_scalar_reduce(data=x, op0=nl.multiply, operand0=2.0, reduce_op=nl.maximum, reduce_res=r)
        return r
    close(run(k2, a), (a * 2).max(1, keepdims=True), np.float32)


@pytest.mark.parametrize("reverse", [False, True])
def test_tensor_scalar_constants_and_vectors(reverse):
    a, v = rand(128, 256), rand(128, 1, lo=0.5)
    out = run(lambda x, s: nisa.tensor_scalar(x, nl.subtract, s, reverse0=reverse, op1=nl.multiply, operand1=3.0), a, v)
    ref = ((v - a) if reverse else (a - v)) * 3.0
    close(out, ref, np.float32)


def test_scalar_tensor_tensor_and_scan():
    a, b, s = rand(128, 64), rand(128, 64), rand(128, 1)
    out = run(lambda x, y, z: nisa.scalar_tensor_tensor(data=x, op0=nl.multiply, operand0=z, op1=nl.add, operand1=y),
              a, b, s)
    close(out, a * s + b, np.float32)
    out = run(lambda x, y: nisa.tensor_tensor_scan(x, y, 0.0, nl.multiply, nl.add), a, b)
    ref = np.zeros_like(a)
    acc = np.zeros(128, np.float32)
    for i in range(64):
        acc = acc * a[:, i] + b[:, i]
        ref[:, i] = acc
    close(out, ref, np.float32)


@pytest.mark.parametrize("op,np_op", [("add", np.sum), ("maximum", np.max), ("minimum", np.min)])
def test_tensor_reduce_free_axes(op, np_op):
    a = rand(128, 8, 64)
    close(run(lambda x: nisa.tensor_reduce(getattr(nl, op), x, axis=[1, 2], keepdims=True), a),
          np_op(a, axis=(1, 2), keepdims=True), np.float32)
    close(run(lambda x: nisa.tensor_reduce(getattr(nl, op), x, axis=2, negate=True), a, out_shape=(128, 8)),
          -np_op(a, axis=2), np.float32)
    # nl reductions take any free axes (the compiler's transposes)
    close(run(lambda x: nl.sum(x, axis=1), a), a.sum(1), np.float32)


def test_partition_reduce():
    a = rand(128, 96)
    close(run(lambda x: nisa.tensor_partition_reduce(nl.add, x), a), a.sum(0, keepdims=True), np.float32)


@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["fp32", "bf16"])
def test_nc_matmul_accumulates_fp32(dtype):
    s, m = rand(128, 96, dtype=dtype), rand(128, 500, dtype=dtype)
    out = run(lambda x, y: nisa.nc_matmul(x, y), s, m)
    assert out.dtype == np.float32
    ref = s.astype(np.float32).T @ m.astype(np.float32)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-3)
    # nl.matmul with and without transpose_x
    x, y = rand(64, 128), rand(128, 256)
    np.testing.assert_allclose(run(lambda p, q: nl.matmul(p, q), x, y), x @ y, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(run(lambda p, q: nl.matmul(p, q, transpose_x=True), x.T.copy(), y), x @ y,
                               rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("shape,engine", [((128, 96), nisa.tensor_engine), ((32, 16), nisa.vector_engine)])
def test_transposes(shape, engine):
    a = rand(*shape)
    assert np.array_equal(run(lambda x: nisa.nc_transpose(x, engine=engine), a), a.T)
    assert np.array_equal(run(lambda x: nl.transpose(x), a), a.T)

    @nki.jit
    def dma(x):
        t = nisa.dma_transpose(x)
        out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=t)
        return out
    assert np.array_equal(nki.simulate_kernel(dma, a), a.T)

    @nki.jit
    def load_t(x):
        t = nl.load_transpose2d(x)
        out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=t)
        return out
    assert np.array_equal(nki.simulate_kernel(load_t, a), a.T)


def test_copy_casts_with_rounding():
    a = rand(128, 200)
    out = run(lambda x: nisa.tensor_copy(x, dtype=nl.bfloat16), a)
    assert out.dtype == BF16 and np.array_equal(out, a.astype(BF16))
    out = run(lambda x: nl.copy(x, dtype=nl.float16), a)
    assert out.dtype == np.float16 and np.array_equal(out, a.astype(np.float16))


def test_iota_memset_affine_select():
    @nki.jit
    def k():
        i = nisa.iota(nl.arange(128)[:, None] * 512 + nl.arange(512)[None, :], dtype=nl.int32)
        z = nisa.memset((128, 512), 7.0, nl.float32)
        iq, ik = nl.mgrid[0:128, 0:512]
        sel = nisa.affine_select(iq - ik >= 0, z, -1.0)
        o1 = nl.ndarray((128, 512), nl.int32, buffer=nl.shared_hbm)
        o2 = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
        nl.store(o1, value=i)
        nl.store(o2, value=sel)
        return o1, o2
    o1, o2 = nki.simulate_kernel(k)
    assert np.array_equal(o1, np.arange(128 * 512).reshape(128, 512))
    iq, ik = np.mgrid[0:128, 0:512]
    assert np.array_equal(o2, np.where(iq >= ik, 7.0, -1.0))


def test_bn_stats_and_aggr():
    a = rand(128, 1024) * 3 + 1

    def k(x):
        s = nl.ndarray((128, 12), nl.float32)
        s[:, 0:6] = nisa.bn_stats(x[:, 0:512])
        s[:, 6:12] = nisa.bn_stats(x[:, 512:1024])
        return nisa.bn_aggr(s)
    out = run(k, a)
    close(out, np.stack([a.mean(1), a.var(1)], 1), np.float32)


def test_reciprocal_max8_find_index8_gather():
    a = rand(32, 128, lo=0.5)
    close(run(lambda x: nisa.reciprocal(x), a), 1 / a, np.float32)
    top = run(lambda x: nisa.max8(src=x), a)
    assert np.array_equal(top, -np.sort(-a, axis=1)[:, :8])
    idx = run(lambda x: nisa.nc_find_index8(data=x, vals=nisa.max8(src=x)), a)
    assert np.array_equal(idx, np.argsort(-a, axis=1)[:, :8])
    ind = rng.integers(0, 128, size=(32, 16)).astype(np.uint32)
    assert np.array_equal(run(lambda x, i: nl.gather_flattened(x, i), a, ind), np.take_along_axis(a, ind, 1))


def test_dropout_statistics():
    a = np.ones((128, 2048), np.float32)
    out = run(lambda x: nisa.dropout(x, 0.25), a)
    kept = (out != 0).mean()
    assert 0.72 < kept < 0.78 and set(np.unique(out)) <= {0.0, 1.0}


@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["fp32", "bf16"])
def test_masked_elementwise_leaves_the_rest(dtype):
    a, b = rand(128, 64, dtype=dtype), rand(128, 64, dtype=dtype)

    @nki.jit
    def k(x, y):
        i_p, i_f = nl.mgrid[0:128, 0:64]
        out = nl.ndarray((128, 64), x.dtype, buffer=nl.shared_hbm)
        tx, ty = nl.load(x), nl.load(y)
        r = nl.zeros((128, 64), x.dtype)
        r[i_p, i_f] = nl.add(tx, ty, mask=(i_p >= i_f))  # causal: non-rectangular
        nl.store(out, value=r)
        return out
    out = nki.simulate_kernel(k, a, b)
    i_p, i_f = np.mgrid[0:128, 0:64]
    ref = np.where(i_p >= i_f, (a.astype(np.float32) + b.astype(np.float32)).astype(dtype), 0)
    close(out, ref, dtype)  # the masked-off positions keep r's zeros (no NaN of the add's result)


def test_promotion_rules():
    from torch_neuronx.nki._emit import promote
    import torch
    assert promote(torch.float16, torch.bfloat16) == torch.float32
    assert promote(torch.float8_e4m3fn, torch.float8_e5m2) == torch.bfloat16
    assert promote(torch.int32, torch.uint32) == torch.float32
    assert promote(torch.int8, torch.uint8) == torch.int16
    a = rand(128, 64, dtype=np.float16)
    assert run(lambda x: nl.multiply(x, 1.5), a).dtype == np.float32  # Python float is fp32


def test_copy_predicated_and_select_reduce():
    a, b = rand(128, 256), rand(128, 256)
    pred = (a > 0).astype(np.float32)

    def k(x, y, p):
        nisa.tensor_copy_predicated(src=x, dst=y, predicate=p)
        return y
    np.testing.assert_array_equal(run(k, a, b, pred), np.where(pred != 0, a, b))

    def k2(x, p, f):
        d = nl.ndarray(x.shape, nl.float32)
        r = nl.ndarray((128, 1), nl.float32)
        nisa.select_reduce(dst=d, predicate=p, on_true=x, on_false=f, reduce_res=r, reduce_op=nl.max,
                           reverse_pred=True)
        return r
    f = rand(128, 1)
    sel = np.where(pred == 0, a, np.broadcast_to(f, a.shape))
    np.testing.assert_array_equal(run(k2, a, pred, f), sel.max(1, keepdims=True))


def test_tensor_scalar_cumulative_register_chains_across_instructions():
    a, v = rand(128, 96), rand(128, 1)

    def k(x, imm):
        d1 = nl.ndarray(x.shape, nl.float32)
        nisa.tensor_scalar_cumulative(src=x, dst=d1, op0=nl.multiply, op1=nl.add, imm0=imm, imm1=1.5,
                                      reduce_cmd=nisa.reduce_cmd.load_reduce)
        d2 = nl.ndarray(x.shape, nl.float32)
        nisa.tensor_scalar_cumulative(src=x, dst=d2, op0=nl.add, op1=nl.maximum, imm0=0.0,
                                      reduce_cmd=nisa.reduce_cmd.reset_reduce)
        d3 = nl.ndarray(x.shape, nl.float32)
        nisa.tensor_scalar_cumulative(src=x, dst=d3, op0=nl.add, op1=nl.maximum, imm0=1.0,
                                      reduce_cmd=nisa.reduce_cmd.reduce)  # continues from d2's register
        return nl.add(nl.add(d1, d2), d3)
    c1 = 1.5 + np.cumsum(a * v, axis=1)
    c2 = np.maximum.accumulate(a, axis=1)
    c3 = np.maximum.accumulate(np.concatenate([a, a + 1], axis=1), axis=1)[:, 96:]
    close(run(k, a, v), c1 + c2 + c3, np.float32)


def test_precise_fp_off_keeps_low_precision_tiles_in_fp32(monkeypatch):
    a = rand(128, 64)

    def k(x):
        t = nl.multiply(x, 3.0, dtype=nl.bfloat16)
        assert t.dtype == nl.bfloat16  # the kernel still sees the dtype it asked for
        return nl.multiply(t, 1.0, dtype=nl.float32)
    rounded = run(k, a)
    np.testing.assert_array_equal(rounded, (a * 3).astype(BF16).astype(np.float32))
    monkeypatch.setenv("NKI_PRECISE_FP", "0")
    np.testing.assert_allclose(run(k, a), a * 3, rtol=1e-6)


def test_range_select_and_returning_a_tile():
    a = rand(128, 256)
    lo, hi = np.full((128, 1), 40.0, np.float32), rand(128, 1, lo=60, hi=200)

    @nki.jit
    def k(x, b0, b1):
        r = nl.ndarray((128, 1), nl.float32)
        out = nisa.range_select(on_true_tile=nl.load(x), comp_op0=np.greater_equal, comp_op1=np.less,
                                bound0=nl.load(b0), bound1=nl.load(b1), reduce_res=r, reduce_op=np.max,
                                range_start=16, on_false_value=-1e30)
        return out, r  # SBUF tiles come back as arrays
    out, r = nki.simulate_kernel(k, a, lo, hi)
    i = 16 + np.arange(256)[None, :]
    ref = np.where((i >= lo) & (i < hi), a, -1e30)
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(r, ref.max(1, keepdims=True))


def test_random_seed_makes_random_instructions_repeat():
    a = np.ones((128, 512), np.float32)

    def seeded(seed):
        def k(x):
            if seed is not None:
                nl.random_seed(seed)
            return nisa.dropout(x, 0.5)
        return k
    s1, s1b, s2 = run(seeded(7), a), run(seeded(7), a), run(seeded(8), a)
    assert np.array_equal(s1, s1b) and not np.array_equal(s1, s2)
    unseeded = unary_kernel(seeded(None))
    assert not np.array_equal(nki.simulate_kernel(unseeded, a), nki.simulate_kernel(unseeded, a))


def test_device_print_shows_values_when_the_kernel_runs(capfd):
    def k(x):
        t = nl.exp(x)
        nl.device_print("exp =", t)
        return t
    a = np.arange(24, dtype=np.float32).reshape(2, 12) / 10
    run(k, a)
    out = capfd.readouterr().out
    assert "exp = [2, 12]" in out
    row0 = out.split("[[", 1)[1].split("]", 1)[0].split()
    assert len(row0) == 12 and np.allclose([float(v) for v in row0], np.exp(a[0]), rtol=1e-5)


def test_double_row_matmul_and_dtype_views():
    @nki.jit
    def k(a_bits, b):
        out = nl.ndarray((8, 512), nl.float32, buffer=nl.shared_hbm)
        a = nl.load(a_bits.view(nl.float8_e5m2))        # uint8 bytes read as fp8
        c = nisa.nc_matmul(a, nl.load(b), perf_mode="double_row_gen3")  # (K, 2, M) x (K, 2, N)
        nl.store(out, value=nl.copy(c))
        return out
    rng = np.random.default_rng(7)
    a = rng.integers(-4, 5, size=(128, 2, 8)).astype(nl.float8_e5m2)
    b = rng.integers(-4, 5, size=(128, 2, 512)).astype(nl.float8_e5m2)
    out = k(a.view(np.uint8), b)
    assert np.array_equal(out, np.einsum("kli,klj->ij", a.astype(np.float32), b.astype(np.float32)))


def test_float8_e4m3_is_ocp_e4m3_with_infinities():
    """nl.float8_e4m3 stores OCP e4m3 (largest finite 240, overflow to infinity), as ml_dtypes and
    the hardware do; nl.float8_e4m3fn is the format without infinities (largest 448)."""
    import torch_neuronx.nki.v2.isa as nisa2
    import torch_neuronx.nki.v2.language as nl2
    special = [0.0, -0.0, 1.0, 0.0039, 0.001953125, 240.0, 244.0, 247.9, 248.0, 300.0, 448.0, 1e6, -1e6,
               np.inf, -np.inf, np.nan, -3.3, 17.5]
    rng = np.random.default_rng(0)
    x = np.concatenate([special, rng.standard_normal(128 * 64 - len(special)) * 100]).astype(np.float32)
    x = x.reshape(128, 64)

    @nki.jit
    def k(a, out8, out8fn):
        t = nl2.ndarray(a.shape, dtype=a.dtype, buffer=nl2.sbuf)
        nisa2.dma_copy(dst=t, src=a)
        q = nl2.ndarray(a.shape, dtype=nl2.float8_e4m3, buffer=nl2.sbuf)
        nisa2.tensor_copy(dst=q, src=t)
        qfn = nl2.ndarray(a.shape, dtype=nl2.float8_e4m3fn, buffer=nl2.sbuf)
        nisa2.activation(dst=qfn, op=nl2.copy, data=t)
        back = nl2.ndarray(a.shape, dtype=nl2.float32, buffer=nl2.sbuf)
        nisa2.tensor_scalar(dst=back, data=q, op0=nl2.multiply, operand0=1.0)  # e4m3 read as values
        out = nl2.ndarray(a.shape, dtype=nl2.float32, buffer=nl2.shared_hbm)
        nisa2.dma_copy(dst=out, src=back)
        nisa2.dma_copy(dst=out8, src=q)
        nisa2.dma_copy(dst=out8fn, src=qfn)
        return out
    out8 = np.zeros(x.shape, ml_dtypes.float8_e4m3)
    out8fn = np.zeros(x.shape, ml_dtypes.float8_e4m3fn)
    back = k(x, out8, out8fn)
    want = x.astype(ml_dtypes.float8_e4m3)
    np.testing.assert_array_equal(out8.view(np.uint8), want.view(np.uint8) | (np.isnan(x) * 0x7F).astype(np.uint8))
    np.testing.assert_array_equal(back, want.astype(np.float32))
    assert back[0, 9] == np.inf and back[0, 8] == np.inf and back[0, 7] == 240 and back[0, 12] == -np.inf
    finite = np.abs(x) < 464  # e4m3fn: largest 448, no infinity
    np.testing.assert_array_equal(out8fn[finite].astype(np.float32), x[finite].astype(ml_dtypes.float8_e4m3fn)
                                  .astype(np.float32))


def test_float8_e4m3_results_of_a_torch_launch_are_float8_e4m3fn():
    import torch
    import torch_neuronx.nki.v2.isa as nisa2
    import torch_neuronx.nki.v2.language as nl2

    @nki.jit
    def k(a):
        t = nl2.ndarray(a.shape, dtype=a.dtype, buffer=nl2.sbuf)
        nisa2.dma_copy(dst=t, src=a)
        q = nl2.ndarray(a.shape, dtype=nl2.float8_e4m3, buffer=nl2.sbuf)
        nisa2.tensor_copy(dst=q, src=t)
        out = nl2.ndarray(a.shape, dtype=nl2.float8_e4m3, buffer=nl2.shared_hbm)
        nisa2.dma_copy(dst=out, src=q)
        return out
    x = torch.tensor([[1.0, 240.0, 250.0, -3.25, float("inf"), 0.01]] * 2)
    for dev in ("cpu", "neuron"):
        r = k(x.to(dev))
        assert r.dtype == torch.float8_e4m3fn and r.device.type == dev
        got = r.float().cpu()[0]
        assert got[:2].tolist() == [1.0, 240.0] and got[3] == -3.25 and got[2].isnan() and got[4].isnan()
    with pytest.raises(TypeError, match="torch.float8_e4m3fnuz has no NKI dtype"):
        k(x.to(torch.float8_e4m3fnuz))


def test_integer_divide_is_true_division_and_masked_indirect_rows():
    """nl.divide of integers gives float32 (numpy.divide); an indirect load under a mask that is
    not a rectangle writes only the kept elements of each row."""
    import torch_neuronx.nki.isa as nisa1
    import torch_neuronx.nki.language as nl1

    @nki.jit
    def k(x, idx):
        out = nl1.ndarray((128, 64), nl1.float32, buffer=nl1.shared_hbm)
        q = nl1.ndarray((128, 1), nl1.float32, buffer=nl1.shared_hbm)
        i_p, i_f = nl1.mgrid[0:128, 0:64]
        pos = nisa1.iota(nl1.arange(128)[:, None], dtype=nl1.int32)
        quotient = pos / 38
        nl1.store(q, value=quotient)
        it = nl1.load(idx)
        t = nl1.full((128, 64), -1.0, nl1.float32)
        t[i_p, i_f] = nl1.load(x[it[i_p, 0], i_f], mask=(i_f <= i_p))  # lower triangle only
        nl1.store(out, value=t)
        return out, q
    x = np.random.default_rng(0).standard_normal((128, 64)).astype(np.float32)
    idx = np.random.default_rng(1).permutation(128).astype(np.int32)[:, None]
    out, q = k(x, idx)
    assert q.dtype == np.float32 and np.allclose(q[:, 0], np.arange(128) / 38)
    tri = np.tril(np.ones((128, 64), bool))
    np.testing.assert_array_equal(out[tri], x[idx[:, 0]][tri])
    assert (out[~tri] == -1).all()
