"""Gen-1 ``nl.all_reduce``: a tile reduced across the SPMD instances of a launch (``nl.nc(2)``
cores, or grid instances along axis 0), every instance getting the result. The instances meet
(as at ``nisa.sendrecv``); the last to arrive issues the reduction into each one's result tile."""
from __future__ import annotations

from ._emit import current, issue, new_tensor
from ._tensor import PSUM, SBUF, as_view, to_dtype


def all_reduce(x, op, program_axes, *, dtype=None, mask=None, parallel_reduce=True, asynchronous=False, **kwargs):
    """``op`` over the instances of the launch along ``program_axes`` (axis 0) of tile ``x``."""
    from . import language as nl
    from .v2.isa import _meet
    v = as_view(x)
    if v.space not in (SBUF, PSUM):
        raise TypeError(f"all_reduce x must be an SBUF/PSUM tile, got {v.tensor.buffer_space}")
    tr = current()
    axes = [int(a) for a in (program_axes if isinstance(program_axes, (list, tuple)) else [program_axes])]
    ndim = max(len(tr.grid), 1)
    for a in axes:
        if not 0 <= a < ndim:
            raise ValueError(f"all_reduce program_axes {axes}: the launch grid has {ndim} dimension(s)")
        if a != 0:
            raise NotImplementedError(f"all_reduce over program axis {a}: instances meet along axis 0 only")
    res = new_tensor(tuple(v.sizes), to_dtype(dtype) or v.tdtype)
    name = nl._op_name(op)

    def reduce_into(calls):
        srcs = [calls[r][0] for r in sorted(calls)]
        for _, out in calls.values():
            issue("copy", "all_reduce", out, [srcs[0]], mask=mask, roles=["dst", "x"])
            for s in srcs[1:]:
                issue("tensor_tensor", "all_reduce", out, [out, s], fns=[name], mask=mask,
                      roles=["dst", "data1", "data2"])

    grid = tr.grid[0] if tr.grid else 1
    _meet(("all_reduce",), set(range(grid)), (v, res.view_all()), reduce_into)
    return res
