"""The NeuronCore-v4 microscaling instructions: ``nisa.quantize_mx`` and ``nisa.nc_matmul_mx``, at
the Tensor Engine's largest tiles, against NumPy/torch references written from the ISA docs (OCP
MX: a group of 8 partitions x 4 elements shares an 8-bit exponent scale, kept in rows 0-3 of the
32-partition quadrant the group came from)."""
import numpy as np
import pytest
import torch

from torch_neuronx import nki
import torch_neuronx.nki.v2.isa as nisa
import torch_neuronx.nki.v2.language as nl

EMAX = {"e4m3fn": 8, "e5m2": 15}
VMAX = {"e4m3fn": 448.0, "e5m2": 57344.0}
TORCH_FP8 = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
X4 = {"e4m3fn": nl.float8_e4m3fn_x4, "e5m2": nl.float8_e5m2_x4}


def scale_row(group):
    return group // 4 * 32 + group % 4


def ref_quantize(x, fmt):
    """(words (P, F/4) uint32, scales (P/8, F/4) uint8) of fp32 array x (P, F)."""
    P, F = x.shape
    exp = ((x.view(np.uint32) >> 23) & 0xFF).astype(np.int64)
    block = exp.reshape(P // 8, 8, F // 4, 4).max(axis=(1, 3))
    factor = np.repeat(np.repeat(2.0 ** (block - EMAX[fmt] - 127), 8, 0), 4, 1)
    q = np.clip(x.astype(np.float64) / factor, -VMAX[fmt], VMAX[fmt]).astype(np.float32)
    words = torch.from_numpy(q).to(TORCH_FP8[fmt]).view(torch.uint8).numpy().view(np.uint32)
    return words, np.clip(block - EMAX[fmt], 0, 255).astype(np.uint8)


def dequantize(words, scales_dense, fmt):
    """fp32 (P, W, 4) values of packed fp8 words with their dense (P/8, W) scales."""
    P, W = words.shape
    vals = torch.from_numpy(np.ascontiguousarray(words).view(np.uint8)).view(TORCH_FP8[fmt]).float().numpy()
    return vals.reshape(P, W, 4) * np.repeat(2.0 ** (scales_dense.astype(np.float64) - 127), 8, 0)[:, :, None]


@nki.jit
def quantize_kernel(src, out_words, out_scale):
    P, F = src.shape
    s = nl.ndarray((P, F), dtype=src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=s, src=src)
    d = nl.ndarray((P, F // 4), dtype=out_words.dtype, buffer=nl.sbuf)
    sc = nl.ndarray((P, F // 4), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.memset(dst=sc, value=7)  # rows the instruction does not write keep this
    nisa.quantize_mx(dst=d, src=s, dst_scale=sc)
    nisa.dma_copy(dst=out_words, src=d)
    nisa.dma_copy(dst=out_scale, src=sc)
    return out_words, out_scale


@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
@pytest.mark.parametrize("src_dtype", [np.float16, "bfloat16"])
def test_quantize_mx_matches_the_ocp_reference(fmt, src_dtype):
    P, F = 128, 2048  # the quantized tile is the largest moving tile, (128, 512) words
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((P, F)) * np.exp2(rng.integers(-6, 6, (P, 1)))).astype(np.float32)
    x[8:16, 4:8] = 0.0  # an all-zero group: scale 0 (2^-127), values 0
    if src_dtype == "bfloat16":
        src = torch.from_numpy(x).bfloat16()
        x = src.float().numpy()
        src = src.view(torch.int16).numpy().view(nl.bfloat16)
    else:
        src = x.astype(np.float16)
        x = src.astype(np.float32)
    words, scale = quantize_kernel(src, np.zeros((P, F // 4), X4[fmt]), np.zeros((P, F // 4), np.uint8))
    want_words, want_scale = ref_quantize(x, fmt)
    np.testing.assert_array_equal(np.asarray(words).view(np.uint32), want_words)
    rows = [scale_row(g) for g in range(P // 8)]
    np.testing.assert_array_equal(scale[rows], want_scale)
    assert (np.delete(scale, rows, axis=0) == 7).all()  # the other 28 rows of each quadrant: untouched
    assert want_scale[1, 1] == 0 and (want_words[8:16, 1] == 0).all()


@nki.jit
def quantize_matmul_kernel(a, b):
    """out (M, N) = aᵀ b with both quantized on the device, their scales packed in one tile (a's in
    rows 0-3 of each quadrant, b's in rows 4-7), as the MX tutorial does."""
    K, M4 = a.shape
    _, N4 = b.shape
    sa = nl.ndarray((K, M4), dtype=a.dtype, buffer=nl.sbuf)
    sb = nl.ndarray((K, N4), dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=sa, src=a)
    nisa.dma_copy(dst=sb, src=b)
    qa = nl.ndarray((K, M4 // 4), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
    qb = nl.ndarray((K, N4 // 4), dtype=nl.float8_e5m2_x4, buffer=nl.sbuf)
    scales = nl.ndarray((K, N4 // 4), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.quantize_mx(dst=qa, src=sa, dst_scale=scales[0:, : M4 // 4])
    nisa.quantize_mx(dst=qb, src=sb, dst_scale=scales[4:, :])
    ps = nl.ndarray((M4 // 4, N4 // 4), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul_mx(dst=ps, stationary=qa, moving=qb, stationary_scale=scales[0:, : M4 // 4],
                      moving_scale=scales[4:, :])
    res = nl.ndarray(ps.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=ps)
    out = nl.ndarray(ps.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=res)
    return out


def test_nc_matmul_mx_contracts_partitions_and_packed_elements():
    K, M, N = 128, 128, 512  # the largest MX tiles: 512 contraction values per column
    rng = np.random.default_rng(1)
    a = rng.standard_normal((K, M * 4)).astype(np.float16)
    b = rng.standard_normal((K, N * 4)).astype(np.float16)
    out = quantize_matmul_kernel(a, b)
    wa, sa = ref_quantize(a.astype(np.float32), "e4m3fn")
    wb, sb = ref_quantize(b.astype(np.float32), "e5m2")
    da, db = dequantize(wa, sa, "e4m3fn"), dequantize(wb, sb, "e5m2")
    want = np.einsum("kiq,kjq->ij", da, db)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-3)
    # and the MX product approximates the fp16 one (fp8 data, shared scales)
    exact = a.astype(np.float64).reshape(K, M, 4).transpose(0, 2, 1).reshape(-1, M).T @ \
        b.astype(np.float64).reshape(K, N, 4).transpose(0, 2, 1).reshape(-1, N)
    assert np.abs(out - exact).max() < 0.1 * np.abs(exact).max()


def test_nc_matmul_mx_fp4_words_from_the_host():
    K, M, N = 64, 32, 256
    rng = np.random.default_rng(2)
    codes_s = rng.integers(0, 16, (K, M, 4))
    codes_m = rng.integers(0, 16, (K, N, 4))
    pack = lambda c: (c[..., 0] | c[..., 1] << 4 | c[..., 2] << 8 | c[..., 3] << 12).astype(np.uint16)  # noqa: E731
    table = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
    scale_s = rng.integers(120, 134, (K // 8, M)).astype(np.uint8)
    scale_m = rng.integers(120, 134, (K // 8, N)).astype(np.uint8)

    @nki.jit
    def k(ws, wm, ss, sm):
        ts = nl.ndarray((K, M), dtype=nl.float4_e2m1fn_x4, buffer=nl.sbuf)
        tm = nl.ndarray((K, N), dtype=nl.float4_e2m1fn_x4, buffer=nl.sbuf)
        nisa.dma_copy(dst=ts, src=ws.ap(pattern=[[M, K], [1, M]], dtype=nl.float4_e2m1fn_x4))
        nisa.dma_copy(dst=tm, src=wm.ap(pattern=[[N, K], [1, N]], dtype=nl.float4_e2m1fn_x4))
        tss = nl.ndarray((K, M), dtype=nl.uint8, buffer=nl.sbuf)
        tsm = nl.ndarray((K, N), dtype=nl.uint8, buffer=nl.sbuf)
        for q in range(K // 32):  # 4 scale rows into each quadrant
            nisa.dma_copy(dst=tss[32 * q:32 * q + 4, :], src=ss[4 * q:4 * q + 4, :])
            nisa.dma_copy(dst=tsm[32 * q:32 * q + 4, :], src=sm[4 * q:4 * q + 4, :])
        ps = nl.ndarray((M, N), dtype=nl.bfloat16, buffer=nl.psum)
        nisa.nc_matmul_mx(dst=ps, stationary=ts, moving=tm, stationary_scale=tss, moving_scale=tsm,
                          tile_position=(64, 0), tile_size=(64, 128))
        res = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=ps)
        out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=res)
        return out
    out = k(pack(codes_s), pack(codes_m), scale_s, scale_m)
    vs = table[codes_s] * np.repeat(2.0 ** (scale_s - 127.0), 8, 0)[:, :, None]
    vm = table[codes_m] * np.repeat(2.0 ** (scale_m - 127.0), 8, 0)[:, :, None]
    want = torch.from_numpy(np.einsum("kiq,kjq->ij", vs, vm)).float().bfloat16().float().numpy()  # a bf16 dst
    np.testing.assert_allclose(out, want, rtol=1e-2, atol=1e-30)


def _run(body):
    @nki.jit
    def k(x):
        body(x)
        return x
    return k(np.zeros((64, 64), np.float16))


def _sb(shape, dtype, buffer=None):
    return nl.ndarray(shape, dtype=dtype, buffer=buffer or nl.sbuf)


def _quantize(dst=(64, 16, nl.float8_e4m3fn_x4), src=(64, 64, nl.float16), scale=(64, 16, nl.uint8)):
    return lambda x: nisa.quantize_mx(dst=_sb(dst[:2], dst[2]), src=_sb(src[:2], src[2]),
                                      dst_scale=_sb(scale[:2], scale[2]))


def _matmul(dst_buffer=nl.psum, moving_k=32, moving_scale_rows=4, scale_dtype=nl.uint8):
    x4 = nl.float8_e4m3fn_x4
    return lambda x: nisa.nc_matmul_mx(dst=_sb((16, 16), nl.float32, dst_buffer), stationary=_sb((32, 16), x4),
                                       moving=_sb((moving_k, 16), x4), stationary_scale=_sb((4, 16), scale_dtype),
                                       moving_scale=_sb((moving_scale_rows, 16), nl.uint8))


@pytest.mark.parametrize("body, error, message", [
    (_quantize(src=(64, 64, nl.float32)), TypeError, "quantize_mx src dtype must be float16 or bfloat16"),
    (_quantize((48, 16, nl.float8_e4m3fn_x4), (48, 64, nl.float16), (48, 16, nl.uint8)), ValueError,
     "partition dimension 48 must be a multiple of 32"),
    (_quantize(dst=(64, 16, nl.uint32)), TypeError, "quantize_mx dst dtype must be one of float8_e4m3fn_x4"),
    (_quantize(scale=(8, 16, nl.uint8)), ValueError,
     "dst_scale partition dimension 8 is too small: the scales of 64 partitions need 36"),
    (_matmul(dst_buffer=nl.sbuf), TypeError, "nc_matmul_mx dst must be in ['psum']"),
    (_matmul(moving_k=64, moving_scale_rows=36), ValueError,
     "stationary and moving partition dimensions differ: 32 and 64"),
    (_matmul(scale_dtype=nl.float16), TypeError, "stationary_scale dtype must be float8_e8m0fnu or uint8"),
])
def test_mx_instructions_check_their_operands(body, error, message):
    with pytest.raises(error, match=message.replace("[", r"\[").replace("]", r"\]")):
        _run(body)
