"""Mixture-of-experts kernels in NKI: routing, token permutation, grouped (per-expert) GEMMs, the
fused SwiGLU experts and the weighted combine; :func:`.moe_block.moe_forward` chains them into Mixtral's
sparse MoE block. ``T`` tokens, ``E`` experts, ``k`` experts per token, ``N = T * k`` assignments.

* ``moe_route``: softmax/sigmoid gates, top-k by ``max8`` + ``nc_match_replace8`` (ties: lowest
  expert first), optional renormalisation and per-expert capacity.
* ``moe_permute``: a counting sort by expert on chip (one-hot counts, prefix sums over tokens on the
  Tensor Engine); each token row is loaded once and scattered to its k rows by indirect DMA.
* ``moe_grouped_gemm`` and the fused experts: per expert, its weights are loaded once (the next
  expert's stream in meanwhile) and its rows walked in 128-row tiles by a dynamic loop
  (``nl.dynamic_range``, trip count read from ``expert_offsets`` when the kernel runs): one traced
  kernel serves every routing, no host sync. Rows move by indirect DMA (loads clamp past the tensor,
  stores skip rows past the group). ``host_offsets`` traces static loops for one pattern instead.
* ``moe_combine``: each token's k rows gathered by indirect DMA and summed with their weights on the
  Tensor Engine (a diagonal weight matrix as the stationary operand).

Expert id ``E`` marks a dropped assignment (Hugging Face's experts one-hot ``E + 1`` classes and
skip the last): ``moe_route``'s capacity drops get it, ``moe_permute`` sorts it (and any id outside
``[0, E)``) after all experts, and the grouped GEMMs write zeros for those rows.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from ... import nki
from ...nki import isa as nisa
from ...nki import language as nl
from ...nki.v2 import isa as nisa2
from ...nki.v2 import language as nl2
from .norms import check_same_device, check_tensor

P, FMAX = 128, 512
_F32, _I32 = nl.float32, nl.int32
_W_BUDGET = 128 * 1024  # SBUF bytes per partition for expert weights (double-buffered when they fit)
_GATES = ("softmax", "sigmoid")


def _cdiv(a, b):
    return (a + b - 1) // b


def _chunks(n, size=P):
    """(index, start, width) of the size-wide chunks of n (the last one shorter)."""
    return [(c, c * size, min(size, n - c * size)) for c in range(_cdiv(n, size))]


# -- kernel helpers --------------------------------------------------------------------------------
class _Evac:
    """PSUM -> SBUF copies, alternating between the Scalar and Vector Engines."""
    n = 0

    def __call__(self, dst, src):
        self.n += 1
        dst[...] = (nisa.activation(op=nl.copy, data=src, dtype=dst.dtype) if self.n % 2
                    else nisa.tensor_copy(src, dtype=dst.dtype))


def _square_consts():
    """[128, 128] fp32 tiles: ones, the strict upper triangle ``L[s, t] = s < t`` (as a stationary
    operand: exclusive prefix sums over partitions) and the identity."""
    ip, jf = nl.mgrid[0:P, 0:P]
    d = nisa.iota(jf - ip, dtype=_F32)
    return nl.full((P, P), 1.0, _F32), nl.greater(d, 0.0, dtype=_F32), nl.equal(d, 0.0, dtype=_F32)


def _iota_free(n):
    """[128, n] fp32 tile holding 0..n-1 in every partition."""
    ip, je = nl.mgrid[0:P, 0:n]
    return nisa.iota(je + 0 * ip, dtype=_F32)


def _onehots(iota_e, idf, rows, E1):
    """Per slot j, the [rows, E1] fp32 one-hot of the ids ``idf[:, j]`` (an id outside [0, E1-1]
    counts as E1-1, the dropped column), and their sum M (per token, its assignments per expert)."""
    ohs = []
    for j in range(idf.shape[1]):
        oh = nisa.tensor_scalar(iota_e[0:rows, :], nl.equal, idf[:, j:j + 1], dtype=_F32)
        hit = nisa.tensor_reduce(nl.add, oh, axis=1, keepdims=True)
        miss = nisa.tensor_scalar(hit, nl.multiply, -1.0, op1=nl.add, operand1=1.0, dtype=_F32)
        oh[:, E1 - 1:E1] = nl.add(oh[:, E1 - 1:E1], miss, dtype=_F32)
        ohs.append(oh)
    M = nl.ndarray((rows, E1), _F32, buffer=nl.sbuf)
    M[...] = nl.copy(ohs[0]) if len(ohs) == 1 else nl.add(ohs[0], ohs[1], dtype=_F32)
    for oh in ohs[2:]:
        M[...] = nl.add(M, oh, dtype=_F32)
    return ohs, M


def _prefix(carry, ones, tri, M, rows):
    """Exclusive prefix counts over tokens on the Tensor Engine: ``carry[e] + sum of M[s, e] over the
    tile's rows s < t``; ``carry`` (every partition) then gains the tile's totals."""
    excl = nl.add(nisa.nc_matmul(tri[0:rows, 0:rows], M), carry[0:rows, :], dtype=_F32)
    carry[...] = nl.add(carry, nisa.nc_matmul(ones[0:rows, :], M), dtype=_F32)
    return excl


def _check_2d(t, name, dims):
    check_tensor(t, name, min_dim=2)
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D [{dims}], got shape {tuple(t.shape)}")


def _pick(onehot, vals):
    """Per row, the element of ``vals`` where ``onehot`` is 1: [rows, 1] fp32."""
    return nisa.tensor_reduce(nl.add, nl.multiply(onehot, vals, dtype=_F32), axis=1, keepdims=True)


def _tiled(hbm, tile=None, dtype=None):
    """``hbm [T, C]`` <-> a [128, ceil(T/128), C] tile (token ``t*128 + p`` at ``[p, t]``): loads it
    (``tile`` None) or stores ``tile`` in two DMAs, the full tiles and the rest (per-tile transfers
    would each pay the DMA's fixed cost)."""
    T, C = hbm.shape
    nf, rem = divmod(T, P)
    ip, it, ic = nl.mgrid[0:P, 0:max(nf, 1), 0:C]
    if tile is not None:
        if nf:
            nl.store(hbm[it * P + ip, ic], value=tile[:, 0:nf, :])
        if rem:
            nl.store(hbm[nf * P:T, :], value=tile[0:rem, nf, :])
        return None
    t = nl.ndarray((P, _cdiv(T, P), C), dtype or hbm.dtype, buffer=nl.sbuf)
    if nf:
        t[:, 0:nf, :] = nl.load(hbm[it * P + ip, ic], dtype=dtype)
    if rem:
        t[0:rem, nf, :] = nl.load(hbm[nf * P:T, :], dtype=dtype)
    return t


class _Ahead:
    """Item i+1..i+depth's loads are issued before item i is used (the DMA queues serve transfers in
    program order, so loads issued behind a store would wait for the compute the store waits for);
    ``depth`` from a per-partition byte budget."""

    def __init__(self, n, fetch, nbytes, budget=48 * 1024):
        self.n, self.fetch, self.depth = n, fetch, max(1, min(4, budget // max(1, nbytes)))
        self.ready, self.next = {}, 0

    def get(self, i):
        while self.next < self.n and self.next <= i + self.depth:
            self.ready[self.next] = self.fetch(self.next)
            self.next += 1
        return self.ready.pop(i) if i >= 0 else None


def _gather(src, idx):
    """Rows ``src[idx[p]]`` of an HBM tensor into a [len(idx), C] tile (indirect DMA)."""
    return nl.load(src[idx, nl.arange(src.shape[1])[None, :]])


def _scatter(dst, idx, tile, c0=0, skip=False):
    """``dst[idx[p], c0:c0+C] = tile[p]`` (indirect DMA); with ``skip``, rows whose index is out of
    bounds are not written."""
    nisa.dma_copy(dst=dst[idx, c0 + nl.arange(tile.shape[1])[None, :]], src=tile,
                  oob_mode=nisa.oob_mode.skip if skip else nisa.oob_mode.error)


# -- routing -------------------------------------------------------------------------------------
@nki.jit
def _route_kernel(logits, k, sigmoid, normalize, capacity):
    T, E = logits.shape
    W = max(E, 8)  # max8 reads at least 8 values: pad with -1 (below every gate value)
    ids_o = nl.ndarray((T, k), _I32, buffer=nl.shared_hbm)
    w_o = nl.ndarray((T, k), _F32, buffer=nl.shared_hbm)
    if capacity >= 0:
        ones, tri, _ = _square_consts()
        iota_e = _iota_free(E + 1)
        carry = nl.zeros((P, E + 1), _F32)
    lg_all = _tiled(logits, dtype=_F32)
    ids_all = nl.ndarray((P, _cdiv(T, P), k), _I32, buffer=nl.sbuf)
    w_all = nl.ndarray((P, _cdiv(T, P), k), _F32, buffer=nl.sbuf)
    for ti, t0, rows in _chunks(T):
        lg = lg_all[0:rows, ti, :]
        g = nl.ndarray((rows, W), _F32, buffer=nl.sbuf)
        if W > E:
            g[:, E:W] = nl.full((rows, W - E), -1.0, _F32)
        if sigmoid:
            g[:, 0:E] = nisa.activation(op=nl.sigmoid, data=lg, dtype=_F32)
        else:  # softmax in fp32: exp(x - max) / sum, as torch computes it
            mx = nisa.tensor_reduce(nl.max, lg, axis=1, keepdims=True)
            ssum = nl.ndarray((rows, 1), _F32, buffer=nl.sbuf)
            ex = nisa.activation_reduce(op=nl.exp, data=lg, reduce_op=nl.add, reduce_res=ssum,
                                        bias=nl.multiply(mx, -1.0), dtype=_F32)
            g[:, 0:E] = nisa.tensor_scalar(ex, nl.divide, ssum, dtype=_F32)
        top = nisa.max8(src=g)
        idx = nl.ndarray((rows, 8), nl.uint32, buffer=nl.sbuf)
        # replacing each found value makes tied values resolve to increasing (lowest first) indices
        nisa.nc_match_replace8(data=g, vals=top, imm=-2.0, dst_idx=idx)
        idf = nisa.tensor_copy(idx[:, 0:k], dtype=_F32)
        w = nisa.tensor_copy(top[:, 0:k], dtype=_F32)
        if normalize:
            ws = nisa.tensor_reduce(nl.add, w, axis=1, keepdims=True)
            w = nisa.tensor_scalar(w, nl.divide, ws, dtype=_F32)
        if capacity >= 0:
            ohs, M = _onehots(iota_e, idf, rows, E + 1)
            room = nl.less(_prefix(carry, ones, tri, M, rows), float(capacity), dtype=_F32)  # has room
            for j in range(k):
                kept = _pick(ohs[j], room)
                # kept ? id : E, and the weight times kept
                idf[:, j:j + 1] = nisa.tensor_scalar(nl.subtract(idf[:, j:j + 1], float(E), dtype=_F32),
                                                     nl.multiply, kept, op1=nl.add, operand1=float(E), dtype=_F32)
                w[:, j:j + 1] = nl.multiply(w[:, j:j + 1], kept, dtype=_F32)
        ids_all[0:rows, ti, :] = nisa.tensor_copy(idf, dtype=_I32)
        w_all[0:rows, ti, :] = nl.copy(w)
    _tiled(ids_o, ids_all)
    _tiled(w_o, w_all)
    return ids_o, w_o


def _check_route_args(E, top_k, gate, capacity):
    if not 1 <= E <= 511:
        raise ValueError(f"there are {E} experts; the kernels support 1 to 511")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= min(8, E):
        raise ValueError(f"top_k must be an int in [1, {min(8, E)}] (at most 8 and at most E={E}), got {top_k!r}")
    if gate not in _GATES:
        raise ValueError(f"gate must be one of {_GATES}, got {gate!r}")
    if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0):
        raise ValueError(f"capacity must be a non-negative int or None, got {capacity!r}")


def moe_route(router_logits, top_k, *, gate="softmax", normalize=True, capacity=None):
    """Top-k routing of ``router_logits [T, E]`` (float32/bfloat16; gates in float32) ->
    ``(expert_ids [T, k] int64, weights [T, k] float32)``; ``1 <= top_k <= min(8, E)``, ``E <= 511``.

    ``gate="softmax"`` (Mixtral) or ``"sigmoid"`` (each logit's own). The k largest gate values per
    token, descending; ties go to the lowest expert index (``torch.topk`` on CPU orders ties in no
    specified way and does differ). ``normalize=True`` divides the k values by their sum (Mixtral,
    ``norm_topk_prob``); ``False`` keeps the gate values (softmax over all E, or the sigmoids).
    ``capacity`` (int >= 0): each expert keeps at most ``capacity`` assignments, first come first
    served in token order (a token picks an expert at most once, so its slot does not matter); the
    rest are dropped: id ``E``, weight 0, the token's other weights unchanged (normalised before)."""
    _check_2d(router_logits, "router_logits", "tokens, experts")
    T, E = router_logits.shape
    _check_route_args(E, top_k, gate, capacity)
    if T == 0:
        return (torch.empty(0, top_k, dtype=torch.int64, device=router_logits.device),
                torch.empty(0, top_k, dtype=torch.float32, device=router_logits.device))
    ids, w = _route_kernel(router_logits.contiguous(), top_k, gate == "sigmoid", bool(normalize),
                           -1 if capacity is None else capacity)
    return ids.to(torch.int64), w


# -- permutation ---------------------------------------------------------------------------------
@nki.jit
def _permute_kernel(x, ids, E):
    T, H = x.shape
    k = ids.shape[1]
    E1 = E + 1
    xs = nl.ndarray((T * k, H), x.dtype, buffer=nl.shared_hbm)
    offs_o = nl.ndarray((1, E1), _I32, buffer=nl.shared_hbm)
    order_o = nl.ndarray((T, k), _I32, buffer=nl.shared_hbm)
    tiles = _chunks(T)
    xa = _Ahead(len(tiles), lambda i: nl.load(x[tiles[i][1]:tiles[i][1] + tiles[i][2], :]), H * x.itemsize)
    xa.get(-1)  # the first rows stream in during the counting pass
    ones, tri, _ = _square_consts()
    iota_e = _iota_free(E1)
    # pass 1: per-token expert counts M [rows, E1] of every tile, and each expert's total
    ohs_all, Ms = [], []
    cnt = nl.zeros((P, E1), _F32, buffer=nl.psum)
    ids_all = _tiled(ids, dtype=_F32)
    pos_all = nl.ndarray((P, len(tiles), k), _I32, buffer=nl.sbuf)
    for ti, t0, rows in tiles:
        ohs, M = _onehots(iota_e, ids_all[0:rows, ti, :], rows, E1)
        cnt += nisa.nc_matmul(ones[0:rows, :], M)
        ohs_all.append(ohs)
        Ms.append(M)
    # group starts: exclusive cumulative sum of the totals along the experts
    incl = nl.ndarray((P, E1), _F32, buffer=nl.sbuf)
    nisa.tensor_scalar_cumulative(src=cnt, dst=incl, op0=nl.add, op1=nl.add, imm0=0.0)
    start = nl.subtract(incl, cnt, dtype=_F32)
    nl.store(offs_o, value=nisa.tensor_copy(start[0:1, :], dtype=_I32))
    # pass 2: each assignment's row = its expert's start + earlier assignments to that expert
    for (ti, t0, rows), ohs, M in zip(tiles, ohs_all, Ms):
        xt = xa.get(ti)
        excl = _prefix(start, ones, tri, M, rows)
        pos = pos_all[0:rows, ti, :]
        for j, oh in enumerate(ohs):
            pos[:, j:j + 1] = nisa.tensor_copy(_pick(oh, excl), dtype=_I32)
            if j + 1 < k:  # a later slot of the same token to the same expert (or dropped) comes after
                excl = nl.add(excl, oh, dtype=_F32)
        for j in range(k):
            _scatter(xs, pos[:, j:j + 1], xt)
    _tiled(order_o, pos_all)
    return xs, offs_o, order_o


def moe_permute(x, expert_ids, num_experts):
    """Groups the rows by expert: ``x [T, H]`` (float32/bfloat16), ``expert_ids [T, k]`` (int32/int64)
    -> ``(x_sorted [T*k, H], expert_offsets [E+1] int32, order [T, k] int32)``, one kernel.

    Expert e's rows are ``x_sorted[expert_offsets[e]:expert_offsets[e+1]]`` in token order (stable;
    a token's slots in order j); ``order[t, j]`` is the row holding token t's j-th assignment
    (``x_sorted[order[t, j]] == x[t]``, a permutation of ``0..T*k-1``). Ids ``E`` (dropped) or outside
    ``[0, E)`` go after all experts: rows ``expert_offsets[E]:T*k``."""
    _check_2d(x, "x", "tokens, hidden")
    _check_ids(expert_ids, x.shape[0], "expert_ids")
    E = _check_num_experts(num_experts)
    check_same_device(x=x, expert_ids=expert_ids)
    T, k = expert_ids.shape
    if T == 0 or x.shape[1] == 0:
        return (x.new_empty(T * k, x.shape[1]), torch.zeros(E + 1, dtype=torch.int32, device=x.device),
                torch.arange(T * k, dtype=torch.int32, device=x.device).reshape(T, k))
    xs, offs, order = _permute_kernel(x.contiguous(), expert_ids.to(torch.int32).contiguous(), E)
    return xs, offs.reshape(E + 1), order


def _check_ids(ids, T, name):
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(ids).__name__}")
    if ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64, got {ids.dtype}")
    if ids.dim() != 2 or ids.shape[0] != T or not 1 <= ids.shape[1] <= 8:
        raise ValueError(f"{name} must be [{T}, k] with 1 <= k <= 8 (one row per token), got {tuple(ids.shape)}")


def _check_num_experts(E):
    if isinstance(E, bool) or not isinstance(E, int) or not 1 <= E <= 511:
        raise ValueError(f"num_experts must be an int in [1, 511], got {E!r}")
    return E


# -- grouped GEMMs -------------------------------------------------------------------------------
class _Rows:
    """A row tile: rows ``r0:r0+rows`` known when tracing, or (``ld``/``st`` given) 128 rows at a
    run-time position, by row-index tiles: ``ld`` clamped into the tensor for loads, ``st`` out of
    bounds (skipped) past the group's end for stores."""

    def __init__(self, r0=0, rows=P, ld=None, st=None):
        self.r0, self.rows, self.ld, self.st = r0, rows, ld, st

    def load(self, src):
        return nl.load(src[self.r0:self.r0 + self.rows, :]) if self.ld is None else _gather(src, self.ld)

    def store(self, dst, c0, tile):
        if self.st is not None:
            return _scatter(dst, self.st, tile, c0, skip=True)
        nl.store(dst[self.r0:self.r0 + self.rows, c0:c0 + tile.shape[1]], value=tile[0:self.rows, :])


class _Groups:
    """The row tiles of each group (experts 0..E-1, then the dropped rows as group E): static from
    host offsets, or walked by a dynamic loop whose trip count and row indices come from the
    offsets tensor when the kernel runs."""

    def __init__(self, offs, N, E, host):
        self.N, self.E, self.host = N, E, host
        if host is not None:
            return
        E1 = E + 1
        self.ob = nl.load(offs.reshape((1, E1)).broadcast_to((P, E1)))  # int32, every partition
        ends = nl.ndarray((P, E1), _I32, buffer=nl.sbuf)
        ends[:, 0:E] = nl.copy(self.ob[:, 1:E1])
        ends[:, E:E1] = nl.full((P, 1), N, _I32)
        self.ends = ends
        # tiles per group: ceil(rows / 128)
        self.ntiles = nl.right_shift(nl.add(nl.subtract(ends, self.ob, dtype=_I32), P - 1, dtype=_I32), 7,
                                     dtype=_I32)
        ip, jf = nl.mgrid[0:P, 0:1]
        self.iota = nisa.iota(ip + 0 * jf, dtype=_I32)
        self.row = nl.ndarray((P, 1), _I32, buffer=nl.sbuf)

    def tiles(self, g):
        if self.host is not None:
            lo, hi = self.host[g], (self.host[g + 1] if g < self.E else self.N)
            for r0 in range(lo, hi, P):
                yield _Rows(r0, min(P, hi - r0))
            return
        self.row[...] = nl.copy(self.ob[:, g:g + 1])
        n = nisa2.register_alloc()
        nisa2.register_load(n, self.ntiles[0:1, g:g + 1])
        for _ in nl2.dynamic_range(n):
            r = nl.add(self.row, self.iota, dtype=_I32)
            ld = nl.minimum(r, self.N - 1, dtype=_I32)
            past = nl.greater_equal(r, self.ends[:, g:g + 1], dtype=_I32)
            st = nisa.scalar_tensor_tensor(data=past, op0=nl.multiply, operand0=self.N, op1=nl.add, operand1=r,
                                           dtype=_I32)
            yield _Rows(ld=ld, st=st)
            self.row[...] = nl.add(self.row, P, dtype=_I32)


def _transposed(xt, rows, H, evac):
    """xT [128, KT, 128] (columns 0:rows valid) of the [rows, H] tile xt: Tensor Engine transposes,
    four per PSUM tile."""
    KT = _cdiv(H, P)
    xT = nl.ndarray((P, KT, P), xt.dtype, buffer=nl.sbuf)
    ks = _chunks(H)
    for g0 in range(0, KT, 4):
        grp = ks[g0:g0 + 4]
        pt = nl.ndarray((P, len(grp), rows), xt.dtype, buffer=nl.psum)
        for j, (kc, h0, kw) in enumerate(grp):
            pt[0:kw, j, :] = nisa.nc_transpose(xt[0:rows, h0:h0 + kw])
        if grp[-1][2] == P:
            evac(xT[:, g0:g0 + len(grp), 0:rows], pt)
        else:
            for j, (kc, h0, kw) in enumerate(grp):
                evac(xT[0:kw, kc, 0:rows], pt[0:kw, j, :])
    return xT


def _project(xT, rows, w, K, c0, cw):
    """[rows, cw] fp32 PSUM = x @ W[:, c0:c0+cw] for xT [128, KT, rows] and w [128, KT, C]."""
    ps = nl.ndarray((rows, cw), _F32, buffer=nl.psum)
    for kc, _, kw in _chunks(K):
        ps[...] += nisa.nc_matmul(xT[0:kw, kc, 0:rows], w[0:kw, kc, c0:c0 + cw])
    return ps


def _stream(items, load, groups, group_of, xs, double=True, ahead=4):
    """Per item (an expert's weight block): ``(item, weights, row tiles with their x rows)``. Item
    i+1's weights (and, static, its first ``ahead`` row tiles) are loaded before item i's compute and
    stores are issued: DMA queues serve transfers in program order, so they stream in meanwhile.
    ``double=False``: one expert's weights at a time."""
    static = groups.host is not None

    def fetch(it):
        tiles = list(groups.tiles(group_of(it))) if static else None
        w = load(it)
        return w, tiles, ([rt.load(xs) for rt in tiles[:ahead]] if static else None)

    nxt = fetch(items[0]) if items else None
    for i, it in enumerate(items):
        w, tiles, pre = nxt if nxt is not None else fetch(it)
        nxt = fetch(items[i + 1]) if double and i + 1 < len(items) else None
        if static:
            rows = ((rt, pre[j] if j < len(pre) else rt.load(xs)) for j, rt in enumerate(tiles))
        else:
            rows = ((rt, rt.load(xs)) for rt in groups.tiles(group_of(it)))
        yield it, w, rows


def _load_split(src, parts=4):
    """A [128, KT, C] HBM block in up to ``parts`` DMAs along KT (the first matmuls wait for less)."""
    t = nl.ndarray(tuple(src.shape), src.dtype, buffer=nl.sbuf)
    KT = src.shape[1]
    step = max(1, _cdiv(KT, parts))
    for k0 in range(0, KT, step):
        t[:, k0:min(KT, k0 + step), :] = nl.load(src[:, k0:min(KT, k0 + step), :])
    return t


def _zero_dropped(groups, y, dtype):
    """Rows of the dropped group (offsets[E]:N) get zeros."""
    O = y.shape[1]
    z = None
    for rt in groups.tiles(groups.E):
        if z is None:
            z = nl.zeros((P, min(O, 2048)), dtype)
        for _, c0, cw in _chunks(O, 2048):
            rt.store(y, c0, z[:, 0:cw])


@nki.jit
def _grouped_gemm_kernel(xs, offs, wp, O, host):
    """xs [N, K]; offs [E+1] int32; wp: W[e].T packed [E, nob, 128, KT, OB]; host: None or offsets."""
    N, K = xs.shape
    E, nob, _, KT, OB = wp.shape
    y = nl.ndarray((N, O), xs.dtype, buffer=nl.shared_hbm)
    groups = _Groups(offs, N, E, host)
    evac = _Evac()
    items = [(e, ob) for e in range(E) for ob in range(nob)
             if host is None or host[e + 1] > host[e]]  # static: experts without rows skip their weights
    for (e, ob), wt, rows in _stream(items, lambda it: _load_split(wp[it[0], it[1]]), groups, lambda it: it[0], xs):
        o0, ow = ob * OB, min(OB, O - ob * OB)
        for rt, xt in rows:
            xT = _transposed(xt, rt.rows, K, evac)
            stage = nl.ndarray((P, ow), xs.dtype, buffer=nl.sbuf)
            for _, c0, cw in _chunks(ow, FMAX):
                evac(stage[0:rt.rows, c0:c0 + cw], _project(xT, rt.rows, wt, K, c0, cw))
            rt.store(y, o0, stage[0:rt.rows, :])
    _zero_dropped(groups, y, xs.dtype)
    return y


def _pack(w, ob):
    """``w [E, O, K]`` (per expert an nn.Linear weight, contraction over K) as the kernels stream
    it: ``[E, nob, 128, KT, ob]`` with element ``[e, b, p, kt, o] = w[e, b*ob + o, kt*128 + p]``
    (zero padded), so each partition of a block is one contiguous run."""
    E, O, K = w.shape
    KT, nob = _cdiv(K, P), _cdiv(O, ob)
    wt = torch.nn.functional.pad(w, (0, KT * P - K, 0, nob * ob - O))
    return wt.reshape(E, nob, ob, KT, P).permute(0, 1, 4, 3, 2).contiguous()


def _gemm_block(K, O, isz):
    """Output columns per weight block: all of O if two blocks fit the budget, else 2048..128."""
    for ob in (O, 2048, 1024, 512, 256, 128):
        if ob <= O and 2 * _cdiv(K, P) * ob * isz <= _W_BUDGET:
            return ob
    raise ValueError(f"the contraction size {K} is too large for the grouped GEMM kernel's SBUF budget "
                     f"({_W_BUDGET} bytes per partition for two [{K}, 128] weight blocks)")


def _check_offsets(offs, host, E, N):
    """Checks expert_offsets (and host_offsets when given); returns host_offsets as a tuple or None."""
    if not isinstance(offs, torch.Tensor) or offs.dtype not in (torch.int32, torch.int64) or offs.dim() != 1 \
            or offs.shape[0] != E + 1:
        raise ValueError(f"expert_offsets must be a 1-D int32/int64 tensor of E+1 = {E + 1} offsets, got "
                         f"{getattr(offs, 'dtype', type(offs).__name__)} of shape {tuple(getattr(offs, 'shape', ()))}")
    host = None if host is None else tuple(int(v) for v in host)
    if host is not None and (len(host) != E + 1 or host[0] != 0 or host[-1] > N
                             or any(b < a for a, b in zip(host, host[1:]))):
        raise ValueError(f"host_offsets must be E+1 = {E + 1} non-decreasing ints from 0 to at most {N}, got {host}")
    return host


def moe_grouped_gemm(x_sorted, expert_offsets, w, *, host_offsets: Optional[Sequence[int]] = None):
    """Per-expert GEMMs: ``y[r] = x_sorted[r] @ w[e].T`` for the rows ``r`` in
    ``expert_offsets[e]:expert_offsets[e+1]``; rows from ``expert_offsets[E]`` on (dropped) are zero.

    ``x_sorted [N, K]`` float32/bfloat16, ``expert_offsets [E+1]`` int32/int64 (non-decreasing from 0,
    at most N, as :func:`moe_permute` makes them), ``w [E, O, K]`` in x's dtype (nn.Linear layout per
    expert; torch repacks it for the kernel on each call). Returns ``[N, O]`` in x's dtype (fp32
    accumulation, bf16 operands multiply in bf16). Group sizes stay on the device: ONE traced kernel
    serves every routing, each expert's 128-row tiles walked by a dynamic loop (``nl.dynamic_range``)
    whose trip count the kernel reads from ``expert_offsets``. ``host_offsets`` (the same offsets as
    ints, trusted to match) traces static loops for that pattern instead: one trace per pattern,
    better load/compute overlap, and what ``nki.profile`` models (it counts a dynamic body once)."""
    _check_2d(x_sorted, "x_sorted", "rows, K")
    check_tensor(w, "w", min_dim=3)
    if w.dim() != 3 or w.shape[2] != x_sorted.shape[1]:
        raise ValueError(f"w must be [E, O, {x_sorted.shape[1]}] (per expert an nn.Linear weight over x's last "
                         f"dimension), got {tuple(w.shape)}")
    if w.dtype != x_sorted.dtype:
        raise TypeError(f"w has dtype {w.dtype} but x_sorted has {x_sorted.dtype}; the kernel multiplies like dtypes")
    E, O, K = w.shape
    N = x_sorted.shape[0]
    host = _check_offsets(expert_offsets, host_offsets, E, N)
    check_same_device(x_sorted=x_sorted, expert_offsets=expert_offsets, w=w)
    if N == 0 or O == 0:
        return x_sorted.new_empty(N, O)
    if K == 0:
        return x_sorted.new_zeros(N, O)
    ob = _gemm_block(K, O, x_sorted.element_size())
    return _grouped_gemm_kernel(x_sorted.contiguous(), expert_offsets.to(torch.int32).contiguous(), _pack(w, ob), O,
                                host)


# -- fused SwiGLU experts ------------------------------------------------------------------------
@nki.jit
def _experts_kernel(xs, offs, wg, wu, wd, host):
    """Per expert e: y = (silu(x @ w_gate[e].T) * (x @ w_up[e].T)) @ w_down[e].T on its rows. wg, wu:
    [E, 1, 128, KT, I]; wd: [E, 1, 128, IC, H] (``_pack``)."""
    N, H = xs.shape
    E, _, _, KT, I = wg.shape
    dt = xs.dtype
    y = nl.ndarray((N, H), dt, buffer=nl.shared_hbm)
    groups = _Groups(offs, N, E, host)
    evac = _Evac()
    items = [e for e in range(E) if host is None or host[e + 1] > host[e]]
    load = lambda e: (_load_split(wg[e, 0], 2), _load_split(wu[e, 0], 2), _load_split(wd[e, 0], 2))  # noqa: E731
    ics = _chunks(I)
    double = 2 * (2 * KT * I + len(_chunks(I)) * H) * xs.itemsize <= _W_BUDGET
    for e, (wg_t, wu_t, wd_t), tiles in _stream(items, load, groups, lambda it: it, xs, double, 4 if double else 2):
        for rt, xt in tiles:
            rows = rt.rows
            xT = _transposed(xt, rows, H, evac)
            actT = nl.ndarray((P, len(ics), P), dt, buffer=nl.sbuf)  # silu(g) * u, transposed: [I, rows]
            for ic, i0, iw in ics:
                pg = nl.ndarray((iw, rows), _F32, buffer=nl.psum)
                pu = nl.ndarray((iw, rows), _F32, buffer=nl.psum)
                for kc, _, kw in _chunks(H):
                    pg[...] += nisa.nc_matmul(wg_t[0:kw, kc, i0:i0 + iw], xT[0:kw, kc, 0:rows])
                for kc, _, kw in _chunks(H):
                    pu[...] += nisa.nc_matmul(wu_t[0:kw, kc, i0:i0 + iw], xT[0:kw, kc, 0:rows])
                sg = nisa.activation(op=nl.silu, data=pg, dtype=_F32)                       # Scalar Engine
                actT[0:iw, ic, 0:rows] = nisa.tensor_tensor(sg, pu, nl.multiply, dtype=dt)  # Vector Engine
            stage = nl.ndarray((P, H), dt, buffer=nl.sbuf)
            for _, c0, cw in _chunks(H, FMAX):
                evac(stage[0:rows, c0:c0 + cw], _project(actT, rows, wd_t, I, c0, cw))
            rt.store(y, 0, stage[0:rows, :])
    _zero_dropped(groups, y, dt)
    return y


def _experts_fit(H, I, isz):
    """Whether one expert's three weight matrices fit in SBUF (the kernel double-buffers them when
    two fit the weight budget, else loads one expert at a time)."""
    return (2 * _cdiv(H, P) * I + _cdiv(I, P) * H) * isz <= _W_BUDGET + 16 * 1024


def _check_experts(x, w_gate, w_up, w_down):
    """(E, I) of SwiGLU expert weights for x [..., H], or a ValueError/TypeError saying what is off."""
    H = x.shape[-1]
    check_tensor(w_gate, "w_gate", min_dim=3)
    E, I = w_gate.shape[0], w_gate.shape[1]
    for name, t, shape in (("w_gate", w_gate, (E, I, H)), ("w_up", w_up, (E, I, H)), ("w_down", w_down, (E, H, I))):
        check_tensor(t, name, min_dim=3)
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must be {list(shape)} (E experts, I = w_gate.shape[1], H = x's last dim), "
                             f"got {tuple(t.shape)}")
        if t.dtype != x.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but x has {x.dtype}; the kernel multiplies like dtypes")
    check_same_device(x=x, w_gate=w_gate, w_up=w_up, w_down=w_down)
    return E, I


def moe_experts_sorted(x_sorted, expert_offsets, w_gate, w_up, w_down, *, host_offsets=None):
    """The SwiGLU experts on grouped rows: ``(silu(x @ w_gate[e].T) * (x @ w_up[e].T)) @ w_down[e].T``
    for expert e's rows (dropped rows zero); ``w_gate``/``w_up [E, I, H]``, ``w_down [E, H, I]`` in x's
    dtype. One fused kernel (dynamic loops as :func:`moe_grouped_gemm`) when an expert's weights fit
    in SBUF (e.g. H = I = 1024, bf16 or fp32): the [rows, I] activations never leave the chip, gate
    and up computed transposed so ``silu(g) * u`` is the down projection's stationary operand.
    Larger experts: two grouped GEMMs around torch's ``silu(g) * u``."""
    _check_2d(x_sorted, "x_sorted", "rows, H")
    H = x_sorted.shape[1]
    E, I = _check_experts(x_sorted, w_gate, w_up, w_down)
    N = x_sorted.shape[0]
    host = _check_offsets(expert_offsets, host_offsets, E, N)
    check_same_device(x_sorted=x_sorted, expert_offsets=expert_offsets)
    if N == 0 or H == 0:
        return x_sorted.new_empty(N, H)
    if I == 0:
        return x_sorted.new_zeros(N, H)
    if not _experts_fit(H, I, x_sorted.element_size()):
        g = moe_grouped_gemm(x_sorted, expert_offsets, w_gate, host_offsets=host)
        u = moe_grouped_gemm(x_sorted, expert_offsets, w_up, host_offsets=host)
        return moe_grouped_gemm(torch.nn.functional.silu(g) * u, expert_offsets, w_down, host_offsets=host)
    return _experts_kernel(x_sorted.contiguous(), expert_offsets.to(torch.int32).contiguous(), _pack(w_gate, I),
                           _pack(w_up, I), _pack(w_down, H), host)


# -- combine -------------------------------------------------------------------------------------
@nki.jit
def _combine_kernel(ys, order, w, T):
    N, O = ys.shape
    k = order.shape[1]
    dt = ys.dtype
    y = nl.ndarray((T, O), dt, buffer=nl.shared_hbm)
    _, _, ident = _square_consts()
    evac = _Evac()
    od_all, w_all = _tiled(order), _tiled(w)
    tiles = _chunks(T)
    ga = _Ahead(len(tiles), lambda i: [_gather(ys, od_all[0:tiles[i][2], i, j:j + 1]) for j in range(k)],
                k * O * ys.itemsize)
    for ti, t0, rows in tiles:
        wt = w_all[0:rows, ti, :]
        gathered = ga.get(ti)
        # diag(w_j) as the stationary operand sums w_j * row_j on the Tensor Engine; for bf16 rows the
        # fp32 weight is split into bf16 hi + lo parts, keeping ~16 bits of it
        diags = []
        for j in range(k):
            d32 = nisa.tensor_scalar(ident[0:rows, 0:rows], nl.multiply, wt[:, j:j + 1], dtype=_F32)
            if dt == _F32:
                diags.append((j, d32))
            else:
                hi = nisa.tensor_copy(d32, dtype=dt)
                diags += [(j, hi), (j, nl.subtract(d32, hi, dtype=dt))]
        stage = nl.ndarray((P, O), dt, buffer=nl.sbuf)
        for _, c0, cw in _chunks(O, FMAX):
            ps = nl.ndarray((rows, cw), _F32, buffer=nl.psum)
            for j, d in diags:
                ps[...] += nisa.nc_matmul(d, gathered[j][:, c0:c0 + cw])
            evac(stage[0:rows, c0:c0 + cw], ps)
        nl.store(y[t0:t0 + rows, :], value=stage[0:rows, :])
    return y


def _check_weights(weights, ids):
    check_tensor(weights, "weights", min_dim=2)
    if tuple(weights.shape) != tuple(ids.shape):
        raise ValueError(f"weights {tuple(weights.shape)} must have the ids' shape {tuple(ids.shape)} ([tokens, k])")


def moe_combine(y_sorted, order, weights, T):
    """``y[t] = sum_j weights[t, j] * y_sorted[order[t, j]]`` -> ``[T, O]`` in y_sorted's dtype.

    ``y_sorted [N, O]`` float32/bfloat16, ``order [T, k]`` from :func:`moe_permute`, ``weights [T, k]``
    (products and sums in fp32, one rounding). A gather per token (no scatter-add conflicts), summed
    on the Tensor Engine. Dropped assignments have weight 0 and zero rows: they add nothing."""
    _check_2d(y_sorted, "y_sorted", "rows, features")
    if isinstance(T, bool) or not isinstance(T, int) or T < 0:
        raise ValueError(f"T must be a non-negative int (the number of tokens), got {T!r}")
    _check_ids(order, T, "order")
    _check_weights(weights, order)
    if y_sorted.shape[0] != order.numel():
        raise ValueError(f"y_sorted has {y_sorted.shape[0]} rows but order holds {order.numel()} assignments "
                         f"(T*k); pass the rows moe_permute/moe_grouped_gemm produced")
    check_same_device(y_sorted=y_sorted, order=order, weights=weights)
    O = y_sorted.shape[1]
    if T == 0 or O == 0:
        return y_sorted.new_zeros(T, O)
    return _combine_kernel(y_sorted.contiguous(), order.to(torch.int32).contiguous(),
                           weights.to(torch.float32).contiguous(), T)
