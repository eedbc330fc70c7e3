"""Fused projections as NKI kernels: ``rms_norm(x) @ W.T`` and the Llama (SwiGLU) MLP, forward and
backward.

Layout: rows ``x [N, H]`` are taken in blocks of up to 4 row tiles of 128 (R <= 512 rows). Each
row tile is transposed on the Tensor Engine into ``xT [H (partitions, 128-chunks), R]`` so the
contraction dimension sits on partitions. Projections then run "transposed": the stationary
operand is a 128x128 weight block and ``xT`` the moving operand (R <= 512 columns), giving the
intermediate ``hT [I-chunk, R]`` in PSUM; that is already the layout the next contraction (over
I) needs as its stationary operand, so the [R, I] activations never leave the chip. Weights are
streamed from HBM once per row block, contraction dimension first (the Tensor Engine's layout;
nn.Linear stores [out, in]): the wrappers repack them with torch (``_pack``, one copy per call)
so that each streamed block is one contiguous run per partition.

bf16 inputs multiply in bf16 (fp32 PSUM accumulation); fp32 inputs in fp32 (4x slower on the
Tensor Engine). Element-wise work is fp32. Loads are issued ahead of use in program order (here
the DMA queues serve transfers in that order), within an SBUF byte budget.
"""
from __future__ import annotations

import torch

from ... import _C, nki
from ...nki import isa as nisa
from ...nki import language as nl
from .norms import _eps, check_same_device, check_tensor

P, FMAX = 128, 512
_F32 = nl.float32
_STREAM = 32 * 1024  # SBUF bytes per partition of weight blocks loaded ahead of use
_PART = 8 * 1024     # at most this many bytes per partition in one streamed first-projection block


def _budget():
    """SBUF bytes per partition for the large buffers: the target's, less room for temporaries."""
    return _C._nki.target()["sbuf_partition_bytes"] - 48 * 1024


# -- kernel helpers ----------------------------------------------------------------------------
def _chunks(n, size=P):
    """(index, start, width) of the size-wide chunks of n (the last one shorter)."""
    return [(c, c * size, min(size, n - c * size)) for c in range((n + size - 1) // size)]


class _Stream:
    """Loads issued ahead of their use, in the order they are consumed: ``take()`` returns the next
    item's tile(s) and issues the loads of the items after it while their bytes (per partition)
    fit ``budget``; ``start(n)`` issues the first ``n`` items' alone (to order them before other loads)."""

    def __init__(self, items, budget):
        self.items, self.budget, self.next, self.used, self.ready, self.inflight = items, budget, 0, 0, {}, 0

    def _issue_one(self):
        nbytes, thunk = self.items[self.next]
        self.ready[self.next] = (nbytes, thunk())
        self.inflight += nbytes
        self.next += 1

    def start(self, n=1):
        while self.next < min(n, len(self.items)):
            self._issue_one()

    def take(self):
        if self.next == self.used:
            self._issue_one()
        nbytes, tile = self.ready.pop(self.used)
        self.inflight -= nbytes
        self.used += 1
        while self.next < len(self.items) and self.inflight + self.items[self.next][0] <= self.budget:
            self._issue_one()
        return tile


class _Evac:
    """PSUM -> SBUF copies (optionally times a per-partition scale), alternating between the
    Scalar and Vector Engines."""

    def __init__(self):
        self.n = 0

    def __call__(self, src, dtype, scale=None):
        self.n += 1
        if self.n % 2:
            return nisa.activation(op=nl.copy, data=src, scale=1.0 if scale is None else scale, dtype=dtype)
        if scale is None:
            return nisa.tensor_copy(src, dtype=dtype)
        return nisa.tensor_scalar(src, nl.multiply, scale, dtype=dtype)


def _row_blocks(N, rb):
    """Row blocks of up to ``rb`` tiles: (first row, rows, [(tile offset in block, rows), ...])."""
    out = []
    for b0 in range(0, N, rb * P):
        R = min(rb * P, N - b0)
        out.append((b0, R, [(t0, min(P, R - t0)) for t0 in range(0, R, P)]))
    return out


def _transpose_into(xt, rows, H, dst, c0, evac, scales=None):
    """dst[0:kw, k, c0:c0+rows] = xt[0:rows, k-th 128 columns].T for every chunk k (Tensor Engine
    transposes, four per PSUM tile), each chunk optionally scaled by ``scales[:, k]`` (per partition)."""
    ks = _chunks(H)
    for g0 in range(0, len(ks), 4):
        grp = ks[g0:g0 + 4]
        pt = nl.ndarray((P, len(grp), rows), xt.dtype, buffer=nl.psum)
        for j, (k, h0, kw) in enumerate(grp):
            pt[0:kw, j, :] = nisa.nc_transpose(xt[0:rows, h0:h0 + kw])
        if scales is None and grp[-1][2] == P:
            dst[:, grp[0][0]:grp[-1][0] + 1, c0:c0 + rows] = evac(pt, dst.dtype)
        else:
            for j, (k, h0, kw) in enumerate(grp):
                sc = None if scales is None else scales[0:kw, k:k + 1]
                dst[0:kw, k, c0:c0 + rows] = evac(pt[0:kw, j, :], dst.dtype, sc)


def _load_split(src, kc, parts=4):
    """A [128, kc, cols] HBM block into one tile by up to ``parts`` DMAs along kc, so the first
    matmuls wait only for the first part."""
    t = nl.ndarray(tuple(src.shape), src.dtype, buffer=nl.sbuf)
    step = max(1, (kc + parts - 1) // parts)
    for k0 in range(0, kc, step):
        t[:, k0:min(kc, k0 + step), :] = nl.load(src[:, k0:min(kc, k0 + step), :])
    return t


def _column_chunks(v, H):
    """A length-H HBM vector as a [128, ceil(H/128)] fp32 tile, element [p, k] = v[k*128 + p]:
    the 128-wide chunks loaded as rows (contiguous DMAs) and turned by Tensor Engine transposes."""
    KT = (H + P - 1) // P
    out = nl.ndarray((P, KT), _F32, buffer=nl.sbuf)
    full = H // P
    for k0 in range(0, full, P):
        n = min(P, full - k0)
        rows = nl.load(v[k0 * P:(k0 + n) * P].reshape((n, P)))
        out[:, k0:k0 + n] = nisa.activation(op=nl.copy, data=nisa.nc_transpose(rows), dtype=_F32)
    if H % P:
        out[0:H % P, full:full + 1] = nl.load(v.reshape((H, 1))[full * P:H, :], dtype=_F32)
    return out


def _too_big(what, need):
    return ValueError(f"{what}: these sizes need {need} bytes of SBUF per partition for one row tile, more than "
                      f"the kernel's budget of {_budget()} on this target; use smaller hidden/intermediate sizes")


# -- fused RMSNorm + linear ---------------------------------------------------------------------
def _rms_linear_config(H, isz):
    """(row tiles per block, output columns per weight block) fitting the SBUF budget: the most
    row tiles first (each weight block is reused by every row tile of a block), then the widest
    weight block. Buffers: per row tile its share of xT and its x rows; the weight block in use
    and the next one; one x tile of the next row block."""
    KT = (H + P - 1) // P
    for rb in (4, 3, 2, 1):
        for ow in (FMAX, 256, P):
            if rb * (KT * P + H) * isz + (2 * KT * ow + H) * isz <= _budget():
                return rb, ow
    raise _too_big("rms_norm_linear_forward", (KT * P + H + 2 * KT * P + H) * isz)


@nki.jit
def _rms_linear_kernel(x, g, wp, O, eps):
    """x [N, H], g [H] or None, wp: W.T packed by ``_pack`` ([O/OW, 1, 128, KT, OW])."""
    N, H = x.shape
    isz = x.itemsize
    KT = (H + P - 1) // P
    rb, OW = _rms_linear_config(H, isz)
    y = nl.ndarray((N, O), x.dtype, buffer=nl.shared_hbm)
    evac = _Evac()
    eps_t = nl.full((P, 1), eps, _F32)
    blocks = _row_blocks(N, rb)
    xs = _Stream([(H * isz, (lambda r0=b0 + t0, n=rows: nl.load(x[r0:r0 + n, :])))
                  for b0, R, tiles in blocks for t0, rows in tiles], rb * H * isz)
    ocs = _chunks(O, OW)
    ws = _Stream([(KT * OW * isz, (lambda c=c: _load_split(wp[c, 0], KT))) for _ in blocks for c, _, _ in ocs],
                 KT * OW * isz)
    # the norm weight, the first block's rows and the first weight block lead the DMA queues
    gcol = _column_chunks(g, H) if g is not None else None
    xs.start(rb)
    ws.start()
    for b0, R, tiles in blocks:
        xTs, rstd = [], []
        for t0, rows in tiles:
            xt = xs.take()
            ss = nl.ndarray((rows, 1), _F32)
            nisa.activation_reduce(op=nl.square, data=xt, reduce_op=nl.add, reduce_res=ss, dtype=x.dtype)
            rstd.append(nisa.activation(op=nl.rsqrt, data=ss, scale=1.0 / H, bias=eps_t[0:rows, :]))
            # x * g enters the Tensor Engine; the per-row rstd scales the product afterwards
            xTs.append(nl.ndarray((P, KT, rows), x.dtype, buffer=nl.sbuf))  # one per tile: no false sharing
            _transpose_into(xt, rows, H, xTs[-1], 0, evac, gcol)
        for _, o0, ow in ocs:
            wk = ws.take()
            for (t0, rows), xT, r in zip(tiles, xTs, rstd):
                ps = nl.ndarray((rows, ow), _F32, buffer=nl.psum)
                for k, h0, kw in _chunks(H):
                    ps[...] += nisa.nc_matmul(xT[0:kw, k, :], wk[0:kw, k, 0:ow])
                nl.store(y[b0 + t0:b0 + t0 + rows, o0:o0 + ow], value=evac(ps, x.dtype, r))
    return y


def _pack(mt, cw, kc=None):
    """``mt [K, C]`` (contraction first) in the order the kernels stream it: item ``[c, j]`` is a
    ``[128, kc, cw]`` block holding rows ``(j*kc + k)*128 + p`` at ``[p, k]`` of columns
    ``c*cw ...`` (zero padded), so each partition reads one contiguous run per item.
    ``kc=None``: all of K in one item."""
    K, C = mt.shape
    KT = (K + P - 1) // P
    kc = KT if kc is None else kc
    nj, nc = (KT + kc - 1) // kc, (C + cw - 1) // cw
    pad_k, pad_c = nj * kc * P - K, nc * cw - C
    if pad_k or pad_c:
        mt = torch.nn.functional.pad(mt, (0, pad_c, 0, pad_k))
    return mt.reshape(nj, kc, P, nc, cw).permute(3, 0, 2, 1, 4).contiguous()


def _check_x_2d_weight(x, w, name, in_dim):
    check_tensor(w, name, min_dim=2)
    if w.dim() != 2 or w.shape[1] != in_dim:
        raise ValueError(f"{name} must be a 2-D [out_features, {in_dim}] weight (nn.Linear layout), "
                         f"got shape {tuple(w.shape)}")
    if w.dtype != x.dtype:
        raise TypeError(f"{name} has dtype {w.dtype} but x has {x.dtype}; the kernel multiplies like dtypes")


def rms_norm_linear_forward(x, norm_weight, eps, linear_weight):
    """``rms_norm(x, norm_weight, eps) @ linear_weight.T`` in one kernel (inference; no backward).

    ``x [..., H]`` float32/bfloat16, ``norm_weight [H]`` (float32 or x's dtype) or None,
    ``linear_weight [O, H]`` in x's dtype (nn.Linear layout; transposed to [H, O] by torch before
    the launch). The norm is over the last dimension as in ``F.rms_norm`` (``eps=None``: the
    dtype's epsilon). In the kernel each row tile's rms statistic is computed in fp32, the rows
    times ``norm_weight`` are transposed on the Tensor Engine straight into the matmul's moving
    operand, and the per-row ``rsqrt(mean(x^2) + eps)`` scales the fp32 PSUM result (the same
    product, as the factor is per row). Returns ``[..., O]`` in x's dtype."""
    check_tensor(x, "x")
    H = x.shape[-1]
    _check_x_2d_weight(x, linear_weight, "linear_weight", H)
    if norm_weight is not None:
        check_tensor(norm_weight, "norm_weight")
        if tuple(norm_weight.shape) != (H,):
            raise ValueError(f"norm_weight must have shape ({H},), got {tuple(norm_weight.shape)}")
        if norm_weight.dtype not in (torch.float32, x.dtype):
            raise TypeError(f"norm_weight has dtype {norm_weight.dtype}; use float32 or x's dtype {x.dtype}")
        norm_weight = norm_weight.contiguous()
    check_same_device(x=x, norm_weight=norm_weight, linear_weight=linear_weight)
    eps = _eps(eps, x)
    O = linear_weight.shape[0]
    x2 = x.reshape(-1, H).contiguous()
    if x2.shape[0] == 0 or H == 0 or O == 0:
        return (torch.zeros if H == 0 else torch.empty)(*x.shape[:-1], O, dtype=x.dtype, device=x.device)
    _, ow = _rms_linear_config(H, x.element_size())  # raises for sizes beyond the SBUF budget
    y = _rms_linear_kernel(x2, norm_weight, _pack(linear_weight.t(), ow), O, eps)
    return y.reshape(*x.shape[:-1], O)


# -- SwiGLU MLP ----------------------------------------------------------------------------------
G = 4  # 128-row chunks per streamed block of the second projection's weight (4 KiB DMA runs in bf16)


def _kper(H, isz):
    """128-row chunks of the contraction per streamed first-projection block: the fewest equal
    parts of at most _PART bytes per partition."""
    KT = (H + P - 1) // P
    parts = -(-KT // max(1, _PART // (P * isz)))
    return -(-KT // parts)


def _swiglu_config(H, I, isz, backward, what):
    """(row tiles per block, input tiles loaded ahead) fitting the SBUF budget. Per row tile: its
    columns of xT (and dyT in the backward) and, forward, of the on-chip silu(g) * u [I, R], or,
    backward, the staging of three [rows, 512] outputs. Per input tile (x, and dy) in flight: its
    rows. Fixed: the weight stream and PSUM->SBUF temporaries. Most row tiles first (each weight
    block serves all of them), then the deepest input prefetch."""
    KT, IC = (H + P - 1) // P, (I + P - 1) // P
    n_in = 2 if backward else 1
    per_tile = (n_in * KT * P + (3 * FMAX if backward else IC * P)) * isz
    fixed = _STREAM + _PART + 16 * 1024
    for rb in (4, 3, 2, 1):
        for ahead in (rb + 1, 2, 1):
            if fixed + rb * per_tile + (ahead + 1) * n_in * H * isz <= _budget():
                return rb, ahead
    raise _too_big(what, fixed + per_tile + 2 * n_in * H * isz)


def _x_transposed(xs, tiles, H, R, dtype, evac):
    """The block's rows, transposed: xT [128, KT, R] (one PE transpose per 128x128 block)."""
    KT = (H + P - 1) // P
    xT = nl.ndarray((P, KT, R), dtype, buffer=nl.sbuf)
    for t0, rows in tiles:
        _transpose_into(xs.take(), rows, H, xT, t0, evac)
    return xT


def _project_T(ws, kper, xT, H, iw, R):
    """hT [iw, R] = (x @ W[:, chunk]).T in PSUM: the weight chunk [H, iw] stationary (taken from
    the stream in parts of ``kper`` 128-row chunks), xT moving."""
    ps = nl.ndarray((iw, R), _F32, buffer=nl.psum)
    for k, h0, kw in _chunks(H):
        if k % kper == 0:
            w_t = ws.take()
        ps[...] += nisa.nc_matmul(w_t[0:kw, k % kper, 0:iw], xT[0:kw, k, 0:R])
    return ps


def _down_proj(ws, actTs, I, tiles, HO, out, b0, dtype, evac):
    """out[rows, :] = sum over the on-chip intermediates aT [I, R] of aT.T @ Wd (Wd streamed in
    [128, G, 512] blocks, one PSUM accumulator per row tile and 512 output columns)."""
    ics = _chunks(I)
    for _, c0, cw in _chunks(HO, FMAX):
        acc = [nl.ndarray((rows, cw), _F32, buffer=nl.psum) for _, rows in tiles]
        for j0 in range(0, len(ics), G):
            wds = [ws.take() for _ in actTs]
            for ic, i0, iw in ics[j0:j0 + G]:
                for (t0, rows), ps in zip(tiles, acc):
                    for aT, wd in zip(actTs, wds):
                        ps[...] += nisa.nc_matmul(aT[0:iw, ic, t0:t0 + rows], wd[0:iw, ic - j0, 0:cw])
        for (t0, rows), ps in zip(tiles, acc):
            nl.store(out[b0 + t0:b0 + t0 + rows, c0:c0 + cw], value=evac(ps, dtype))


def _stream_items(blocks, H, I, HO, isz, first, second):
    """The weight stream in consumption order: per row block, per 128-chunk of I the first
    projections' [128, kper, 128] parts, then per 512 output columns and G chunks of I the second
    projections' [128, G, 512] blocks (layouts of ``_pack``)."""
    KT, IC = (H + P - 1) // P, (I + P - 1) // P
    kper = _kper(H, isz)
    items = []
    for _ in blocks:
        for ic in range(IC):
            for w in first:
                items += [(kper * P * isz, (lambda w=w, ic=ic, j=j: nl.load(w[ic, j])))
                          for j in range((KT + kper - 1) // kper)]
        for c in range((HO + FMAX - 1) // FMAX):
            for j in range((IC + G - 1) // G):
                items += [(G * FMAX * isz, (lambda w=w, c=c, j=j: nl.load(w[c, j]))) for w in second]
    return items


@nki.jit
def _swiglu_fwd_kernel(x, wg, wu, wd, I):
    """x [N, H]; wg, wu: W.T packed [I/128, KT/kper, 128, kper, 128]; wd: w_down.T packed
    [H/512, I/512, 128, G, 512] (``_pack``)."""
    N, H = x.shape
    isz = x.itemsize
    rb, ahead = _swiglu_config(H, I, isz, False, "swiglu_forward")
    y = nl.ndarray((N, H), x.dtype, buffer=nl.shared_hbm)
    evac = _Evac()
    blocks = _row_blocks(N, rb)
    xs = _Stream([(H * isz, (lambda r0=b0 + t0, n=rows: nl.load(x[r0:r0 + n, :])))
                  for b0, R, tiles in blocks for t0, rows in tiles], ahead * H * isz)
    ws = _Stream(_stream_items(blocks, H, I, H, isz, (wg, wu), (wd,)), _STREAM)
    xs.start(rb)
    ws.start()
    kper = _kper(H, isz)
    for b0, R, tiles in blocks:
        xT = _x_transposed(xs, tiles, H, R, x.dtype, evac)
        actT = nl.ndarray((P, (I + P - 1) // P, R), x.dtype, buffer=nl.sbuf)  # silu(g) * u, transposed
        for ic, i0, iw in _chunks(I):
            pg = _project_T(ws, kper, xT, H, iw, R)
            pu = _project_T(ws, kper, xT, H, iw, R)
            sg = nisa.activation(op=nl.silu, data=pg, dtype=_F32)             # Scalar Engine
            actT[0:iw, ic, 0:R] = nisa.tensor_tensor(sg, pu, nl.multiply, dtype=x.dtype)  # Vector Engine
        _down_proj(ws, [actT], I, tiles, H, y, b0, x.dtype, evac)
    return y


def _check_mlp(x, w_gate, w_up, w_down):
    check_tensor(x, "x")
    H = x.shape[-1]
    _check_x_2d_weight(x, w_gate, "w_gate", H)
    _check_x_2d_weight(x, w_up, "w_up", H)
    if w_up.shape != w_gate.shape:
        raise ValueError(f"w_up {tuple(w_up.shape)} must have w_gate's shape {tuple(w_gate.shape)}")
    check_tensor(w_down, "w_down", min_dim=2)
    I = w_gate.shape[0]
    if w_down.dim() != 2 or tuple(w_down.shape) != (H, I):
        raise ValueError(f"w_down must be [{H}, {I}] (nn.Linear(intermediate, hidden) layout), got "
                         f"{tuple(w_down.shape)}")
    if w_down.dtype != x.dtype:
        raise TypeError(f"w_down has dtype {w_down.dtype} but x has {x.dtype}; the kernel multiplies like dtypes")
    check_same_device(x=x, w_gate=w_gate, w_up=w_up, w_down=w_down)
    return H, I


def swiglu_forward(x, w_gate, w_up, w_down):
    """The Llama MLP ``(silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T`` in one kernel.

    ``x [..., H]`` float32/bfloat16; ``w_gate``, ``w_up`` ``[I, H]`` and ``w_down`` ``[H, I]`` in x's
    dtype (nn.Linear layouts; torch repacks them into the kernel's streaming layout before the
    launch). Per block of up to 512 rows the gate and up projections are computed transposed
    ([I-chunk, rows] in PSUM), ``silu(g) * u`` is formed in fp32 and kept on chip (in x's dtype)
    as the down projection's stationary operand, so the [N, I] activations never reach HBM.
    Returns ``[..., H]`` in x's dtype."""
    H, I = _check_mlp(x, w_gate, w_up, w_down)
    x2 = x.reshape(-1, H).contiguous()
    if x2.shape[0] == 0 or H == 0:
        return torch.empty_like(x)
    if I == 0:
        return torch.zeros_like(x)
    _swiglu_config(H, I, x.element_size(), False, "swiglu_forward")  # raises for sizes beyond the SBUF budget
    kp = _kper(H, x.element_size())
    y = _swiglu_fwd_kernel(x2, _pack(w_gate.t(), P, kp), _pack(w_up.t(), P, kp), _pack(w_down.t(), FMAX, G), I)
    return y.reshape(x.shape)


@nki.jit
def _swiglu_bwd_kernel(dy, x, wg, wu, wdn, I):
    """Row-block part of the MLP backward. wg, wu: W.T packed [I/128, KT/kper, 128, kper, 128]; wdn:
    w_down packed the same way ([H, I] is already contraction-first). Returns a = silu(g) * u [N, I] and
    [dg | du] [N, 2I] (the weight gradients' left operands) and [dg | du].T [2I, N] (dx's)."""
    N, H = x.shape
    isz = x.itemsize
    dt = x.dtype
    KT = (H + P - 1) // P
    rb, ahead = _swiglu_config(H, I, isz, True, "swiglu_backward")
    a_out = nl.ndarray((N, I), dt, buffer=nl.shared_hbm)
    dgu = nl.ndarray((N, 2 * I), dt, buffer=nl.shared_hbm)
    dguT = nl.ndarray((2 * I, N), dt, buffer=nl.shared_hbm)
    evac = _Evac()
    blocks = _row_blocks(N, rb)
    ins = _Stream([(2 * H * isz, (lambda r0=b0 + t0, n=rows: (nl.load(x[r0:r0 + n, :]), nl.load(dy[r0:r0 + n, :]))))
                   for b0, R, tiles in blocks for t0, rows in tiles], 2 * ahead * H * isz)
    ws = _Stream(_stream_items(blocks, H, I, 0, isz, (wg, wu, wdn), ()), _STREAM)
    ins.start(rb)
    ws.start()
    kper = _kper(H, isz)
    ics = _chunks(I)
    for b0, R, tiles in blocks:
        xT = nl.ndarray((P, KT, R), dt, buffer=nl.sbuf)
        dyT = nl.ndarray((P, KT, R), dt, buffer=nl.sbuf)
        for t0, rows in tiles:
            xt, dyt = ins.take()
            _transpose_into(xt, rows, H, xT, t0, evac)
            _transpose_into(dyt, rows, H, dyT, t0, evac)
        # 512 columns of I at a time are staged for row-major stores; each chunk's transposes back
        # to rows are issued after the next chunk's matmuls, so the Tensor Engine does not wait
        # for the element-wise work in between
        pending = None
        for ic, i0, iw in ics:
            j = ic % 4
            if j == 0:
                stage = [[nl.ndarray((rows, FMAX), dt, buffer=nl.sbuf) for _ in range(3)] for _, rows in tiles]
            pg = _project_T(ws, kper, xT, H, iw, R)    # g.T
            pu = _project_T(ws, kper, xT, H, iw, R)    # u.T
            pda = _project_T(ws, kper, dyT, H, iw, R)  # (dy @ w_down).T = da.T
            if pending is not None:
                pending()
            sg = nisa.activation(op=nl.silu, data=pg, dtype=_F32)
            dsg = nisa.activation(op=nl.silu_dx, data=pg, dtype=_F32)
            aT = nisa.tensor_tensor(sg, pu, nl.multiply, dtype=dt)
            duT = nisa.tensor_tensor(pda, sg, nl.multiply, dtype=dt)   # da * silu(g)
            q = nisa.tensor_tensor(pda, dsg, nl.multiply, dtype=_F32)
            dgT = nisa.tensor_tensor(q, pu, nl.multiply, dtype=dt)     # da * u * silu'(g)
            nl.store(dguT[i0:i0 + iw, b0:b0 + R], value=dgT)
            nl.store(dguT[I + i0:I + i0 + iw, b0:b0 + R], value=duT)

            def pending(srcs=(aT, dgT, duT), j=j, iw=iw, stage=stage, last=(j == 3 or ic == len(ics) - 1),
                        c0=ic // 4 * 4 * P):
                for (t0, rows), st in zip(tiles, stage):
                    for m, src in enumerate(srcs):
                        st[m][:, j * P:j * P + iw] = evac(nisa.nc_transpose(src[0:iw, t0:t0 + rows]), dt)
                if last:
                    cw = min(4 * P, I - c0)
                    for (t0, rows), st in zip(tiles, stage):
                        r0 = b0 + t0
                        nl.store(a_out[r0:r0 + rows, c0:c0 + cw], value=st[0][:, 0:cw])
                        nl.store(dgu[r0:r0 + rows, c0:c0 + cw], value=st[1][:, 0:cw])
                        nl.store(dgu[r0:r0 + rows, I + c0:I + c0 + cw], value=st[2][:, 0:cw])
        pending()
    return a_out, dgu, dguT


MB, KB = 4, 2  # weight-gradient output block: 4 x 128 rows by 2 x 512 columns (8 PSUM accumulators)


@nki.jit
def _at_b_kernel(a, b, out_dtype):
    """``a.T @ b`` for a [N, M], b [N, K], in ``out_dtype`` (None: fp32): sums over the rows,
    accumulated in fp32 PSUM over all row tiles for each [512, 1024] output block (the rows contract
    on the partitions). Row tiles are streamed ahead; all of b, or a's 512 columns of the current
    output rows, stay in SBUF when they fit, so they are read from HBM once."""
    N, M = a.shape
    K = b.shape[1]
    isz = a.itemsize
    odt = out_dtype or _F32
    out = nl.ndarray((M, K), odt, buffer=nl.shared_hbm)
    ntiles = _chunks(N)
    mbs, kbs = _chunks(M, MB * P), _chunks(K, KB * FMAX)
    b_resident = N * K * isz <= 64 * 1024 * P
    a_resident = N * MB * P * isz <= 32 * 1024 * P

    def tile_of(src, n0, rows, c0, cw):
        return cw * isz, (lambda: nl.load(src[n0:n0 + rows, c0:c0 + cw]))

    items = []  # the loads in the order they are consumed
    if b_resident:
        items += [tile_of(b, n0, rows, 0, K) for _, n0, rows in ntiles]
    for _, m0, mw in mbs:
        if a_resident:
            items += [tile_of(a, n0, rows, m0, mw) for _, n0, rows in ntiles]
        for _, k0, kw in kbs:
            for _, n0, rows in ntiles:
                if not a_resident:
                    items.append(tile_of(a, n0, rows, m0, mw))
                if not b_resident:
                    items.append(tile_of(b, n0, rows, k0, kw))
    stream = _Stream(items, 48 * 1024)
    evac = _Evac()
    take = stream.take
    bt_all = [take() for _ in ntiles] if b_resident else None
    for _, m0, mw in mbs:
        at_all = [take() for _ in ntiles] if a_resident else None
        for _, k0, kw in kbs:
            mcs, kcs = _chunks(mw), _chunks(kw, FMAX)
            acc = [[nl.ndarray((mc, kc), _F32, buffer=nl.psum) for _, _, kc in kcs] for _, _, mc in mcs]
            for n, (_, n0, rows) in enumerate(ntiles):
                at = at_all[n] if a_resident else take()
                bt, bo = (bt_all[n], k0) if b_resident else (take(), 0)
                for (_, i0, mc), row in zip(mcs, acc):
                    for (_, j0, kc), ps in zip(kcs, row):
                        ps[...] += nisa.nc_matmul(at[0:rows, i0:i0 + mc], bt[0:rows, bo + j0:bo + j0 + kc])
            for (_, i0, mc), row in zip(mcs, acc):  # one row-major store per 128 output rows
                st = nl.ndarray((mc, kw), odt, buffer=nl.sbuf)
                for (_, j0, kc), ps in zip(kcs, row):
                    st[:, j0:j0 + kc] = evac(ps, odt)
                nl.store(out[m0 + i0:m0 + i0 + mc, k0:k0 + kw], value=st)
    return out


def swiglu_backward(grad_y, x, w_gate, w_up, w_down):
    """Gradients of :func:`swiglu_forward`: ``(dx, dw_gate, dw_up, dw_down)``.

    A first kernel, per block of up to 512 rows, recomputes ``g = x @ w_gate.T`` and
    ``u = x @ w_up.T`` and forms ``da = grad_y @ w_down`` (all transposed, [I-chunk, rows], in
    PSUM), then in fp32 ``a = silu(g) * u``, ``du = da * silu(g)``, ``dg = da * u * silu'(g)``,
    written in x's dtype (as autograd's intermediates would be): ``a`` and ``[dg | du]`` row-major,
    ``[dg | du]`` also transposed. Three launches of one contraction kernel (``A.T @ B`` over
    the leading dimension, fp32 PSUM accumulation) then give ``dx = [dg | du] @ [w_gate; w_up]``,
    ``dw_down = grad_y.T @ a`` and ``[dw_gate; dw_up] = [dg | du].T @ x``. Results in x's dtype."""
    H, I = _check_mlp(x, w_gate, w_up, w_down)
    check_tensor(grad_y, "grad_y")
    if grad_y.shape != x.shape or grad_y.dtype != x.dtype:
        raise ValueError(f"grad_y {tuple(grad_y.shape)} {grad_y.dtype} must match x {tuple(x.shape)} {x.dtype}")
    check_same_device(x=x, grad_y=grad_y)
    x2, g2 = x.reshape(-1, H).contiguous(), grad_y.reshape(-1, H).contiguous()
    if x2.shape[0] == 0 or H == 0 or I == 0:
        return (torch.zeros_like(x), torch.zeros_like(w_gate), torch.zeros_like(w_up), torch.zeros_like(w_down))
    _swiglu_config(H, I, x.element_size(), True, "swiglu_backward")  # raises for sizes beyond the SBUF budget
    kp = _kper(H, x.element_size())
    a, dgu, dguT = _swiglu_bwd_kernel(g2, x2, _pack(w_gate.t(), P, kp), _pack(w_up.t(), P, kp), _pack(w_down, P, kp), I)
    dx = _at_b_kernel(dguT, torch.cat([w_gate, w_up]), x.dtype)
    dw_down = _at_b_kernel(g2, a, x.dtype)  # fp32 sums over all rows, rounded once to the weights' dtype
    dw_gu = _at_b_kernel(dgu, x2, x.dtype)
    return dx.reshape(x.shape), dw_gu[:I], dw_gu[I:], dw_down
