"""RMSNorm and LayerNorm over the last dimension (forward and backward) as NKI kernels, and the
fused ``rms_norm(x) @ W.T`` inference kernel (``rms_norm_linear_forward``, in ``mlp.py``).

Layout: ``x [..., H]`` is flattened to rows ``[N, H]``; each kernel walks row tiles of 128
partitions (a shorter last tile for ``N % 128``) with the whole row in the free dimension, so
the statistics are free-dimension reductions. Everything is computed in fp32 on chip; outputs
are in ``x``'s dtype, the saved statistics (``mean``, ``rstd``) in fp32 of shape ``[N]``.

Weight (and bias) gradients are sums over all rows: each row tile's per-element products are
summed over its partitions on the Tensor Engine (fp32 matmul against a ``[rows, 1]`` column,
accumulating in one PSUM tile across all row tiles), so they stay fp32 to the end.
"""
from __future__ import annotations

import torch

from ... import nki
from ...nki import isa as nisa
from ...nki import language as nl

P = 128                # partitions per row tile
BN_FMAX = nl.tile_size.bn_stats_fmax
_DTYPES = (torch.float32, torch.bfloat16)
_F32 = nl.float32


# -- input checks (shared with mlp.py) ----------------------------------------------------------
def check_tensor(t, name, dtypes=_DTYPES, min_dim=1):
    """Raises TypeError/ValueError (before any launch) unless ``t`` is a floating tensor we support."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} has dtype {t.dtype}; the kernel supports "
                        f"{', '.join(str(d) for d in dtypes)}: convert it first (e.g. {name}.float())")
    if t.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dimension(s), got shape {tuple(t.shape)}")


def check_same_device(**ts):
    devs = {n: t.device for n, t in ts.items() if t is not None}
    if len(set(devs.values())) > 1:
        raise ValueError("tensors are on different devices: " + ", ".join(f"{n} on {d}" for n, d in devs.items())
                         + "; move them to one device")


def _check_param(p, name, H, x):
    if p is None:
        return None
    check_tensor(p, name)
    if tuple(p.shape) != (H,):
        raise ValueError(f"{name} must have shape ({H},) to match x's last dimension, got {tuple(p.shape)}")
    if p.dtype not in (torch.float32, x.dtype):
        raise TypeError(f"{name} has dtype {p.dtype}; use float32 or x's dtype {x.dtype}")
    return p.contiguous()


def _check_stat(s, name, N):
    check_tensor(s, name, dtypes=(torch.float32,), min_dim=0)
    if s.numel() != N:
        raise ValueError(f"{name} must hold one float32 value per row ({N} rows), got shape {tuple(s.shape)}")
    return s.reshape(N, 1).contiguous()


def _eps(eps, x):
    if eps is None:
        return float(torch.finfo(torch.float32).eps)  # F.rms_norm's default: its compute type's (fp32 for bf16)
    eps = float(eps)
    if not eps >= 0.0:
        raise ValueError(f"eps must be a non-negative number, got {eps}")
    return eps


def _rows(x):
    """x as contiguous [N, H] rows."""
    return x.reshape(-1, x.shape[-1]).contiguous()


# -- kernel helpers ----------------------------------------------------------------------------
def _row_tiles(N, load, compute, row_bytes):
    """``compute(r0, rows, load(r0, rows))`` for each 128-row tile (the last one shorter). The
    loads run ``depth`` tiles ahead in program order, so a tile's input DMAs are queued before the
    previous tiles' stores and overlap their compute; depth is bounded by the SBUF they hold."""
    tiles = [(r0, min(P, N - r0)) for r0 in range(0, N, P)]
    depth = max(1, min(3, (48 * 1024) // max(1, row_bytes)))
    data = {}
    for i, (r0, rows) in enumerate(tiles):
        for j in range(i, min(i + depth + 1, len(tiles))):
            if j not in data:
                data[j] = load(*tiles[j])
        compute(r0, rows, data.pop(i))


def _bcast_row(v, H):
    """A length-H HBM vector as a [128, H] tile (one DMA, each partition reading the vector)."""
    return nl.load(v.reshape((1, H))[0:1, :].broadcast_to((P, H)))


def _chunks(H, size=P):
    return [(c, c * size, min(size, H - c * size)) for c in range((H + size - 1) // size)]


def _partition_sum(acc, t, col, rows, H):
    """acc[h % 128, h // 128] += sum over the tile's partitions of t[:, h] * col (fp32 matmuls:
    the rows are the contraction, each 128-wide slice of t the stationary operand)."""
    for c, h0, w in _chunks(H):
        acc[0:w, c:c + 1] += nisa.nc_matmul(t[0:rows, h0:h0 + w], col[0:rows, :])


# -- RMSNorm -----------------------------------------------------------------------------------
@nki.jit
def _rms_fwd_kernel(x, w, eps):
    N, H = x.shape
    y = nl.ndarray((N, H), x.dtype, buffer=nl.shared_hbm)
    rstd = nl.ndarray((N, 1), _F32, buffer=nl.shared_hbm)
    wb = _bcast_row(w, H) if w is not None else None
    eps_t = nl.full((P, 1), eps, _F32)

    def load(r0, rows):
        return nl.load(x[r0:r0 + rows, :])

    def tile(r0, rows, xt):
        ss = nl.ndarray((rows, 1), _F32)
        # Scalar Engine: squares and their row sum in one pass (the squares themselves are dropped)
        nisa.activation_reduce(op=nl.square, data=xt, reduce_op=nl.add, reduce_res=ss, dtype=x.dtype)
        r = nisa.activation(op=nl.rsqrt, data=ss, scale=1.0 / H, bias=eps_t[0:rows, :])
        if wb is not None:  # Vector Engine: (x * rstd) * w in one pass
            yt = nisa.scalar_tensor_tensor(data=xt, op0=nl.multiply, operand0=r, op1=nl.multiply,
                                           operand1=wb[0:rows, :], dtype=x.dtype)
        else:
            yt = nisa.tensor_scalar(xt, nl.multiply, r, dtype=x.dtype)
        nl.store(y[r0:r0 + rows, :], value=yt)
        nl.store(rstd[r0:r0 + rows, :], value=r)

    _row_tiles(N, load, tile, H * x.itemsize)
    return y, rstd


@nki.jit
def _rms_bwd_kernel(g, x, w, rstd):
    N, H = x.shape
    dx = nl.ndarray((N, H), x.dtype, buffer=nl.shared_hbm)
    nch = (H + P - 1) // P
    dw = nl.ndarray((P, nch), _F32, buffer=nl.shared_hbm) if w is not None else None
    wb = _bcast_row(w, H) if w is not None else None
    acc = nl.zeros((P, nch), _F32, buffer=nl.psum) if w is not None else None
    ones = nl.ones((P, 1), _F32)

    def load(r0, rows):
        return nl.load(x[r0:r0 + rows, :]), nl.load(g[r0:r0 + rows, :]), nl.load(rstd[r0:r0 + rows, :])

    def tile(r0, rows, loaded):
        xt, gt, r = loaded
        # gwr = rstd * g * w; dot = sum_h gwr * x = sum_h g * w * xhat
        if wb is not None:
            gwr = nisa.scalar_tensor_tensor(data=gt, op0=nl.multiply, operand0=r, op1=nl.multiply,
                                            operand1=wb[0:rows, :], dtype=_F32)
        else:
            gwr = nisa.activation(op=nl.copy, data=gt, scale=r, dtype=_F32)
        prod = nisa.tensor_tensor(gwr, xt, nl.multiply, dtype=_F32)
        dot = nl.ndarray((rows, 1), _F32)
        nisa.activation_reduce(op=nl.copy, data=prod, reduce_op=nl.add, reduce_res=dot, dtype=x.dtype)
        # dx = rstd * (g w - xhat * dot / H) = gwr + x * (-rstd^2 * dot / H)
        c = nisa.tensor_scalar(dot, nl.multiply, r, op1=nl.multiply, operand1=r)
        c = nisa.tensor_scalar(c, nl.multiply, -1.0 / H)
        dxt = nisa.scalar_tensor_tensor(data=xt, op0=nl.multiply, operand0=c, op1=nl.add, operand1=gwr,
                                        dtype=x.dtype)
        nl.store(dx[r0:r0 + rows, :], value=dxt)
        if acc is not None:  # dw += sum over rows of g * x * rstd
            gx = nisa.scalar_tensor_tensor(data=xt, op0=nl.multiply, operand0=r, op1=nl.multiply, operand1=gt,
                                           dtype=_F32)
            _partition_sum(acc, gx, ones, rows, H)

    _row_tiles(N, load, tile, 2 * H * x.itemsize)
    if acc is None:
        return dx
    nl.store(dw, value=nl.copy(acc))
    return dx, dw


def _param_grad(part, H, dtype):
    """The kernel's [128, ceil(H/128)] fp32 partial layout (element [p, c] is h = c*128 + p) as [H]."""
    return part.t().reshape(-1)[:H].to(dtype)


def rms_norm_forward(x, weight=None, eps=None):
    """RMSNorm over the last dimension: ``y = x * rsqrt(mean(x**2, -1) + eps) * weight``.

    Matches ``torch.nn.functional.rms_norm(x, (H,), weight, eps)`` for normalization over the last
    dimension only (``eps=None`` is ``torch.finfo(x.dtype).eps``, as there). ``x [..., H]`` float32
    or bfloat16; ``weight [H]`` (float32 or x's dtype) or None for no scale. Computed in fp32.

    Returns ``(y, rstd)``: ``y`` like ``x`` (x's dtype), ``rstd`` float32 ``[N]`` (N = rows of x
    flattened to ``[N, H]``), which :func:`rms_norm_backward` takes."""
    check_tensor(x, "x")
    H = x.shape[-1]
    weight = _check_param(weight, "weight", H, x)
    check_same_device(x=x, weight=weight)
    eps = _eps(eps, x)
    x2 = _rows(x)
    N = x2.shape[0]
    if N == 0 or H == 0:
        return torch.empty_like(x), torch.empty(N, dtype=torch.float32, device=x.device)
    y, rstd = _rms_fwd_kernel(x2, weight, eps)
    return y.reshape(x.shape), rstd.reshape(N)


def _backward_inputs(grad_y, x, weight):
    """Checks a backward's grad_y/x/weight; returns (H, weight, x rows, grad_y rows, N)."""
    check_tensor(x, "x")
    check_tensor(grad_y, "grad_y")
    if grad_y.shape != x.shape or grad_y.dtype != x.dtype:
        raise ValueError(f"grad_y {tuple(grad_y.shape)} {grad_y.dtype} must match x {tuple(x.shape)} {x.dtype}")
    H = x.shape[-1]
    weight = _check_param(weight, "weight", H, x)
    x2, g2 = _rows(x), _rows(grad_y)
    N = x2.shape[0]
    return H, weight, x2, g2, N


def rms_norm_backward(grad_y, x, weight, rstd):
    """Gradients of :func:`rms_norm_forward`: ``(dx, dweight)`` from ``grad_y`` (like x), the forward's
    ``x``, ``weight`` (or None) and saved ``rstd [N]``. ``dx`` is in x's dtype, ``dweight`` in
    weight's dtype (None when weight is None); both reduced in fp32."""
    H, weight, x2, g2, N = _backward_inputs(grad_y, x, weight)
    r = _check_stat(rstd, "rstd", N)
    check_same_device(x=x, grad_y=grad_y, weight=weight, rstd=r)
    if N == 0 or H == 0:
        dw = torch.zeros_like(weight) if weight is not None else None
        return torch.empty_like(x), dw
    if weight is None:
        return _rms_bwd_kernel(g2, x2, None, r).reshape(x.shape), None
    dx, dwp = _rms_bwd_kernel(g2, x2, weight, r)
    return dx.reshape(x.shape), _param_grad(dwp, H, weight.dtype)


# -- LayerNorm ---------------------------------------------------------------------------------
def _mean_var(xt, rows, H):
    """Per-row (mean, variance) [rows, 2] from bn_stats over <=512-wide chunks and bn_aggr."""
    cs = _chunks(H, BN_FMAX)
    stats = nl.ndarray((rows, 6 * len(cs)), _F32)
    for c, h0, w in cs:
        stats[:, 6 * c:6 * c + 6] = nisa.bn_stats(xt[:, h0:h0 + w])
    return nisa.bn_aggr(stats)


@nki.jit
def _ln_fwd_kernel(x, w, b, eps):
    N, H = x.shape
    y = nl.ndarray((N, H), x.dtype, buffer=nl.shared_hbm)
    mean = nl.ndarray((N, 1), _F32, buffer=nl.shared_hbm)
    rstd = nl.ndarray((N, 1), _F32, buffer=nl.shared_hbm)
    wb = _bcast_row(w, H) if w is not None else None
    bb = _bcast_row(b, H) if b is not None else None
    eps_t = nl.full((P, 1), eps, _F32)

    def load(r0, rows):
        return nl.load(x[r0:r0 + rows, :])

    def tile(r0, rows, xt):
        if wb is not None and bb is not None:
            # the Vector Engine has two passes to do below: the statistics go to the Scalar Engine,
            # two-pass (the sum, then the squares of x - mean: as exact as bn_stats)
            s = nl.ndarray((rows, 1), _F32)
            nisa.activation_reduce(op=nl.copy, data=xt, reduce_op=nl.add, reduce_res=s, dtype=x.dtype)
            nmu = nisa.tensor_scalar(s, nl.multiply, -1.0 / H)
            ss = nl.ndarray((rows, 1), _F32)
            nisa.activation_reduce(op=nl.square, data=xt, bias=nmu, reduce_op=nl.add, reduce_res=ss, dtype=x.dtype)
            r = nisa.activation(op=nl.rsqrt, data=ss, scale=1.0 / H, bias=eps_t[0:rows, :])
            t = nisa.scalar_tensor_tensor(data=xt, op0=nl.add, operand0=nmu, op1=nl.multiply,
                                          operand1=wb[0:rows, :], dtype=_F32)
            yt = nisa.scalar_tensor_tensor(data=t, op0=nl.multiply, operand0=r, op1=nl.add,
                                           operand1=bb[0:rows, :], dtype=x.dtype)
            nl.store(y[r0:r0 + rows, :], value=yt)
            nl.store(mean[r0:r0 + rows, :], value=nisa.tensor_scalar(nmu, nl.multiply, -1.0))
            nl.store(rstd[r0:r0 + rows, :], value=r)
            return
        mv = _mean_var(xt, rows, H)
        mu = mv[:, 0:1]
        r = nisa.activation(op=nl.rsqrt, data=mv[:, 1:2], bias=eps_t[0:rows, :])
        nmr = nisa.tensor_scalar(mu, nl.multiply, r, op1=nl.multiply, operand1=-1.0)  # -mean * rstd
        if wb is not None:
            # Vector Engine: (x - mean) * w, then * rstd (+ b) on the Vector or Scalar Engine
            t = nisa.scalar_tensor_tensor(data=xt, op0=nl.subtract, operand0=mu, op1=nl.multiply,
                                          operand1=wb[0:rows, :], dtype=_F32)
            if bb is not None:
                yt = nisa.scalar_tensor_tensor(data=t, op0=nl.multiply, operand0=r, op1=nl.add,
                                               operand1=bb[0:rows, :], dtype=x.dtype)
            else:
                yt = nisa.activation(op=nl.copy, data=t, scale=r, dtype=x.dtype)
        else:
            # Scalar Engine: x * rstd - mean * rstd
            xh = nisa.activation(op=nl.copy, data=xt, scale=r, bias=nmr, dtype=_F32 if bb is not None else x.dtype)
            yt = xh if bb is None else nisa.tensor_tensor(xh, bb[0:rows, :], nl.add, dtype=x.dtype)
        nl.store(y[r0:r0 + rows, :], value=yt)
        nl.store(mean[r0:r0 + rows, :], value=mu)
        nl.store(rstd[r0:r0 + rows, :], value=r)

    _row_tiles(N, load, tile, H * x.itemsize)
    return y, mean, rstd


@nki.jit
def _ln_bwd_kernel(g, x, w, mean, rstd):
    N, H = x.shape
    dx = nl.ndarray((N, H), x.dtype, buffer=nl.shared_hbm)
    nch = (H + P - 1) // P
    db = nl.ndarray((P, nch), _F32, buffer=nl.shared_hbm)
    dw = nl.ndarray((P, nch), _F32, buffer=nl.shared_hbm) if w is not None else None
    wb = _bcast_row(w, H) if w is not None else None
    acc_w = nl.zeros((P, nch), _F32, buffer=nl.psum) if w is not None else None
    acc_b = nl.zeros((P, nch), _F32, buffer=nl.psum)
    ones = nl.ones((P, 1), x.dtype)  # g's dtype: the matmul pairs like dtypes (exact: products by 1)

    def load(r0, rows):
        return tuple(nl.load(t[r0:r0 + rows, :]) for t in (x, g, mean, rstd))

    def tile(r0, rows, loaded):
        xt, gt, mu, r = loaded
        nmr = nisa.tensor_scalar(mu, nl.multiply, r, op1=nl.multiply, operand1=-1.0)
        xh = nisa.activation(op=nl.copy, data=xt, scale=r, bias=nmr, dtype=_F32)  # (x - mean) * rstd
        gw = nisa.tensor_tensor(gt, wb[0:rows, :], nl.multiply, dtype=_F32) if wb is not None else gt
        s1 = nl.ndarray((rows, 1), _F32)  # sum_h g w
        nisa.activation_reduce(op=nl.copy, data=gw, reduce_op=nl.add, reduce_res=s1, dtype=x.dtype)
        prod = nisa.tensor_tensor(gw, xh, nl.multiply, dtype=_F32)
        s2 = nl.ndarray((rows, 1), _F32)  # sum_h g w xhat
        nisa.activation_reduce(op=nl.copy, data=prod, reduce_op=nl.add, reduce_res=s2, dtype=x.dtype)
        # dx = rstd * (gw - s1/H - xhat * s2/H)
        c2 = nisa.tensor_scalar(s2, nl.multiply, -1.0 / H)
        c1 = nisa.tensor_scalar(s1, nl.multiply, r, op1=nl.multiply, operand1=-1.0 / H)
        u = nisa.scalar_tensor_tensor(data=xh, op0=nl.multiply, operand0=c2, op1=nl.add, operand1=gw, dtype=_F32)
        dxt = nisa.activation(op=nl.copy, data=u, scale=r, bias=c1, dtype=x.dtype)
        nl.store(dx[r0:r0 + rows, :], value=dxt)
        # db += sum over rows of g; dw += sum over rows of (x - mean) * g * rstd (rstd as the column)
        _partition_sum(acc_b, gt, ones, rows, H)
        if acc_w is not None:
            t = nisa.scalar_tensor_tensor(data=xt, op0=nl.subtract, operand0=mu, op1=nl.multiply, operand1=gt,
                                          dtype=_F32)
            _partition_sum(acc_w, t, r, rows, H)

    _row_tiles(N, load, tile, 2 * H * x.itemsize)
    nl.store(db, value=nl.copy(acc_b))
    if acc_w is None:
        return dx, db
    nl.store(dw, value=nl.copy(acc_w))
    return dx, dw, db


def layer_norm_forward(x, weight=None, bias=None, eps=1e-5):
    """LayerNorm over the last dimension, as ``torch.nn.functional.layer_norm(x, (H,), weight, bias,
    eps)``: ``y = (x - mean) * rsqrt(var + eps) * weight + bias`` (biased variance). ``x [..., H]``
    float32 or bfloat16; ``weight``/``bias`` ``[H]`` (float32 or x's dtype) or None. Computed in
    fp32; the statistics by bn_stats/bn_aggr on the Vector Engine, or, with both weight and bias
    (whose two passes occupy the Vector Engine), two-pass on the Scalar Engine (the row sum, then
    the sum of squares of ``x - mean``), both robust to a large mean.

    Returns ``(y, mean, rstd)``: ``y`` like x, ``mean`` and ``rstd`` float32 ``[N]`` for
    :func:`layer_norm_backward`."""
    check_tensor(x, "x")
    H = x.shape[-1]
    weight = _check_param(weight, "weight", H, x)
    bias = _check_param(bias, "bias", H, x)
    check_same_device(x=x, weight=weight, bias=bias)
    eps = _eps(eps, x)
    x2 = _rows(x)
    N = x2.shape[0]
    if N == 0 or H == 0:
        e = torch.empty(N, dtype=torch.float32, device=x.device)
        return torch.empty_like(x), e, e.clone()
    y, mean, rstd = _ln_fwd_kernel(x2, weight, bias, eps)
    return y.reshape(x.shape), mean.reshape(N), rstd.reshape(N)


def layer_norm_backward(grad_y, x, weight, mean, rstd):
    """Gradients of :func:`layer_norm_forward`: ``(dx, dweight, dbias)`` from ``grad_y`` (like x), the
    forward's ``x``, ``weight`` (or None) and saved ``mean``/``rstd [N]``.

    ``dx`` in x's dtype; ``dweight`` in weight's dtype, None when weight is None; ``dbias``
    (the row sum of grad_y, fp32-accumulated) is always returned, in float32 unless weight is
    given (then weight's dtype): drop it when the forward had no bias."""
    H, weight, x2, g2, N = _backward_inputs(grad_y, x, weight)
    m, r = _check_stat(mean, "mean", N), _check_stat(rstd, "rstd", N)
    check_same_device(x=x, grad_y=grad_y, weight=weight, mean=m, rstd=r)
    pdt = weight.dtype if weight is not None else torch.float32
    if N == 0 or H == 0:
        z = torch.zeros(H, dtype=pdt, device=x.device)
        return torch.empty_like(x), (z.clone() if weight is not None else None), z
    if weight is None:
        dx, dbp = _ln_bwd_kernel(g2, x2, None, m, r)
        return dx.reshape(x.shape), None, _param_grad(dbp, H, pdt)
    dx, dwp, dbp = _ln_bwd_kernel(g2, x2, weight, m, r)
    return dx.reshape(x.shape), _param_grad(dwp, H, pdt), _param_grad(dbp, H, pdt)


def rms_norm_linear_forward(x, norm_weight, eps, linear_weight):
    """``rms_norm(x, norm_weight, eps) @ linear_weight.T`` in one kernel (see ``mlp.py``)."""
    from .mlp import rms_norm_linear_forward as fused
    return fused(x, norm_weight, eps, linear_weight)
