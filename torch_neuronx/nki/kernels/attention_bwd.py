"""FlashAttention-2 backward in ``torch_neuronx.nki`` (the forward and the conventions - shapes,
GQA, causal/window masks, lse - are in :mod:`.attention`).

Per key/value head, 512-key blocks outer, 128-query tiles (of all query heads of the group) inner:

* P is recomputed from the scores and the forward's lse, already scaled: ``P' = scale * P =
  exp(scale * s + ln(scale) - lse)`` (one Scalar Engine instruction, bias per query row);
  ``dV = P^T dO`` then takes a ``1/scale`` when it leaves PSUM, and ``dS' = P' * (dP - D)`` is
  ``scale * dS``, so ``dK = dS'^T Q`` and ``dQ = dS' K`` need no further scaling.
  ``D = rowsum(dO * O)`` once per query tile.
* The Tensor Engine does S = Q K^T and dP = dO V^T (query rows on partitions, so the lse and D
  are per-partition operands), dV += P'^T dO and dK += dS'^T Q straight from P' and dS' (query
  rows are their contraction dim), and dQ = dS' K through 128x128 transposes of dS'.
* dK and dV accumulate in PSUM over all query tiles (and heads) of a key block; dQ accumulates in
  SBUF (fp32) over the key blocks. Fully masked pairs are skipped at trace time, partly masked
  128-key chunks of P' are zeroed with ``affine_select``.
* One modulo-scheduled stream of (tile, block) pairs: step i issues the Vector Engine's dS' of
  pair i, the copies of pair i-1's dS'^T and pair i-3's dQ accumulation (the readers of PSUM tiles
  before new ones are made: a PSUM tile takes a bank, 8 at most), then the next pair's QK^T and
  dO V^T matmuls and exp, pair i's dV/dK matmuls and transposes, and pair i-2's dQ matmuls: the
  Tensor Engine (the busiest: five matmuls and four transposes per pair) rarely waits. Loads are
  issued a few pairs ahead of use; the operands arrive laid out by torch (transposed, or by
  128-row tile) so each load reads long contiguous runs.

Modeled (Trainium2) at B=1, H=1, S=2048, D=128, bf16: 70.9% of the Tensor Engine's peak, 60.4%
causal; at S=4096: 79.3% and 74.8%.
"""
from __future__ import annotations

import math

import torch

from .. import isa as nisa
from .. import jit
from .. import language as nl
from .attention import _Balance, _positive_scale, by_tile, check_attention_inputs, from_tiles, visible_chunks

_QT = 128
_KB = 512
_KC = 128
_QGROUP_BYTES = 96 * 1024  # SBUF per partition for the cached query side of a group of tiles
_QG = 8                    # query tiles per load of the query side
_AHEAD = 6                 # pairs: loads are issued this far ahead of the first pair needing them


@jit
def _flash_bwd_kernel(qT, q, doT, do, o, lse, kT, k, vT, scale, causal, window):
    """qT/doT [B, Hq, D, Sq], kT/vT [B, Hkv, D, Skv]; row-major operands by 128-row tile, row
    t*128 + p at [.., p, t, :] (tile loads then read long runs per partition): q/do/o
    [B, Hq, 128, tiles, D], k [B, Hkv, 128, chunks, D], lse [B, Hq, 128, tiles] ->
    dq [B, Hq, Sq, D], dk, dv [B, Hkv, 128, chunks, D] (float32)."""
    B, Hq, D, Sq = qT.shape
    Hkv, Skv = kT.shape[1], kT.shape[3]
    G = Hq // Hkv
    dt = qT.dtype
    dq = nl.ndarray((B, Hq, Sq, D), dtype=nl.float32, buffer=nl.shared_hbm)
    dk = nl.ndarray(k.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    dv = nl.ndarray(k.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nq, nkb = math.ceil(Sq / _QT), math.ceil(Skv / _KB)
    isz = 2 if dt == nl.bfloat16 else 4
    per_tile = 2 * _QT * isz + 2 * D * isz + 4 * D + 64  # Q^T, dO^T, Q, dO, dQ per partition
    tiles_per_group = max(1, min(G * nq, _QGROUP_BYTES // max(1, per_tile)))
    c = dict(qT=qT, q=q, doT=doT, do=do, o=o, lse=lse, kT=kT, k=k, vT=vT, dq=dq, dk=dk, dv=dv, D=D, Sq=Sq,
             Skv=Skv, dt=dt, scale=scale, causal=causal, window=window, bal=_Balance(), written=set())
    ctx = type("Ctx", (), {})()
    ctx.__dict__.update(c)
    for b in range(B):
        for kh in range(Hkv):
            tiles = [(kh * G + g, t) for g in range(G) for t in range(nq)]
            for g0 in range(0, len(tiles), tiles_per_group):
                group = tiles[g0:g0 + tiles_per_group]
                pairs = []
                for kb in range(nkb):
                    k0 = kb * _KB
                    for h, t in group:
                        r0, rows = t * _QT, min(_QT, Sq - t * _QT)
                        vis = visible_chunks(r0, rows, k0, k0 + _KB, Skv, causal, window)
                        if vis:
                            pairs.append(_Pair(b, kh, h, t, r0, rows, kb, vis[0]))
                _run_group(ctx, b, kh, group, pairs, nkb)
    # key blocks no query sees: zero gradients
    for b in range(B):
        for kh in range(Hkv):
            for kb in range(nkb):
                if (b, kh, kb) not in ctx.written:
                    k0, w = kb * _KB, min(_KB, Skv - kb * _KB)
                    z = nl.zeros((_KC, math.ceil(w / _KC), D), dtype=nl.float32)
                    for x in (dk, dv):
                        _store_block(x, b, kh, k0, w, z)
    return dq, dk, dv


class _Pair:
    """One query tile against the visible 128-key chunks of one 512-key block."""

    def __init__(self, b, kh, h, t, r0, rows, kb, chunks):
        self.b, self.kh, self.h, self.t, self.r0, self.rows, self.kb = b, kh, h, t, r0, rows, kb
        self.chunks = chunks  # [(chunk, first key, width, mask causal, mask window)]
        self.k0 = chunks[0][1]
        self.w = sum(ch[2] for ch in chunks)


def _store_block(x, b, kh, k0, w, sb):
    """Stores the [128, chunks, D] gradients of keys k0..k0+w (chunk c holds keys k0 + 128c + p)."""
    c0, n = k0 // _KC, math.ceil(w / _KC)
    nl.store(x[b, kh, :, c0:c0 + n, :], value=sb[:, 0:n, :])


def _run_group(ctx, b, kh, group, pairs, nkb):
    """The pairs of one group of query tiles, with their query side (Q^T, Q, dO^T, dO, O, lse)
    cached in SBUF and dQ accumulated in SBUF (stored after the tile's last pair)."""
    D, Sq = ctx.D, ctx.Sq
    ctx.qs, ctx.qgroups = {}, {}
    for h, t in group:
        ctx.qs[(h, t)] = {"rows": min(_QT, Sq - t * _QT), "dq": None, "h": h, "t": t, "ready": False,
                          "left": sum(1 for p in pairs if (p.h, p.t) == (h, t))}
    if pairs:
        _stream(ctx, b, kh, pairs)
    for (h, t), x in ctx.qs.items():  # tiles that see no key: dQ = 0
        if x["left"] == 0 and x["dq"] is None:
            nl.store(ctx.dq[b, h, t * _QT:t * _QT + x["rows"], :], value=nl.zeros((x["rows"], D), dtype=nl.float32))


def _load_qgroup(ctx, b, h, g):
    """The query side of tiles [8g, 8g + 8) of head h, one DMA per tensor."""
    D, dt, Sq = ctx.D, ctx.dt, ctx.Sq
    t0, t1 = g * _QG, min(math.ceil(Sq / _QT), (g + 1) * _QG)
    r0, r1 = t0 * _QT, min(Sq, t1 * _QT)
    n = t1 - t0
    x = {}
    for name in ("qT", "doT"):
        x[name] = nl.ndarray((D, _QG * _QT), dtype=dt, buffer=nl.sbuf)
        x[name][:, 0:r1 - r0] = nl.load(getattr(ctx, name)[b, h, :, r0:r1])
    for name, src in (("q", ctx.q), ("do", ctx.do), ("o", ctx.o)):
        x[name] = nl.ndarray((_QT, _QG, D), dtype=src.dtype, buffer=nl.sbuf)
        x[name][:, 0:n, :] = nl.load(src[b, h, :, t0:t1, :])
    x["lse"] = nl.ndarray((_QT, _QG), dtype=nl.float32, buffer=nl.sbuf)
    x["lse"][:, 0:n] = nl.load(ctx.lse[b, h, :, t0:t1])
    ctx.qgroups[(h, g)] = x


def _load_kblock(ctx, b, kh, kb):
    """K^T, V^T [D, w] and K [128, chunks, D] of key block kb."""
    D, dt = ctx.D, ctx.dt
    k0 = kb * _KB
    w = min(_KB, ctx.Skv - k0)
    blk = {"w": w, "k0": k0}
    blk["kT"] = nl.ndarray((D, _KB), dtype=dt, buffer=nl.sbuf)
    blk["kT"][:, 0:w] = nl.load(ctx.kT[b, kh, :, k0:k0 + w])
    blk["vT"] = nl.ndarray((D, _KB), dtype=dt, buffer=nl.sbuf)
    blk["vT"][:, 0:w] = nl.load(ctx.vT[b, kh, :, k0:k0 + w])
    blk["k"] = nl.ndarray((_KC, _KB // _KC, D), dtype=dt, buffer=nl.sbuf)
    n = math.ceil(w / _KC)
    blk["k"][:, 0:n, :] = nl.load(ctx.k[b, kh, :, k0 // _KC:k0 // _KC + n, :])
    return blk


def _stream(ctx, b, kh, pairs):
    """The modulo schedule over the pairs (see the module docstring)."""
    D, dt, bal, scale = ctx.D, ctx.dt, ctx.bal, ctx.scale
    packed = dt == nl.bfloat16
    blocks = {}

    # DMAs take their turn on the link in program order: each load (a key block, the query side of
    # _QG tiles) is issued _AHEAD pairs before the first pair that reads it
    loads, seen = [], set()
    for i, p in enumerate(pairs):
        for key in (("k", p.kb), ("q", p.h, p.t // _QG)):
            if key not in seen:
                seen.add(key)
                loads.append((i, key))

    def issue(upto):
        while loads and loads[0][0] <= upto:
            key = loads.pop(0)[1]
            if key[0] == "k":
                blocks[key[1]] = _load_kblock(ctx, b, kh, key[1])
                blocks[key[1]]["left"] = sum(1 for p in pairs if p.kb == key[1])
            else:
                _load_qgroup(ctx, b, key[1], key[2])

    def block(kb):
        return blocks[kb]

    def tile(p):  # the query side of the pair's tile; its D and exp bias the first time
        x = ctx.qs[(p.h, p.t)]
        if not x["ready"]:
            g, j, rows = ctx.qgroups[(p.h, p.t // _QG)], p.t % _QG, p.rows
            x["qT"], x["doT"] = g["qT"][:, j * _QT:(j + 1) * _QT], g["doT"][:, j * _QT:(j + 1) * _QT]
            x["q"], x["do"] = g["q"][:, j, :], g["do"][:, j, :]
            # D = rowsum(dO * O) and the exp's bias ln(scale) - lse, per query row
            x["Di"] = nl.sum(nl.multiply(g["do"][0:rows, j, :], g["o"][0:rows, j, :], dtype=nl.float32), axis=1,
                             keepdims=True)
            x["bias"] = nisa.tensor_scalar(g["lse"][0:rows, j:j + 1], nl.multiply, -1.0, op1=nl.add,
                                           operand1=math.log(scale))
            bal.add("v", 3 * D + 64)
            x["ready"] = True
        return x

    def stage_a(p):  # scores and dO V^T of the pair's visible keys; P' on the Scalar Engine
        blk, x, rows = block(p.kb), tile(p), p.rows
        lo = p.k0 - blk["k0"]
        s_ps = nisa.nc_matmul(x["qT"][:, 0:rows], blk["kT"][:, lo:lo + p.w])
        p.dp_ps = nisa.nc_matmul(x["doT"][:, 0:rows], blk["vT"][:, lo:lo + p.w])
        p.p_sb = nl.ndarray((_QT, _KB), dtype=dt, buffer=nl.sbuf)
        p.p_sb[0:rows, 0:p.w] = nisa.activation(op=nl.exp, data=s_ps, bias=x["bias"][0:rows, :], scale=scale,
                                                dtype=dt)
        p.t_exp = bal.add("s", p.w)
        for c, ck0, wc, mc, mw in p.chunks:  # zero P' where the key is masked
            if mc or mw:
                a = ck0 - p.k0
                dst = p.p_sb[0:rows, a:a + wc]
                iq, ik = nl.mgrid[0:rows, 0:wc]
                if mc:
                    dst[...] = nisa.affine_select((p.r0 + iq) - (ck0 + ik) >= 0, dst, 0.0)
                if mw:
                    dst[...] = nisa.affine_select((ck0 + ik) - (p.r0 + iq) + (ctx.window - 1) >= 0, dst, 0.0)
                bal.add("v", wc * (int(mc) + int(mw)))

    def stage_ds(p):  # dS' = P' * (dP - D) on the Vector Engine
        x, rows = ctx.qs[(p.h, p.t)], p.rows
        p.ds_sb = nl.ndarray((_QT, _KB), dtype=dt, buffer=nl.sbuf)
        p.ds_sb[0:rows, 0:p.w] = nisa.scalar_tensor_tensor(
            data=p.dp_ps, op0=nl.subtract, operand0=x["Di"][0:rows, :], op1=nl.multiply,
            operand1=p.p_sb[0:rows, 0:p.w], dtype=dt)
        p.t_ds = bal.add("v", p.w, ready=p.t_exp)

    def stage_b(p):  # dV += P'^T dO, dK += dS'^T Q, dS'^T through the Tensor Engine
        blk, x, rows = block(p.kb), ctx.qs[(p.h, p.t)], p.rows
        if "dK" not in blk:  # the block's accumulators (a PSUM bank each), from its first pair on
            blk["dK"] = nl.zeros((_KC, _KB // _KC, D), nl.float32, buffer=nl.psum)
            blk["dV"] = nl.zeros((_KC, _KB // _KC, D), nl.float32, buffer=nl.psum)
        for c, ck0, wc, _, _ in p.chunks:
            a, cb = ck0 - p.k0, (ck0 - blk["k0"]) // _KC
            blk["dV"][0:wc, cb, :] += nisa.nc_matmul(p.p_sb[0:rows, a:a + wc], x["do"][0:rows, :])
            blk["dK"][0:wc, cb, :] += nisa.nc_matmul(p.ds_sb[0:rows, a:a + wc], x["q"][0:rows, :])
        p.pt_ps = nl.ndarray((_KC, _KB // _KC, _QT), dtype=dt, buffer=nl.psum)  # all chunks: one bank
        for j, (c, ck0, wc, _, _) in enumerate(p.chunks):
            a = ck0 - p.k0
            p.pt_ps[0:wc, j, 0:rows] = nisa.nc_transpose(p.ds_sb[0:rows, a:a + wc])
        blk["left"] -= 1

    def stage_copy(p):  # dS'^T to SBUF: a pair of chunks as int32 words (Vector) or each (Scalar)
        rows = p.rows
        p.pt_sb = nl.ndarray((_KC, _KB // _KC, _QT), dtype=dt, buffer=nl.sbuf)
        for j0 in range(0, len(p.chunks), 2):
            pair = p.chunks[j0:j0 + 2]
            can_pack = packed and rows == _QT and len(pair) == 2
            if can_pack and bal.pick(_QT, 2 * _QT, p.t_ds) == "v":
                p.pt_sb.view(nl.int32)[:, j0:j0 + 2, :] = nisa.tensor_copy(p.pt_ps.view(nl.int32)[:, j0:j0 + 2, :])
            else:
                for j, (c, ck0, wc, _, _) in enumerate(pair, j0):
                    if can_pack or bal.pick(rows, rows, p.t_ds) == "s":
                        p.pt_sb[0:wc, j, 0:rows] = nisa.activation(op=nl.copy, data=p.pt_ps[0:wc, j, 0:rows])
                    else:
                        p.pt_sb[0:wc, j, 0:rows] = nisa.tensor_copy(p.pt_ps[0:wc, j, 0:rows])

    def stage_dq(p):  # dQ of the pair = dS' K over its chunks
        blk, rows = block(p.kb), p.rows
        p.dq_ps = nl.zeros((_QT, D), nl.float32, buffer=nl.psum)
        for j, (c, ck0, wc, _, _) in enumerate(p.chunks):
            cb = (ck0 - blk["k0"]) // _KC
            p.dq_ps[0:rows, :] += nisa.nc_matmul(p.pt_sb[0:wc, j, 0:rows], blk["k"][0:wc, cb, :])

    def stage_acc(p):  # dQ (SBUF, fp32) += the pair's part
        x, rows = ctx.qs[(p.h, p.t)], p.rows
        if x["dq"] is None:
            x["dq"] = nl.ndarray((_QT, D), dtype=nl.float32, buffer=nl.sbuf)
            x["dq"][0:rows, :] = nisa.activation(op=nl.copy, data=p.dq_ps[0:rows, :])
            bal.add("s", D)
        else:
            x["dq"][0:rows, :] = nisa.scalar_tensor_tensor(data=p.dq_ps[0:rows, :], op0=nl.multiply, operand0=1.0,
                                                           op1=nl.add, operand1=x["dq"][0:rows, :])
            bal.add("v", D)
        x["left"] -= 1
        if x["left"] == 0:  # the tile's last pair: its dQ is complete
            nl.store(ctx.dq[b, p.h, p.r0:p.r0 + rows, :], value=x["dq"][0:rows, :])

    def finish_blocks():  # dK, dV of key blocks all of whose pairs are done: out of PSUM
        for kb in list(blocks):
            blk = blocks[kb]
            if blk["left"] == 0 and not blk.get("done"):
                nch = math.ceil(blk["w"] / _KC)
                dk_sb = nisa.activation(op=nl.copy, data=blk["dK"][:, 0:nch, :], dtype=nl.float32)
                dv_sb = nisa.tensor_scalar(blk["dV"][:, 0:nch, :], nl.multiply, 1.0 / scale, dtype=nl.float32)
                bal.add("s", nch * D)
                bal.add("v", nch * D)
                first = (b, kh, kb) not in ctx.written
                ctx.written.add((b, kh, kb))
                for x, sb in ((ctx.dk, dk_sb), (ctx.dv, dv_sb)):
                    if first:
                        _store_block(x, b, kh, blk["k0"], blk["w"], sb)
                    else:  # a later group of query tiles: accumulate in HBM
                        c0 = blk["k0"] // _KC
                        nisa.dma_copy(dst=x[b, kh, :, c0:c0 + nch, :], src=sb[:, 0:nch, :], dst_rmw_op=nl.add)
                blk["done"] = True

    # Within a step the consumers of PSUM tiles come before the producers of new ones (a PSUM
    # tile takes a bank: at most 8 live), and a key block's dK/dV leave PSUM before the next
    # block's first accumulation.
    n = len(pairs)
    issue(_AHEAD)
    stage_a(pairs[0])
    for i in range(n + 3):
        issue(i + 1 + _AHEAD)
        if i < n:
            stage_ds(pairs[i])
        if 0 <= i - 1 < n:
            stage_copy(pairs[i - 1])
        if 0 <= i - 3 < n:
            stage_acc(pairs[i - 3])
        finish_blocks()
        if i + 1 < n:
            stage_a(pairs[i + 1])
        if i < n:
            stage_b(pairs[i])
        if 0 <= i - 2 < n:
            stage_dq(pairs[i - 2])
    finish_blocks()


def flash_attention_backward(grad_out, q, k, v, out, lse, *, causal=False, scale=None, window=None):
    """FlashAttention-2 backward of :func:`.attention.flash_attention_forward` -> ``(dq, dk, dv)``.

    ``grad_out``/``out`` ``[B, Hq, Sq, D]`` and ``lse`` (float32 ``[B, Hq, Sq]``) as the forward
    returned them; ``q, k, v, causal, scale, window`` as given to the forward. P is recomputed from
    q, k and lse; ``D = rowsum(grad_out * out)``, ``dV = P^T dO``, ``dS = P * (dO V^T - D)``,
    ``dQ = scale * dS K``, ``dK = scale * dS^T Q``; for GQA/MQA dk and dv are summed over the query
    heads sharing a kv head. Results have the inputs' dtypes (accumulated in float32). Pure."""
    B, Hq, Hkv, Sq, Skv, D, scale = check_attention_inputs(q, k, v, scale, window, "flash_attention_backward")
    for n, x in (("grad_out", grad_out), ("out", out)):
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != tuple(q.shape) or x.dtype != q.dtype:
            raise ValueError(f"flash_attention_backward: {n} must be a {q.dtype} tensor of q's shape "
                             f"{tuple(q.shape)}, got {getattr(x, 'dtype', type(x).__name__)} "
                             f"{tuple(getattr(x, 'shape', ()))}")
    if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (B, Hq, Sq) or lse.dtype != torch.float32:
        raise ValueError(f"flash_attention_backward: lse must be float32 [B, Hq, Sq] = {(B, Hq, Sq)} (the "
                         f"forward's), got {getattr(lse, 'dtype', type(lse).__name__)} "
                         f"{tuple(getattr(lse, 'shape', ()))}")
    if not (grad_out.device == q.device == out.device == lse.device):
        raise ValueError("flash_attention_backward: all tensors must be on one device")
    args, kscale = backward_kernel_args(grad_out, q, k, v, out, lse, scale, causal, window)
    dq, dk, dv = _flash_bwd_kernel(*args)
    dk, dv = from_tiles(dk, Skv), from_tiles(dv, Skv)
    if kscale != scale:  # -q for a negative scale, q = 0 for a vanishing one (see _positive_scale)
        dq = dq * (scale / kscale)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def backward_kernel_args(grad_out, q, k, v, out, lse, scale, causal, window):
    """The backward kernel's arguments (the layouts it reads, laid out with torch) and its scale."""
    B, Hq, Sq, _ = q.shape
    q, kscale = _positive_scale(q, scale)
    t = lambda x: x.transpose(-1, -2).contiguous()  # noqa: E731
    do = grad_out.contiguous()
    nq = -(-Sq // _QT)  # lse as [B, Hq, 128, tiles]: the kernel loads a tile's rows down the partitions
    lse_t = torch.nn.functional.pad(lse, (0, nq * _QT - Sq)).reshape(B, Hq, nq, _QT).transpose(-1, -2).contiguous()
    return (t(q), by_tile(q), t(do), by_tile(do), by_tile(out), lse_t, t(k), by_tile(k), t(v), kscale,
            bool(causal), window), kscale



