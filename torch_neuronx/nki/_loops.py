"""Gen-1 ``affine_range``/``sequential_range`` loops as the tracer runs them.

NKI traces such a loop's body once, with a symbolic index; here the body runs
once per iteration. Two consequences are modelled: Python in the body runs
once in NKI, so a manual allocation repeated at the same call site in a later
iteration takes the first iteration's address (``_emit.new_tensor``); and an
``affine_range`` promises independent iterations, so two iterations writing
the same element of a tensor that outlives the loop is an error (associative
accumulation, ``psum += ...``, is allowed, as NKI allows it).
"""
from __future__ import annotations

import math

import numpy as np

_OWNER_LIMIT = 1 << 24  # elements: larger tensors are not tracked


class LoopFrame:
    """One running loop: its kind, the iteration, and which iteration wrote each element."""

    def __init__(self, affine, mark):
        self.affine, self.mark, self.iteration = affine, mark, 0
        self.owners = {}  # (buffer, tile) -> int32 array of the writing iteration, -1 unwritten


class SymbolicRange:
    """The iterations of an ``affine_range`` (``affine=True``) or ``sequential_range`` loop."""

    def __init__(self, r, affine):
        self.range, self.affine = r, affine

    def __len__(self):
        return len(self.range)

    def __getitem__(self, i):
        return self.range[i]

    def __iter__(self):
        from ._emit import _local
        tr = getattr(_local, "trace", None)
        if tr is None:
            yield from self.range
            return
        if not tr.loops:  # a new outermost loop: its body's manual allocations are placed afresh
            tr.manual_sites = {}
        frame = LoopFrame(self.affine, tr.serial)
        tr.loops.append(frame)
        try:
            for i in self.range:
                frame.iteration = i
                yield i
        finally:
            tr.loops.remove(frame)


def base_of(t):
    while getattr(t, "_base", None) is not None:
        t = t._base
    return t


def check_writes(tr, view, access, mask_t, accumulate, where):
    """Records the elements an instruction writes in the enclosing affine loops; raises when
    another iteration of one of them wrote one of them (for tensors made before the loop)."""
    t = base_of(view.tensor)
    frames = [f for f in tr.loops if f.affine and t.serial < f.mark]
    if not frames or accumulate or view.indirect is not None or view.dynamic or t.block_locs is not None:
        return
    offsets = _element_offsets(access, mask_t)
    if offsets is None:
        return
    key, size = _owner_key(t, access, offsets)
    if key is None:
        return
    for f in frames:
        owner = f.owners.get(key)
        if owner is None:
            owner = f.owners[key] = np.full(size, -1, np.int32)
        prev = owner[offsets]
        clash = (prev >= 0) & (prev != f.iteration)
        if clash.any():
            other = int(prev[clash][0])
            raise ValueError(f"affine_range iterations {other} and {f.iteration} both write {t.name or 'a tensor'} "
                             f"(at {where}): the iterations of an affine_range loop must be independent; use "
                             f"sequential_range when one iteration depends on another")
        owner[offsets] = f.iteration


def _element_offsets(access, mask_t):
    """The element offsets an access writes (within its buffer/tile), or None when too many."""
    _, dtype, off, sizes, strides = access[:5]
    if not all(type(x) is int for x in (off, *sizes, *strides)):
        return None  # symbolic (a fake-tensor trace with dynamic shapes)
    n = math.prod(sizes)
    if n == 0 or n > _OWNER_LIMIT:
        return None
    item = dtype.itemsize
    e = np.full(sizes, off // item, np.int64)
    for d, (s, st) in enumerate(zip(sizes, strides)):
        shape = [1] * len(sizes)
        shape[d] = s
        e = e + (np.arange(s, dtype=np.int64) * st).reshape(shape)
    if mask_t is not None:
        e = e[mask_t.numpy()]
    return e.ravel()


def _owner_key(t, access, offsets):
    """(key, owner size) with offsets made compact: HBM tensors by element, on-chip tiles by
    (partition, element within the partition)."""
    if access[6] is None or access[6] < 0:  # HBM
        size = math.prod(t.shape)
        return ((access[0], -1), size) if size <= _OWNER_LIMIT and offsets.max() < size else (None, 0)
    pstride = t.strides[t.partition_axis or 0]
    extent = 1 + sum((s - 1) * st for d, (s, st) in enumerate(zip(t.shape, t.strides)) if d != (t.partition_axis or 0))
    P = t.shape[t.partition_axis or 0]
    if P * extent > _OWNER_LIMIT:
        return None, 0
    p, f = np.divmod(offsets - t.byte_offset // access[1].itemsize, pstride)  # from the tensor's first element
    if p.min() < 0 or p.max() >= P or f.min() < 0 or f.max() >= extent:
        return None, 0
    offsets[:] = p * extent + f
    return (access[0], access[6]), P * extent
