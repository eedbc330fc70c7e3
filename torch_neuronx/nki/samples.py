"""Kernels written the way the public NKI tutorials write them (our own code):
the examples of docs/nki.md, checked by tests/nki and timed by bench/nki.py.
Each takes HBM tensors and returns its output in ``shared_hbm``."""
import math

from . import isa as nisa
from . import jit
from . import language as nl


@jit
def tensor_add(a, b):
    """SPMD tensor addition: instance (i, j) of a ``[M/128, N/512]`` grid adds one 128x512 tile."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    i, j = nl.program_id(0), nl.program_id(1)
    ip, jf = nl.mgrid[0:128, 0:512]
    x = nl.load(a[i * 128 + ip, j * 512 + jf])
    y = nl.load(b[i * 128 + ip, j * 512 + jf])
    nl.store(out[i * 128 + ip, j * 512 + jf], value=x + y)
    return out


@jit
def matmul(lhsT, rhs):
    """``lhsT.T @ rhs`` in 128x512 output blocks, accumulating 128-deep slices in PSUM."""
    K, M = lhsT.shape
    _, N = rhs.shape
    out = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    TM, TN, TK = nl.tile_size.gemm_stationary_fmax, nl.tile_size.gemm_moving_fmax, nl.tile_size.pmax
    for m in nl.affine_range(M // TM):
        for n in nl.affine_range(N // TN):
            acc = nl.zeros((TM, TN), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TK):
                lt = nl.load(lhsT[k * TK:(k + 1) * TK, m * TM:(m + 1) * TM])
                rt = nl.load(rhs[k * TK:(k + 1) * TK, n * TN:(n + 1) * TN])
                acc += nisa.nc_matmul(lt, rt)
            nl.store(out[m * TM:(m + 1) * TM, n * TN:(n + 1) * TN], value=nl.copy(acc, dtype=out.dtype))
    return out


@jit
def softmax(x):
    """Row softmax; the last row tile is partial and masked."""
    N, D = x.shape
    out = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
    ip, jf = nl.arange(128)[:, None], nl.arange(D)[None, :]
    for t in nl.affine_range(math.ceil(N / 128)):
        rows = t * 128 + ip < N
        xt = nl.load(x[t * 128 + ip, jf], mask=rows)
        m = nl.max(xt, axis=1, keepdims=True, mask=rows)
        e = nl.exp(nl.subtract(xt, m, mask=rows), mask=rows)
        s = nl.sum(e, axis=1, keepdims=True, mask=rows)
        nl.store(out[t * 128 + ip, jf], value=nl.divide(e, s, mask=rows), mask=rows)
    return out


@jit
def rmsnorm(a, g, eps):
    """``a / sqrt(mean(a^2) + eps) * g`` over rows; g is broadcast across partitions."""
    N, D = a.shape
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    ip, jf = nl.arange(128)[:, None], nl.arange(D)[None, :]
    gt = nl.load(g.reshape((1, D))[nl.arange(1)[:, None], jf])
    for i in nl.affine_range(math.ceil(N / 128)):
        rows = i * 128 + ip < N
        at = nl.load(a[i * 128 + ip, jf], mask=rows)
        ss = nl.ndarray((128, 1), nl.float32)
        nisa.activation_reduce(op=nl.square, data=at, reduce_op=nl.add, reduce_res=ss, mask=rows)
        r = nl.rsqrt(nl.add(nl.multiply(ss, 1.0 / D, mask=rows), eps, mask=rows), mask=rows)
        y = nl.multiply(nl.multiply(at, r, mask=rows), gt.broadcast_to((128, D)), mask=rows)
        nl.store(out[i * 128 + ip, jf], value=y, mask=rows)
    return out


@jit
def layernorm(x, eps):
    """Layer norm without affine parameters, statistics from bn_stats/bn_aggr."""
    N, D = x.shape
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    chunk = nl.tile_size.bn_stats_fmax
    nchunks = math.ceil(D / chunk)
    for i in nl.affine_range(N // 128):
        xt = nl.load(x[i * 128:(i + 1) * 128, :])
        stats = nl.ndarray((128, 6 * nchunks), nl.float32)
        for c in nl.affine_range(nchunks):
            w = min(chunk, D - c * chunk)
            stats[:, 6 * c:6 * c + 6] = nisa.bn_stats(xt[:, c * chunk:c * chunk + w])
        mv = nisa.bn_aggr(stats)
        rstd = nl.rsqrt(nl.add(mv[:, 1:2], eps))
        y = nisa.tensor_scalar(xt, nl.subtract, mv[:, 0:1], op1=nl.multiply, operand1=rstd)
        nl.store(out[i * 128:(i + 1) * 128, :], value=y)
    return out


@jit
def transpose2d(x):
    """Blocks of 128x128 through the Tensor Engine's transpose."""
    M, N = x.shape
    out = nl.ndarray((N, M), dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(M // 128):
        for j in nl.affine_range(N // 128):
            t = nl.load(x[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128])
            nl.store(out[j * 128:(j + 1) * 128, i * 128:(i + 1) * 128], value=nl.copy(nisa.nc_transpose(t)))
    return out


@jit
def flash_attention(qT, kT, v, scale):
    """Causal single-head attention, flash style: qT/kT are (d, S), v is (S, d).

    For each 128-row query block: blocks of 512 keys, scores on the Tensor Engine, an online
    softmax (running max and sum per row), fully masked key blocks skipped, the diagonal block
    masked with affine_select; P @ V accumulated through 128-key transposes."""
    d, S = qT.shape
    out = nl.ndarray((S, d), dtype=v.dtype, buffer=nl.shared_hbm)
    BQ, BK = 128, 512
    for qi in nl.sequential_range(S // BQ):
        q = nl.load(qT[:, qi * BQ:(qi + 1) * BQ])
        m = nl.full((BQ, 1), -3.0e38, nl.float32)
        l = nl.zeros((BQ, 1), nl.float32)
        acc = nl.zeros((BQ, d), nl.float32)
        for kb in nl.sequential_range(math.ceil((qi + 1) * BQ / BK)):
            kt = nl.load(kT[:, kb * BK:(kb + 1) * BK])
            s = nl.multiply(nisa.nc_matmul(q, kt), scale, dtype=nl.float32)
            iq, ik = nl.mgrid[0:BQ, 0:BK]
            s = nisa.affine_select(qi * BQ + iq - (kb * BK + ik) >= 0, s, -3.0e38)
            bm = nl.max(s, axis=1, keepdims=True)
            m_new = nl.maximum(m, bm)
            p = nisa.activation(op=nl.exp, data=s, bias=nl.negative(m_new), scale=1.0)
            corr = nl.exp(nl.subtract(m, m_new))
            l[...] = nl.add(nl.multiply(l, corr), nl.sum(p, axis=1, keepdims=True))
            pv = nl.zeros((BQ, d), nl.float32, buffer=nl.psum)
            for c in nl.affine_range(BK // 128):
                pT = nl.copy(nisa.nc_transpose(p[:, c * 128:(c + 1) * 128]), dtype=v.dtype)
                vt = nl.load(v[kb * BK + c * 128:kb * BK + (c + 1) * 128, :])
                pv += nisa.nc_matmul(pT, vt)
            acc[...] = nisa.scalar_tensor_tensor(data=acc, op0=nl.multiply, operand0=corr, op1=nl.add, operand1=pv)
            m[...] = m_new
        nl.store(out[qi * BQ:(qi + 1) * BQ, :], value=nl.divide(acc, l, dtype=out.dtype))
    return out
