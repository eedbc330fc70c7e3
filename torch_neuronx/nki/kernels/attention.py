"""FlashAttention forward (and a naive attention kernel for comparison) in ``torch_neuronx.nki``;
the backward is in :mod:`.attention_bwd`.

Shapes follow ``torch.nn.functional.scaled_dot_product_attention``: ``q`` ``[B, Hq, Sq, D]``,
``k``/``v`` ``[B, Hkv, Skv, D]`` with ``Hkv`` dividing ``Hq`` (query head ``h`` reads key/value head
``h // (Hq // Hkv)``: GQA, MQA), ``D <= 128``, all float32 or all bfloat16.

Masking (top-left aligned, as SDPA's ``is_causal``): query ``i`` sees key ``j`` when ``j <= i``
(``causal``) and ``j > i - window`` (``window=W``: the ``W`` most recent keys up to and including
position ``i``, i.e. ``i - W < j``; without ``causal`` the window has no upper end, so ``j`` may be
after ``i``). A query row that sees no key (only possible with a window and ``Sq > Skv + W - 1``)
gets output 0 and log-sum-exp 0, the convention of torch's CPU flash kernel
(``aten._scaled_dot_product_flash_attention_for_cpu``), whose ``lse`` (natural log, float32,
``[B, Hq, Sq]``, of the scaled masked scores) ours matches.

How the forward kernel works (one launch for all batches and heads; 128-query tiles):

* K^T and V of a 4096-key section stay in SBUF for every query tile of the kv head's query heads
  (loaded once per kv head when ``Skv <= 4096``). torch lays the operands out around the launch:
  Q and K transposed (``[D, S]``: the contraction dim D on partitions), V by 128-key tile
  (``[128, tiles, D]``: a 512-key block loads with 1 KiB contiguous per partition).
* QK^T: one matmul per 512-key block (bf16 operands for bf16 inputs, fp32 accumulation in PSUM).
  The Vector Engine moves each block to SBUF scaled, and keeps the row max in its reduction
  registers across the tile's blocks (``tensor_scalar_reduce``, the last one writes ``-max``).
  Key blocks no query of the tile sees (causal, window) are skipped at trace time; 128-key chunks
  that are partly visible are masked with ``affine_select`` before the max.
* Softmax: ``exp(s - max)`` on the Scalar Engine into bf16 P; its reduction registers sum each
  row over the tile's blocks (fp32, before rounding).
* P^T for the PV matmul: 128x128 transposes on the Tensor Engine into PSUM, copied to SBUF either
  by the Vector Engine - two bf16 chunks at once as int32 words (a same-dtype copy is bit-exact
  and costs one cycle per 4-byte element) - or by the Scalar Engine; a rough clock of both engines
  picks the one that would finish first for each copy.
* Online softmax across sections (``Skv > 4096``): running max, rescaled O and row sum.
* Software pipelining: two block streams - QK^T and row max of tile ``t+1`` (Tensor, Vector)
  next to exp, transposes, copies and PV of tile ``t`` (Scalar, Tensor, both copy engines) - run
  across tiles, heads and batches without draining, in a modulo schedule that queues each Tensor
  Engine instruction behind work that is ready by then. Loads are issued in the order the streams
  need them (the DMA queues share the link in program order). Causal tiles run in the order
  0, 2, 4, ..., 5, 3, 1 (neighbours of similar size; short pipeline fill and drain).

Modeled (``torch_neuronx.nki.profile``, Trainium2) at B=1, H=1, S=4096, D=128, bf16: 60.5% of the
Tensor Engine's peak without a mask, 56.6% causal (computed FLOPs; the Vector and Scalar Engines
are 92-95% busy: a row max, an exp and a copy of P^T per score bound it); the naive kernel 6.5%.
"""
from __future__ import annotations

import math

import torch

from .. import isa as nisa
from .. import jit
from .. import language as nl

_NEG = -1.0e30      # masked score: exp(scale * (_NEG - max)) is 0 for any row with a visible key
_SEC = 4096         # keys of K^T/V held in SBUF at once (one online-softmax step)
_QT = 128           # queries per tile (partitions)
_KB = 512           # keys per QK^T matmul (moving free size)
_KC = 128           # keys per P^T chunk (contraction of the PV matmul)
_QAHEAD = 16        # Q^T loads are issued this many blocks ahead of their use
_QGRP = 8           # Q^T tiles per load
_LSE_BATCH = 16     # tiles whose lse is computed together
_GROUP = 8          # query tiles whose running state is kept when Skv spans several sections
_CLK = {"v": 0.96, "s": 1.2}  # Vector / Scalar Engine GHz (Trainium2), for the load balance only


class _Balance:
    """A rough clock of the Vector and Scalar Engines (ns; each runs its instructions in order, a
    dependency can hold one back) to place the copies that either engine can do on the one that
    would finish first."""

    def __init__(self):
        self.t = {"v": 0.0, "s": 0.0}

    def add(self, eng, cycles, ready=0.0):
        self.t[eng] = max(self.t[eng], ready) + max(64, cycles) / _CLK[eng]
        return self.t[eng]

    def pick(self, v_cycles, s_cycles, ready=0.0):
        v = max(self.t["v"], ready) + max(64, v_cycles) / _CLK["v"]
        s = max(self.t["s"], ready) + max(64, s_cycles) / _CLK["s"]
        eng = "v" if v <= s else "s"
        self.t[eng] = min(v, s)
        return eng


def visible_chunks(r0, rows, s0, s1, skv, causal, window):
    """The 128-key chunks of keys [s0, s1) that queries [r0, r0 + rows) may see, grouped by
    512-key block: ``[[(chunk, first_key, width, mask_causal, mask_window), ...], ...]``."""
    lo, hi = s0, min(s1, skv) - 1
    if causal:
        hi = min(hi, r0 + rows - 1)
    if window is not None:
        lo = max(lo, r0 - window + 1)
    if lo > hi:
        return []
    blocks = {}
    for c in range(lo // _KC, hi // _KC + 1):
        k0 = c * _KC
        wc = min(_KC, skv - k0)
        mc = causal and k0 + wc - 1 > r0
        mw = window is not None and k0 <= r0 + rows - 1 - window
        blocks.setdefault(k0 // _KB, []).append((c, k0, wc, mc, mw))
    return [blocks[b] for b in sorted(blocks)]


def _segments(blk):
    """A block's chunks as (first, last, masked): runs of unmasked chunks, masked chunks alone."""
    segs, a = [], 0
    while a < len(blk):
        if blk[a][3] or blk[a][4]:
            segs.append((a, a, True))
            a += 1
            continue
        e = a
        while e + 1 < len(blk) and not (blk[e + 1][3] or blk[e + 1][4]):
            e += 1
        segs.append((a, e, False))
        a = e + 1
    return segs


def masked_scores(dst, src, r0, k0, rows, wc, mc, mw, window, fill):
    """``dst = src`` where query ``r0 + i`` sees key ``k0 + j`` (causal and/or window), else ``fill``."""
    iq, ik = nl.mgrid[0:rows, 0:wc]
    first = src
    if mc:
        dst[...] = nisa.affine_select((r0 + iq) - (k0 + ik) >= 0, first, fill)
        first = dst
    if mw:
        dst[...] = nisa.affine_select((k0 + ik) - (r0 + iq) + (window - 1) >= 0, first, fill)


def _empty_rows_from(sq, skv, window):
    """First query row that sees no key (a window past the keys' end), or ``sq`` when none."""
    return sq if window is None else min(sq, skv + window - 1)


@jit
def _flash_fwd_kernel(qT, kT, v, scale, causal, window):
    """qT [B, Hq, D, Sq], kT [B, Hkv, D, Skv], v by 128-key chunk [B, Hkv, 128, chunks, D] (key
    c*128 + p at [:, :, p, c]) -> out [B, Hq, Sq, D], lse [B, Hq, Sq, 1]."""
    B, Hq, D, Sq = qT.shape
    Hkv, Skv = kT.shape[1], kT.shape[3]
    G = Hq // Hkv
    out = nl.ndarray((B, Hq, Sq, D), dtype=qT.dtype, buffer=nl.shared_hbm)
    lse = nl.ndarray((B, Hq, Sq, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    nsec = math.ceil(Skv / _SEC)
    nq = math.ceil(Sq / _QT)
    ctx = _Ctx(qT=qT, kT=kT, v=v, out=out, lse=lse, scale=scale, causal=causal, window=window, D=D, Sq=Sq, nq=nq,
               dt=qT.dtype, empty_from=_empty_rows_from(Sq, Skv, window), bal=_Balance(), state={}, running={},
               lse_pending=[])
    # causal: tile sizes grow with t; the order 0, 2, 4, ..., 5, 3, 1 keeps neighbours alike (the
    # two streams' steps pair up) and starts and ends with small tiles (short fill and drain)
    order = [t for t in range(0, nq, 2)] + [t for t in range(nq - 1 - nq % 2, 0, -2)] if causal else range(nq)
    units, empty = [], []
    for b in range(B):
        for kh in range(Hkv):
            items = [(kh * G + g, t) for g in range(G) for t in order]
            per = len(items) if nsec == 1 else _GROUP  # tiles whose running state is kept
            for g0 in range(0, len(items), per):
                group, seen = items[g0:g0 + per], set()
                for x in range(nsec):
                    sec = _Sec(b, kh, x * _SEC, min(Skv, (x + 1) * _SEC), causal, window)
                    for h, t in group:
                        r0, rows = t * _QT, min(_QT, Sq - t * _QT)
                        blocks = visible_chunks(r0, rows, sec.s0, sec.s1, Skv, causal, window)
                        if blocks:
                            last = not any(visible_chunks(r0, rows, y * _SEC, (y + 1) * _SEC, Skv, causal, window)
                                           for y in range(x + 1, nsec))
                            units.append(_Unit(sec, b, h, t, r0, rows, blocks, last))
                            seen.add((h, t))
                empty += [(b, h, t) for h, t in group if (h, t) not in seen]
    if units:
        _run(ctx, units)
    for b, h, t in empty:  # query tiles that see no key at all: output 0, lse 0
        r0, rows = t * _QT, min(_QT, Sq - t * _QT)
        nl.store(out[b, h, r0:r0 + rows, :], value=nl.zeros((rows, D), dtype=qT.dtype))
        nl.store(lse[b, h, r0:r0 + rows, :], value=nl.zeros((rows, 1), dtype=nl.float32))
    return out, lse


class _Ctx:
    """What the stages of one launch share (trace-time Python only)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


class _Sec:
    """Keys [s0, s1) of kv head kh of batch b: K^T and V held in SBUF for the units that use them."""

    def __init__(self, b, kh, s0, s1, causal, window):
        self.b, self.kh, self.s0, self.s1 = b, kh, s0, s1
        self.units, self.qts, self.kT_sb = [], {}, None


class _Unit:
    """One query tile against the visible keys of one K/V section."""

    def __init__(self, sec, b, h, t, r0, rows, blocks, last):
        self.sec, self.b, self.h, self.t, self.r0, self.rows = sec, b, h, t, r0, rows
        self.blocks, self.last, self.key = blocks, last, (b, h, t)
        self.width = sum(ch[2] for blk in blocks for ch in blk)
        sec.units.append(self)


def _run(ctx, units):
    """All units as two block streams: scores/row max (Tensor, Vector) running about one tile ahead
    of softmax/PV (Scalar, Tensor, both copy engines), across tiles, heads and sections without
    draining; the loads issued in the order the streams need them."""
    ends, n = [], 0
    for u in units:
        n += len(u.blocks)
        ends.append(n)
    # DMAs take their turn on the link in program order, so the loads are issued in the order the
    # streams need them: K^T blocks and Q^T (_QGRP tiles per load) by the scores stream's block
    # position that first reads them, V by the softmax stream's (a tile behind); those needed
    # later are issued from the scores stream, _QAHEAD blocks ahead (a load issued behind a store
    # waits for the store's data)
    loads, seen, p = [], set(), 0
    for i, u in enumerate(units):
        sec = u.sec
        if sec.kT_sb is None:
            _alloc_section(ctx, sec)
        lead = ends[i] + 2  # the scores stream's position when this unit's softmax starts
        first = i == 0 or units[i - 1].sec is not sec
        qkey = (sec, "q1", u.h, u.t) if first else (sec, "qg", u.h, u.t // _QGRP)
        if qkey not in seen:  # the section's first tile alone: it starts
            seen.add(qkey)
            loads.append((p, 0, qkey))
        for j, blk in enumerate(u.blocks):
            kb = (blk[0][1] - sec.s0) // _KB
            if (sec, "k", kb) not in seen:
                seen.add((sec, "k", kb))
                loads.append((p, 1, (sec, "k", kb)))
            if (sec, "v", kb) not in seen:
                seen.add((sec, "v", kb))
                loads.append((min(n, lead + j), 2, (sec, "v", kb)))
            p += 1
    loads.sort(key=lambda x: (x[0], x[1]))
    ctx.pending = [x for x in loads if x[0] >= _QAHEAD]
    for need, _, what in loads:
        if need < _QAHEAD:
            _issue_load(ctx, what)

    sa, sb = _scores_stream(ctx, units), _softmax_stream(ctx, units)
    a_pos = b_pos = 0
    while True:
        # the scores of a tile are complete (row max known) two blocks before its softmax starts
        # and then both advance a block at a time
        ui = next((i for i, e in enumerate(ends) if b_pos < e), len(units) - 1)
        target = min(n, ends[ui] + 2 + b_pos - (ends[ui] - len(units[ui].blocks)))
        while a_pos < target:
            next(sa)
            a_pos += 1
        try:
            next(sb)
        except StopIteration:
            break
        b_pos += 1
    for _ in sa:
        pass
    _flush_lse(ctx)


def _alloc_section(ctx, sec):
    D, dt = ctx.D, ctx.dt
    sec.kT_sb = nl.ndarray((D, sec.s1 - sec.s0), dtype=dt, buffer=nl.sbuf)
    sec.v_sb = nl.ndarray((_KC, math.ceil((sec.s1 - sec.s0) / _KC), D), dtype=dt, buffer=nl.sbuf)
    # per unit: l (the row sums) and -max as columns, for the batched lse (L is filled with ones
    # when the section's softmax starts: rows of a partial tile are never written)
    sec.L = None
    sec.NM = nl.ndarray((_QT, len(sec.units)), dtype=nl.float32, buffer=nl.sbuf)
    for i, u in enumerate(sec.units):
        u.idx = i


def _issue_load(ctx, what):
    """One load: (sec, "k", block) K^T, (sec, "v", block or chunk) V, (sec, "q1"/"qg", head, tile or
    group) Q^T."""
    sec, kind, x = what[0], what[1], what[-1]
    b, kh, s0, s1 = sec.b, sec.kh, sec.s0, sec.s1
    if kind in ("q1", "qg"):
        _load_q(ctx, sec, what[2], x, group=kind == "qg")
    elif kind == "k":
        k0 = s0 + x * _KB
        k1 = min(s1, k0 + _KB)
        sec.kT_sb[:, k0 - s0:k1 - s0] = nl.load(ctx.kT[b, kh, :, k0:k1])
    else:  # V of a block: [128, 4, D] with 4 * D contiguous elements per partition (V by tile)
        c0 = x * (_KB // _KC)
        n = min(_KB // _KC, sec.v_sb.shape[1] - c0)
        sec.v_sb[:, c0:c0 + n, :] = nl.load(ctx.v[b, kh, :, s0 // _KC + c0:s0 // _KC + c0 + n, :])


def _load_q(ctx, sec, h, t, group=False):
    """Q^T [D, rows] of tile t of head h, or (group) of the tiles of group t not loaded yet (one
    DMA per run of them: longer contiguous runs per partition than a DMA per tile)."""
    tiles = range(t * _QGRP, min(ctx.nq, (t + 1) * _QGRP)) if group else [t]
    tiles = [x for x in tiles if (h, x) not in sec.qts]
    while tiles:
        n = 1
        while n < len(tiles) and tiles[n] == tiles[0] + n:
            n += 1
        r0 = tiles[0] * _QT
        total = min(ctx.Sq, r0 + n * _QT) - r0
        big = nl.ndarray((ctx.D, n * _QT), dtype=ctx.dt, buffer=nl.sbuf)
        big[:, 0:total] = nl.load(ctx.qT[sec.b, h, :, r0:r0 + total])
        for j in range(n):
            sec.qts[(h, tiles[j])] = big[:, j * _QT:(j + 1) * _QT]
        tiles = tiles[n:]


def _scores_stream(ctx, units):
    """Per block: QK^T into PSUM (the next block's matmul is issued before this block's copy, so the
    Vector Engine never waits on a matmul queued behind PV matmuls), then the Vector Engine's
    scaled copy to SBUF with the row max (masked chunks: affine_select first). After a tile's last
    block: its -max (with the running max of earlier sections)."""
    flat = [(i, j) for i, u in enumerate(units) for j in range(len(u.blocks))]

    def qk(p):
        i, j = flat[p]
        u, blk = units[i], units[i].blocks[j]
        k0 = blk[0][1] - u.sec.s0
        w = sum(ch[2] for ch in blk)
        return nisa.nc_matmul(u.sec.qts[(u.h, u.t)][:, 0:u.rows], u.sec.kT_sb[:, k0:k0 + w])

    nxt = qk(0)
    for p, (i, j) in enumerate(flat):
        u, blk = units[i], units[i].blocks[j]
        rows = u.rows
        if j == 0:
            u.nseg = sum(len(_segments(b_)) for b_ in u.blocks)
            u.s_sb = nl.ndarray((_QT, u.width), dtype=nl.float32, buffer=nl.sbuf)
            u.nm = u.sec.NM[:, u.idx:u.idx + 1]
            u.off, u.col = 0, 0
        while ctx.pending and ctx.pending[0][0] <= p + _QAHEAD:
            _issue_load(ctx, ctx.pending.pop(0)[2])
        s_ps = nxt
        if p + 1 < len(flat):
            nxt = qk(p + 1)

        def copy_max(dst, src):
            # scaled copy; the row max accumulates in the Vector Engine's registers over the tile's
            # copies (the instructions in between leave them alone), the last one writes -max
            last = u.col == u.nseg - 1
            dst[...] = nisa.tensor_scalar_reduce(
                data=src, op0=nl.multiply, operand0=ctx.scale, reduce_op=nl.maximum,
                reduce_res=u.nm[0:rows, :] if last else None, reduce_res_negate=last,
                reduce_cmd=nisa.reduce_cmd.reset_reduce if u.col == 0 else nisa.reduce_cmd.reduce)
            u.col += 1

        k0 = blk[0][1]
        for a, e, masked in _segments(blk):
            lo, hi = blk[a][1] - k0, blk[e][1] - k0 + blk[e][2]
            dst = u.s_sb[0:rows, u.off + lo:u.off + hi]
            if masked:  # one chunk: select, then the scaled copy in place
                c, ck0, wc, mc, mw = blk[a]
                masked_scores(dst, s_ps[0:rows, lo:hi], u.r0, ck0, rows, wc, mc, mw, ctx.window, _NEG)
                copy_max(dst, dst)
                ctx.bal.add("v", wc * (1 + int(mc) + int(mw)))
            else:  # a run of unmasked chunks: one copy
                copy_max(dst, s_ps[0:rows, lo:hi])
                ctx.bal.add("v", hi - lo)
        u.off += sum(ch[2] for ch in blk)
        if j == len(u.blocks) - 1:
            prev = ctx.running.get(u.key)
            if prev is not None:  # a later step of the tile's online softmax: the running max
                u.nm[0:rows, :] = nisa.tensor_tensor(u.nm[0:rows, :], prev[0:rows, :], nl.minimum)
                ctx.bal.add("v", 64)
            ctx.running[u.key] = u.nm
            u.t_max = ctx.bal.t["v"]
        yield


def _softmax_stream(ctx, units):
    """A modulo schedule, one block per step: the Scalar Engine's exp of block k, the PV matmuls
    of block k-2, the transposes of block k, the copies of P^T of block k-1, a tile's final
    normalization one step after its last PV. Each Tensor Engine instruction is queued behind work
    that is ready by then, so no engine waits on another's newest result (the three are about
    equally loaded); the stream runs across tiles without draining."""
    dt, D, bal = ctx.dt, ctx.D, ctx.bal
    packed = dt == nl.bfloat16  # P^T chunks copied two at a time as int32 words
    transposed, copied, finals = [], [], []

    def copies(pairs):
        done = []
        for u, pair, pt_ps, ready in pairs:
            rows = u.rows
            pt_sb = nl.ndarray((_KC, 2, _QT), dtype=dt, buffer=nl.sbuf)
            can_pack = packed and rows == _QT and len(pair) == 2
            if can_pack and bal.pick(_QT, 2 * _QT, ready) == "v":
                pt_sb.view(nl.int32)[...] = nisa.tensor_copy(pt_ps.view(nl.int32))
            else:
                for j, (c, ck0, wc, _, _) in enumerate(pair):
                    if can_pack or bal.pick(rows, rows, ready) == "s":
                        pt_sb[0:wc, j, 0:rows] = nisa.activation(op=nl.copy, data=pt_ps[0:wc, j, 0:rows])
                    else:
                        pt_sb[0:wc, j, 0:rows] = nisa.tensor_copy(pt_ps[0:wc, j, 0:rows])
            done.append((u, pair, pt_sb))
        return done

    def pv(pairs):
        ready = []
        for u, pair, pt_sb in pairs:
            for j, (c, ck0, wc, _, _) in enumerate(pair):
                u.o_ps[0:u.rows, :] += nisa.nc_matmul(pt_sb[0:wc, j, 0:u.rows],
                                                     u.sec.v_sb[0:wc, c - u.sec.s0 // _KC, :])
                u.todo -= 1
            if u.todo == 0:
                ready.append(u)
        return ready

    flat = [(u, j) for u in units for j in range(len(u.blocks))]
    for p in range(len(flat) + 3):
        if p < len(flat):
            u, j = flat[p]
            rows, blk = u.rows, u.blocks[j]
            if j == 0:
                if u.sec.L is None:
                    u.sec.L = nl.full((_QT, len(u.sec.units)), 1.0, dtype=nl.float32)
                u.p_sb = nl.ndarray((_QT, u.width), dtype=dt, buffer=nl.sbuf)
                u.o_ps = nl.zeros((_QT, D), nl.float32, buffer=nl.psum)
                u.l = u.sec.L[:, u.idx:u.idx + 1]
                u.todo = sum(len(b_) for b_ in u.blocks)
                u.off = 0
            w = sum(ch[2] for ch in blk)
            # the row sum accumulates in the Scalar Engine's registers over the tile's blocks (the
            # other activations in between leave them alone); the last exp writes it out
            last_blk = j == len(u.blocks) - 1
            u.p_sb[0:rows, u.off:u.off + w] = nisa.activation(
                op=nl.exp, data=u.s_sb[0:rows, u.off:u.off + w], bias=u.nm[0:rows, :], scale=1.0, dtype=dt,
                reduce_op=nl.add, reduce_res=u.l[0:rows, :] if last_blk else None,
                reduce_cmd=nisa.reduce_cmd.reset_reduce if j == 0 else nisa.reduce_cmd.reduce)
            u.t_exp = bal.add("s", w, ready=u.t_max if j == 0 else 0.0)
        for f in finals:
            _finalize(ctx, f)
        finals = pv(copied)
        if p < len(flat):
            pairs = []
            for j0 in range(0, len(blk), 2):
                pair = blk[j0:j0 + 2]
                pt_ps = nl.ndarray((_KC, 2, _QT), dtype=dt, buffer=nl.psum)
                for j, (c, ck0, wc, _, _) in enumerate(pair):
                    a = u.off + ck0 - blk[0][1]
                    pt_ps[0:wc, j, 0:rows] = nisa.nc_transpose(u.p_sb[0:rows, a:a + wc])
                pairs.append((u, pair, pt_ps, u.t_exp))
            u.off += w
        else:
            pairs = []
        copied = copies(transposed)
        transposed = pairs
        if p < len(flat):
            yield
    for f in finals:
        _finalize(ctx, f)


def _finalize(ctx, u):
    """After a tile's last PV of a section: fold O and l into the running ones (later sections), or
    -- after its last section -- O / l and lse = max + log(l) (of the scaled scores), stored."""
    D, bal, rows = ctx.D, ctx.bal, u.rows
    key = u.key
    st = ctx.state.get(key)
    acc, l = u.o_ps, u.l
    if st is not None:  # rescale the running O and l to the new max and add this step's part
        # exp(m_old - m_new), from the negated maxima
        corr = nisa.activation(op=nl.exp, data=st["nm"][0:rows, :], bias=u.nm[0:rows, :], scale=-1.0)
        acc = nisa.scalar_tensor_tensor(data=st["acc"][0:rows, :], op0=nl.multiply, operand0=corr, op1=nl.add,
                                        operand1=u.o_ps[0:rows, :])
        u.l[0:rows, :] = nisa.scalar_tensor_tensor(data=st["l"][0:rows, :], op0=nl.multiply, operand0=corr,
                                                   op1=nl.add, operand1=u.l[0:rows, :])
        bal.add("s", 64)
        bal.add("v", D + 64)
    if not u.last:
        if st is None:
            acc = nisa.activation(op=nl.copy, data=u.o_ps[0:rows, :])
            bal.add("s", D)
        ctx.state[key] = {"nm": u.nm, "acc": acc, "l": l}
        return
    ctx.state[key] = {"done": True}
    if bal.pick(D, D + 64) == "s":
        recip = nisa.reciprocal(l[0:rows, :])
        o_sb = nisa.activation(op=nl.copy, data=acc[0:rows, :], scale=recip, dtype=ctx.dt)
    else:
        o_sb = nisa.tensor_scalar(acc[0:rows, :], nl.divide, l[0:rows, :], dtype=ctx.dt)
    ef = ctx.empty_from
    if u.r0 + rows > ef:  # rows past the keys' end under a window: 0 (and lse 0 below)
        iq, jd = nl.mgrid[0:rows, 0:D]
        o_sb = nisa.affine_select((ef - 1) - (u.r0 + iq) >= 0, o_sb, 0.0)
    nl.store(ctx.out[u.b, u.h, u.r0:u.r0 + rows, :], value=o_sb)
    if ctx.lse_pending and ctx.lse_pending[0].sec is not u.sec:
        _flush_lse(ctx)
    ctx.lse_pending.append(u)
    if len(ctx.lse_pending) >= _LSE_BATCH:
        _flush_lse(ctx)


def _flush_lse(ctx):
    """lse = max + log(l) of the finished tiles, a batch at a time (two instructions for up to
    _LSE_BATCH tiles: their l and -max are columns of one tile each)."""
    us, ctx.lse_pending = ctx.lse_pending, []
    if not us:
        return
    i0, i1 = min(u.idx for u in us), max(u.idx for u in us) + 1
    sec = us[0].sec
    logl = nisa.activation(op=nl.log, data=sec.L[:, i0:i1])
    lse_b = nisa.tensor_tensor(logl, sec.NM[:, i0:i1], nl.subtract)
    ctx.bal.add("s", i1 - i0)
    ctx.bal.add("v", 2 * (i1 - i0))
    ef = ctx.empty_from
    for u in us:
        lse_t = lse_b[0:u.rows, u.idx - i0:u.idx - i0 + 1]
        if u.r0 + u.rows > ef:
            iq1, j1 = nl.mgrid[0:u.rows, 0:1]
            lse_t = nisa.affine_select((ef - 1) - (u.r0 + iq1) >= 0, lse_t, 0.0)
        nl.store(ctx.lse[u.b, u.h, u.r0:u.r0 + u.rows, :], value=lse_t)


@jit
def _naive_fwd_kernel(qT, kT, v, scale, causal):
    """The straightforward version, for comparison: per 128-query tile the whole score row block
    [128, Skv] in SBUF (fp32 matmuls), softmax over it (max, exp, sum, divide), then P @ V through
    fp32 transposes. K^T and V are reloaded for every tile; nothing is skipped or pipelined.
    Grid [B, Hq]; fp32 inputs [B, H, D, S] (q, k) and [B, Hkv, Skv, D] (v)."""
    b, h = nl.program_id(0), nl.program_id(1)
    _, Hq, D, Sq = qT.shape
    Hkv, Skv = kT.shape[1], kT.shape[3]
    kh = h // (Hq // Hkv)
    out = nl.ndarray((qT.shape[0], Hq, Sq, D), dtype=nl.float32, buffer=nl.shared_hbm)
    for t in nl.sequential_range(math.ceil(Sq / _QT)):
        r0 = t * _QT
        rows = min(_QT, Sq - r0)
        q = nl.load(qT[b, h, :, r0:r0 + rows])
        s = nl.ndarray((_QT, Skv), dtype=nl.float32, buffer=nl.sbuf)
        for k0 in range(0, Skv, _KB):
            w = min(_KB, Skv - k0)
            kt = nl.load(kT[b, kh, :, k0:k0 + w])
            s[0:rows, k0:k0 + w] = nl.multiply(nisa.nc_matmul(q, kt), scale)
            if causal and k0 + w - 1 > r0:
                iq, ik = nl.mgrid[0:rows, 0:w]
                s[0:rows, k0:k0 + w] = nisa.affine_select((r0 + iq) - (k0 + ik) >= 0, s[0:rows, k0:k0 + w], _NEG)
        m = nl.max(s[0:rows, :], axis=1, keepdims=True)
        e = nl.exp(nl.subtract(s[0:rows, :], m))
        p = nl.divide(e, nl.sum(e, axis=1, keepdims=True))
        o = nl.zeros((_QT, D), nl.float32, buffer=nl.psum)
        for k0 in range(0, Skv, _KC):
            wc = min(_KC, Skv - k0)
            pt = nl.copy(nisa.nc_transpose(p[0:rows, k0:k0 + wc]))
            vt = nl.load(v[b, kh, k0:k0 + wc, :])
            o[0:rows, :] += nisa.nc_matmul(pt, vt)
        nl.store(out[b, h, r0:r0 + rows, :], value=nl.copy(o[0:rows, :]))
    return out


# -- launch functions ----------------------------------------------------------------------------

_DTYPES = (torch.float32, torch.bfloat16)


def check_attention_inputs(q, k, v, scale, window, name):
    """Validates shapes/dtypes before launching; returns (B, Hq, Hkv, Sq, Skv, D, scale)."""
    for n, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: {n} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name}: {n} must be 4-D [batch, heads, seq, head_dim], got shape {tuple(x.shape)}")
        if x.dtype not in _DTYPES:
            raise TypeError(f"{name}: {n} has dtype {x.dtype}; supported are torch.float32 and torch.bfloat16 "
                            f"(cast the inputs with .to(torch.bfloat16) or .float())")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{name}: q, k and v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"{name}: q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")
    B, Hq, Sq, D = q.shape
    if k.shape != v.shape:
        raise ValueError(f"{name}: k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    Bk, Hkv, Skv, Dk = k.shape
    if Bk != B:
        raise ValueError(f"{name}: batch sizes differ: q has {B}, k/v have {Bk}")
    if Dk != D:
        raise ValueError(f"{name}: head_dim differs: q has {D}, k/v have {Dk}")
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"{name}: the {Hkv} key/value heads must divide the {Hq} query heads (GQA/MQA)")
    if not 1 <= D <= 128:
        raise ValueError(f"{name}: head_dim {D} is not supported; it must be 1..128 (split larger heads "
                         f"or use torch.nn.functional.scaled_dot_product_attention)")
    if min(B, Hq, Sq, Skv) < 1:
        raise ValueError(f"{name}: empty input: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"{name}: window must be a positive int (keys i - window < j), got {window!r}")
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"{name}: scale must be a finite float, got {scale!r}")
    return B, Hq, Hkv, Sq, Skv, D, float(scale)


def _positive_scale(q, scale):
    """The kernels take scale > 0 (masked scores are filled before scaling): scale * (q.k) equals
    (-scale) * ((-q).k), and a scale below 1e-30 is a uniform softmax, as q = 0 with scale 1."""
    if abs(scale) < 1e-30:
        return torch.zeros_like(q), 1.0
    if scale < 0:
        return -q, -scale
    return q, scale


def by_tile(x):
    """[B, H, S, D] -> [B, H, 128, ceil(S/128), D], row t*128 + p at [:, :, p, t] (zero rows pad S):
    the layout in which a kernel's load of several 128-row tiles reads long runs per partition."""
    B, H, S, D = x.shape
    n = -(-S // _QT)
    x = torch.nn.functional.pad(x, (0, 0, 0, n * _QT - S))
    return x.reshape(B, H, n, _QT, D).transpose(2, 3).contiguous()


def from_tiles(x, S):
    """The inverse of :func:`by_tile`."""
    B, H, _, n, D = x.shape
    return x.transpose(2, 3).reshape(B, H, n * _QT, D)[:, :, :S]


def flash_attention_forward(q, k, v, *, causal=False, scale=None, window=None):
    """FlashAttention forward: ``softmax(scale * q @ k^T + mask) @ v`` -> ``(out, lse)``.

    q ``[B, Hq, Sq, D]``, k/v ``[B, Hkv, Skv, D]`` (``Hkv`` divides ``Hq``; query head ``h`` uses
    kv head ``h // (Hq // Hkv)``), ``D <= 128``, all float32 or all bfloat16. ``scale`` defaults to
    ``1/sqrt(D)``. ``causal``: query ``i`` sees keys ``j <= i`` (top-left aligned, as SDPA's
    ``is_causal``). ``window=W``: query ``i`` sees only keys ``j > i - W`` (with ``causal``: the ``W``
    keys ``i-W+1..i``). Returns ``out`` (q's dtype and shape) and ``lse`` (float32 ``[B, Hq, Sq]``,
    natural-log log-sum-exp of the scaled masked scores per query, as torch's CPU flash kernel).
    Rows that see no key get ``out = 0`` and ``lse = 0``. Pure: the inputs are not modified.
    """
    _, _, _, _, _, _, scale = check_attention_inputs(q, k, v, scale, window, "flash_attention_forward")
    q, scale = _positive_scale(q, scale)
    qT = q.transpose(-1, -2).contiguous()
    kT = k.transpose(-1, -2).contiguous()
    out, lse = _flash_fwd_kernel(qT, kT, by_tile(v), scale, bool(causal), window)
    return out, lse.reshape(lse.shape[:3])


def naive_attention_forward(q, k, v, *, causal=False, scale=None):
    """The naive attention kernel (for comparison with :func:`flash_attention_forward`): the whole
    score row block of each 128-query tile in SBUF, a plain softmax over it, fp32 matmuls, no
    online rescaling, no block skipping. Same shapes and causal convention as the flash kernel
    (no window); returns ``out`` in q's dtype. Needs ``Skv <= 8192`` (the rows live in SBUF)."""
    B, Hq, _, _, Skv, _, scale = check_attention_inputs(q, k, v, scale, None, "naive_attention_forward")
    if Skv > 8192:
        raise ValueError(f"naive_attention_forward keeps whole score rows in SBUF and supports Skv <= 8192, "
                         f"got {Skv}; use flash_attention_forward")
    q, scale = _positive_scale(q, scale)
    qT = q.float().transpose(-1, -2).contiguous()
    kT = k.float().transpose(-1, -2).contiguous()
    out = _naive_fwd_kernel[B, Hq](qT, kT, v.float().contiguous(), scale, bool(causal))
    return out.to(q.dtype)


from .attention_bwd import flash_attention_backward  # noqa: E402,F401 - the backward, next to the forward
