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
        self.owners = {}  # id(tensor) -> (int32 array of the writing iteration, -1 unwritten; the tensor)


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


def check_writes(tr, view, mask_t, accumulate):
    """Records the elements an instruction writes in the enclosing affine loops; raises when
    another iteration of one of them wrote one of them (for tensors made before the loop).
    Elements are the tensor's own (row-major index), so blocks that a manual placement puts at
    one address are still different elements, as NKI sees them."""
    t = view.tensor
    base = base_of(t)
    frames = [f for f in tr.loops if f.affine and base.serial < f.mark]
    if not frames or accumulate or view.indirect is not None or view.dynamic or t.tdtype != base.tdtype:
        return
    size = math.prod(base.shape)
    if size > _OWNER_LIMIT or math.prod(t.shape) != size:
        return
    index = _element_indices(view, mask_t)
    if index is None:
        return
    for f in frames:
        owner = f.owners.get(id(base))
        if owner is None:
            owner = f.owners[id(base)] = (np.full(size, -1, np.int32), base)  # base: keeps the id unique
        prev = owner[0][index]
        clash = (prev >= 0) & (prev != f.iteration)
        if clash.any():
            from ._emit import kernel_line  # the kernel line only when it is reported (a frame walk)
            other = int(prev[clash][0])
            raise ValueError(f"affine_range iterations {other} and {f.iteration} both write {base.name or 'a tensor'} "
                             f"(at {kernel_line()}): the iterations of an affine_range loop must be independent; "
                             f"use sequential_range when one iteration depends on another")
        owner[0][index] = f.iteration


def _element_indices(view, mask_t):
    """Row-major indices into the view's tensor of the elements it covers (those its mask keeps)."""
    t = view.tensor
    sizes = view.sizes
    if not all(type(x) is int for x in (*sizes, *view.consts, *(c for co in view.coeffs for c in co))):
        return None  # symbolic (a fake-tensor trace with dynamic shapes)
    n = math.prod(sizes)
    if n == 0 or n > _OWNER_LIMIT:
        return None
    row = [math.prod(t.shape[k + 1:]) for k in range(len(t.shape))]
    e = np.full(sizes, sum(c * r for c, r in zip(view.consts, row)), np.int64)
    for d, s in enumerate(sizes):
        step = sum(view.coeffs[k][d] * row[k] for k in range(len(row)))
        if step:
            shape = [1] * len(sizes)
            shape[d] = s
            e = e + (np.arange(s, dtype=np.int64) * step).reshape(shape)
    if mask_t is not None:
        e = e[mask_t.numpy()]
    return e.ravel()
