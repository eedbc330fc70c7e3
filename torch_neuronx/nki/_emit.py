"""Issuing instructions to the core from a kernel being traced: the current
trace, new tiles, dtype promotion, masks and bounds checks."""
from __future__ import annotations

import math
import os
import sys
import threading

import numpy as np
import torch

from . import _loops
from ._index import Mask
from ._tensor import (HBM, PSUM, PSUM_BUFFER, SBUF, SBUF_BUFFER, NkiTensor, View, as_view, is_tile, itemsize,
                      packed_name, par_dim)

_local = threading.local()
_PKG_DIR = os.path.dirname(__file__)


def current():
    """The kernel instance being traced on this thread."""
    t = getattr(_local, "trace", None)
    if t is None:
        raise RuntimeError("NKI language functions can only be called inside a kernel launched through "
                           "nki.jit / nki.baremetal / nki.simulate_kernel")
    return t


def set_current(trace):
    prev = getattr(_local, "trace", None)
    _local.trace = trace
    return prev


def kernel_line():
    """file:line of the innermost kernel frame (outside this package)."""
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(_PKG_DIR + os.sep):
        f = f.f_back
    return f"{f.f_code.co_filename}:{f.f_lineno}" if f is not None else "?"


def _call_sites():
    """(file, line) of the kernel frames calling into this package, innermost first."""
    f, out = sys._getframe(1), []
    while f is not None and len(out) < 16:
        if not f.f_code.co_filename.startswith(_PKG_DIR + os.sep):
            out.append((f.f_code.co_filename, f.f_lineno))
        f = f.f_back
    return tuple(out)


# -- dtypes ------------------------------------------------------------------
_LOW_PRECISION = (torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2)
_FLOAT_RANK = {torch.float8_e4m3fn: 0, torch.float8_e4m3fnuz: 0, torch.float8_e5m2: 0, torch.bfloat16: 1,
               torch.float16: 1, torch.float32: 2}


def promote(a, b):
    """NKI's promotion of two operand dtypes (Python scalars are weakly typed: int→int32, float→float32)."""
    if a == b:
        return a
    fa, fb = a.is_floating_point, b.is_floating_point
    if fa and not fb:
        return a
    if fb and not fa:
        return b
    if fa and fb:
        ra, rb = _FLOAT_RANK.get(a, 2), _FLOAT_RANK.get(b, 2)
        if ra == rb:
            return torch.bfloat16 if ra == 0 else torch.float32  # fp8 pair → bf16, fp16+bf16 → fp32
        return a if ra > rb else b
    if {a, b} == {torch.int32, torch.uint32}:
        return torch.float32
    return torch.promote_types(a, b)


def scalar_dtype(v):
    if isinstance(v, bool):
        return torch.uint8
    if isinstance(v, int):
        return torch.int32
    return torch.float32


def result_dtype(*operands):
    d = None
    for o in operands:
        od = o.tdtype if is_tile(o) else scalar_dtype(o)
        d = od if d is None else promote(d, od)
    return d


# -- tiles ---------------------------------------------------------------------
def _space_of(buffer):
    if buffer is None:
        return SBUF
    return getattr(buffer, "space", buffer)


def new_tensor(shape, dtype, buffer=None, name=""):
    """nl.ndarray: an SBUF/PSUM tile (NaN-filled) or an HBM tensor."""
    tr = current()
    packed = packed_name(dtype) or ""
    dtype = _dtype(dtype)
    space = _space_of(buffer)
    dims = list(shape) if isinstance(shape, (tuple, list)) else [shape]
    pa = next((i for i, s in enumerate(dims) if isinstance(s, par_dim)), 0)
    shape = tuple(int(s) for s in dims)
    if any(s < 0 for s in shape):
        raise ValueError(f"negative dimension in shape {shape}")
    name = name or tr.auto_name()
    if space == HBM:
        t = tr.hbm_tensor(shape, dtype, name, shared=getattr(buffer, "name", "") == "shared_hbm")
        t.memory_name, t._packed = getattr(buffer, "name", "hbm"), packed
        return t
    if len(shape) < 1:
        raise ValueError(f"an SBUF/PSUM tensor needs a partition dimension, got shape {shape}")
    declared = dtype
    if dtype in _LOW_PRECISION and os.environ.get("NKI_PRECISE_FP", "1") == "0":
        dtype = torch.float32  # NKI_PRECISE_FP=0: on-chip values kept in fp32 (precision apart from algorithm bugs)
    P = shape[pa]
    blocks, free = shape[:pa], shape[pa + 1:]
    nfree = math.prod(free)
    what = f"'{name}' {list(shape)} {_dname(dtype)} (at {kernel_line()})"
    manual = hasattr(buffer, "locations")
    try:
        if manual:
            site = (_call_sites(), space, tuple(shape), dtype) if tr.loops else None
            locs = tr.manual_sites.get(site) if site else None
            if locs is None:
                locs = buffer.locations(blocks, P, nfree * itemsize(dtype), tr.psum_bank_bytes)
                if site:
                    tr.manual_sites[site] = locs
            tile = tr.program.allocate_at(space, dtype, P, nfree, locs, what, tr.rank)
        else:
            tile = tr.program.allocate(space, dtype, P, math.prod(blocks), nfree, what, tr.rank)
    except ValueError as e:
        raise ValueError(str(e)) from None
    pstride = tr.partition_bytes(space) // itemsize(dtype)
    strides = [0] * len(shape)
    s = 1
    for i in range(len(shape) - 1, pa, -1):
        strides[i] = s
        s *= shape[i]
    strides[pa] = pstride
    if space == PSUM:  # each block in its own bank
        s = tr.psum_bank_bytes // itemsize(dtype)
    for i in range(pa - 1, -1, -1):
        strides[i] = s
        s *= shape[i]
    byte_offset, block_locs = 0, None
    if manual:
        byte_offset, block_strides, block_locs = _manual_layout(blocks, locs, tr.partition_bytes(space),
                                                                itemsize(dtype))
        strides[:pa] = block_strides
    t = NkiTensor(tr, SBUF_BUFFER if space == SBUF else PSUM_BUFFER, space, shape, dtype, strides, byte_offset, pa,
                  name, tile=tile)
    t.block_locs, t._packed = block_locs, packed
    t.serial, tr.serial = tr.serial, tr.serial + 1
    if declared != dtype:
        t.declared = declared
    return t


def _manual_layout(blocks, locs, partition_bytes, item):
    """A manually placed tensor's byte offset and block strides when its blocks are evenly spaced
    (then accesses across blocks are plain strided ones), else a table of each block's offset."""
    absolute = [p * partition_bytes + a for p, a in locs]
    base = absolute[0]
    steps, mul = [0] * len(blocks), 1
    for i in range(len(blocks) - 1, -1, -1):  # row-major position of the unit step of dim i
        if blocks[i] > 1:
            steps[i] = absolute[mul] - base
        mul *= blocks[i]
    affine = all(d % item == 0 for d in steps) and all(
        absolute[n] == base + sum(k * d for k, d in zip(idx, steps))
        for n, idx in enumerate(np.ndindex(*blocks)))
    if affine:
        return base, [d // item for d in steps], None
    return 0, [0] * len(blocks), dict(zip((tuple(i) for i in np.ndindex(*blocks)), absolute))


def new_tile(shape, dtype, space=SBUF, name=""):
    """The result tile of an instruction."""
    from ._tensor import MemorySpace
    t = new_tensor(tuple(shape), dtype, MemorySpace("psum" if space == PSUM else "sbuf", space), name)
    t._fresh = True
    return t


def _dtype(d):
    from ._tensor import to_dtype
    return to_dtype(d)


def _dname(d):
    return str(d).replace("torch.", "")


# -- issuing -------------------------------------------------------------------
def _check_bounds(view, mask_t):
    msg = view.bounds_error()
    if msg is None:
        return
    if mask_t is not None:
        # exact check over the positions the mask keeps
        t = view.tensor
        for k, n in enumerate(t.shape):
            idx = torch.full(view.sizes, view.consts[k], dtype=torch.int64)
            for d, s in enumerate(view.sizes):
                shp = [1] * len(view.sizes)
                shp[d] = s
                idx = idx + view.coeffs[k][d] * torch.arange(s).view(shp)
            kept = idx[mask_t]
            if kept.numel() and (kept.min() < 0 or kept.max() >= n):
                break
        else:
            return
    raise IndexError(msg)


def issue(kind, name, dst, srcs=(), fns=(), scalars=(), ints=(), mask=None, constant=None, same_shape=True,
          roles=None, oob_skip=False, accumulate=False):
    """Emits one instruction on views ``dst`` and ``srcs``.

    A mask is evaluated over the instruction's iteration space: dst's shape for
    elementwise instructions (``same_shape``), the first source's otherwise
    (a reduction iterates over its input). Every operand is narrowed to the box
    the mask keeps along the dims it shares with that space; what remains of a
    non-rectangular mask guards dst's writes elementwise."""
    tr = current()
    fresh = dst.tensor.__dict__.pop("_fresh", False)
    if isinstance(mask, (bool, np.bool_)):  # a mask of plain ints evaluated at trace time
        if not mask:
            if fresh:
                dst.tensor._mask = False  # nothing computed: assigning the result writes nothing
            return
        mask = None
    ops = [dst] + list(srcs)
    if fresh and mask is not None:
        # a new tile made under a mask: assigning it elsewhere copies only what was computed
        dst.tensor._mask = mask
    space_i = 0 if same_shape or not srcs else 1
    space = ops[space_i]
    mask_t = None
    if mask is not None:
        if not isinstance(mask, Mask):
            raise TypeError("mask= takes comparisons of nl.arange/nl.mgrid/loop indices, e.g. mask=(i_p < n)")
        mask_t = mask.evaluate(space.sizes)
        if not bool(mask_t.any()):
            return  # nothing is written
        box = []
        for d in range(mask_t.dim()):
            other = [i for i in range(mask_t.dim()) if i != d]
            keep = mask_t.any(dim=other) if other else mask_t
            nz = torch.nonzero(keep).flatten()
            box.append((int(nz[0]), int(nz[-1]) + 1))
        if any(b != (0, s) for b, s in zip(box, space.sizes)):
            for i, v in enumerate(ops):
                if len(v.sizes) != len(space.sizes):
                    continue
                for d, (a, b) in enumerate(box):
                    if v.sizes[d] == space.sizes[d] and (a, b) != (0, v.sizes[d]):
                        v = v.narrow(d, a, b - a)
                ops[i] = v
            mask_t = mask_t[tuple(slice(a, b) for a, b in box)]
        if bool(mask_t.all()):
            mask_t = None
        elif space_i != 0:
            raise ValueError(f"{name}: masks on this instruction must keep a rectangular region "
                             f"(comparisons of one index each)")
    roles = roles or ["dst"] + [f"src{i}" for i in range(len(srcs))]
    for v in ops:
        _check_bounds(v, mask_t)
    if ops[0].space == PSUM and kind != "print":
        mark_written(ops[0])
    if any(0 in v.sizes for v in ops):
        return
    dyn_srcs = []
    accesses = [v.access(r, dyn_srcs, oob_skip) for v, r in zip(ops, roles)]
    ints = list(ints)
    if kind == "copy" and accumulate:
        ints = [1]  # dst += src (an indirect copy below sets its own)
    for i, v in enumerate(ops):
        if v.indirect is None:
            continue
        if kind != "copy" or i > 1:
            raise ValueError(f"{name}: dynamic (indirect) indexing is supported on a DMA's HBM side only")
        k, idx = v.indirect
        accesses.append(idx.access(roles[i] + "_index"))
        ints = [i, len(accesses) - 1, v.tensor.strides[k], v.tensor.shape[k], int(oob_skip), int(accumulate)]
    tr.program.emit(kind, name, accesses, list(fns), [_fp32_scalar(s) for s in scalars], [int(i) for i in ints],
                    _shared_mask(tr, mask_t), constant, "", dyn_srcs)
    tr.count(name)
    if tr.lockstep is not None:
        tr.lockstep.step()
    if tr.loops and kind != "print":
        rmw = accumulate or (kind in ("matmul", "tensor_tensor") and ints and ints[0]) or any(
            a[:5] == accesses[0][:5] for a in accesses[1:])
        _loops.check_writes(tr, ops[0], mask_t, rmw)
    w = ops[0]
    if fresh and w.tensor is dst.tensor and w.indirect is None:
        # the instruction making a result tile, which assigning may redirect (retarget); no
        # reference to the tile here: retarget tells a result nothing holds by its refcount
        dst.tensor._producer = (tr.program.num_instructions, tuple(w.consts), tuple(w.sizes), tuple(w.coeffs))


_FLT_MAX = float(np.finfo(np.float32).max)


def _shared_mask(tr, mask_t):
    """The mask as a tensor shared by every instruction with the same one (a loop issues the
    same masks over and over; each would otherwise keep its own copy)."""
    if mask_t is None:
        return None
    mask_t = mask_t.contiguous()
    key = (tuple(mask_t.shape), hash(mask_t.numpy().tobytes()))
    same = tr.masks.get(key)
    if same is not None and torch.equal(same, mask_t):
        return same
    tr.masks[key] = mask_t
    return mask_t


def _fp32_scalar(s):
    """An immediate as the engines hold it: fp32 (``-3.4028235e38``, a hair past FLT_MAX as a
    double, is -FLT_MAX; larger magnitudes are infinite)."""
    s = float(s)
    if abs(s) > _FLT_MAX and math.isfinite(s):
        with np.errstate(over="ignore"):
            return float(np.float32(s))
    return s


def transpose_masked(src, dst, mask):
    """A transpose's operands narrowed to the box ``mask`` keeps of the source (the destination's
    box is its transpose); the mask must keep a rectangle."""
    if mask is None or isinstance(mask, (bool, np.bool_)):
        return src, dst, mask
    if not isinstance(mask, Mask):
        raise TypeError("mask= takes comparisons of nl.arange/nl.mgrid/loop indices, e.g. mask=(i_p < n)")
    m = mask.evaluate(src.sizes)
    if not bool(m.any()):
        return src, dst, False
    box = []
    for d in range(2):
        nz = torch.nonzero(m.any(dim=1 - d)).flatten()
        box.append((int(nz[0]), int(nz[-1]) + 1))
    if not bool(m[box[0][0]:box[0][1], box[1][0]:box[1][1]].all()):
        raise ValueError("transpose masks must keep a rectangular region (comparisons of one index each)")
    (a, b), (c, e) = box
    return src.narrow(0, a, b - a).narrow(1, c, e - c), dst.narrow(0, c, e - c).narrow(1, a, b - a), None


def retarget(d, value, accumulate=False):
    """``d[...] = value`` (or ``d += value`` with ``accumulate``) where ``value`` is the result of the
    last instruction and nothing else holds it: that instruction writes ``d`` instead (no
    temporary, no copy; a matmul accumulates into ``d``), as the NKI compiler does. False when it
    cannot (another instruction came since, shapes or dtypes differ)."""
    tr = current()
    t = value if isinstance(value, NkiTensor) else value.tensor
    prod = t.__dict__.get("_producer")
    if (prod is None or prod[0] != tr.program.num_instructions or d.indirect is not None or d.dynamic
            or t.tdtype != d.tdtype or t.space != d.space or tuple(value.shape) != tuple(d.sizes)):
        return False
    _, consts, sizes, coeffs = prod  # what the instruction wrote: the tile, or the box its mask kept
    if isinstance(value, View):
        # the result as the instruction shaped it, held by nothing but this view
        if (sys.getrefcount(t) > 3 or value.indirect is not None
                or (tuple(value.consts), tuple(value.sizes), tuple(value.coeffs)) != (consts, sizes, coeffs)):
            return False
    else:
        n = len(sizes)
        if len(consts) != n or any(tuple(c) != tuple(int(i == k) for i in range(n)) for k, c in enumerate(coeffs)):
            return False
        for k, (c, size) in enumerate(zip(consts, sizes)):
            if (c, size) != (0, d.sizes[k]):
                d = d.narrow(k, c, size)
    _check_bounds(d, None)
    access = d.access("dst")
    if not tr.program.retarget_last(t.tile, access, accumulate):
        return False
    if tr.loops:
        _loops.check_writes(tr, d, None, accumulate)
    if d.space == PSUM:
        mark_written(d)
    t._producer = None
    return True


def _region(v):
    a = v.access("", [])
    return (a[2], tuple(a[3]), tuple(a[4]))


def mark_written(v):
    """Records a write into a PSUM tile (a first ``psum += matmul`` overwrites instead of adding)."""
    t = v.tensor
    w = t.__dict__.setdefault("_written", set())
    w.add("all" if tuple(v.sizes) == tuple(t.shape) and v.consts == [0] * len(t.shape) else _region(v))


def was_written(v):
    w = v.tensor.__dict__.get("_written", ())
    return "all" in w or _region(v) in w


def precheck(kind, name, dst_shape, dst_space, srcs, roles, ints=()):
    """Checks an instruction whose result shape comes from its operands before the result is
    allocated (so the error names the operand's limit, not the result's size)."""
    tr = current()
    buf = PSUM_BUFFER if dst_space == PSUM else SBUF_BUFFER
    dst = (buf, torch.float32, 0, list(dst_shape), [1] * len(dst_shape), "dst", -1)
    tr.program.check(kind, name, [dst] + [v.access(r, [])[:7] for v, r in zip(srcs, roles)], [int(i) for i in ints])


def require_space(x, allowed, op, param):
    """The Gen-1 check of an operand's address space."""
    v = as_view(x)
    names = {HBM: "hbm", SBUF: "sbuf", PSUM: "psum"}
    if v.space not in allowed:
        want = "|".join(names[s] for s in allowed)
        raise TypeError(f"Expected operand '{param}' of '{op}' to be in address space '{want}', "
                        f"but got a tile in '{names[v.space]}' instead.")
    return v
