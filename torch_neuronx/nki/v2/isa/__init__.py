"""``nki.isa`` of the Gen-2 API: every instruction writes ``dst`` (its first
parameter) and takes no mask or dtype (the result's dtype is dst's). Each
issues the same core instruction as its Gen-1 counterpart."""
from __future__ import annotations

import enum
import math

import torch

from ... import isa as _g1
from ...isa.gpsimd import _rows
from ... import language as _nl
from ..._emit import issue, require_space
from ..._tensor import PSUM, SBUF, as_view, to_dtype
from .mx import _accumulates, nc_matmul_mx, quantize_mx  # noqa: F401 - nki.isa names
from ..._registers import register_alloc, register_load, register_move, register_store  # noqa: F401
from .engines_v4 import (activate2, exponential, rand2, rand_get_state, rand_set_state, rng,  # noqa: F401
                         set_rng_seed)


class engine(enum.Enum):
    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    dma = 4
    vector = 5
    sync = 6


tensor_engine, vector_engine, scalar_engine = engine.tensor, engine.vector, engine.scalar
gpsimd_engine, unknown_engine = engine.gpsimd, engine.unknown


class reduce_cmd(enum.Enum):
    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class dge_mode(enum.Enum):
    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class oob_mode(enum.Enum):
    error = 0
    skip = 1


class dma_engine(enum.Enum):
    dma = 1
    gpsimd_dma = 2


class matmul_perf_mode(enum.Enum):
    none = "none"
    double_row = "double_row"


nc_version = _g1.nc_version
get_nc_version = _g1.get_nc_version


class NkiValidationError(Exception):
    """An instruction's operands violate the target's limits."""


def _dt(dst):
    return as_view(dst).tdtype


def _g1_engine(e):
    return _g1.engine(e.value) if isinstance(e, engine) else e


def dma_copy(dst, src, priority=None, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown, engine=engine.unknown,
             name=None):
    _g1.dma_copy(dst=dst, src=src, oob_mode=_g1.oob_mode(oob_mode.value))


def tensor_copy(dst, src, engine=engine.unknown, name=None):
    d = as_view(dst)
    if d.space not in (SBUF, PSUM):
        raise TypeError(f"tensor_copy dst must be in ['sbuf', 'psum'], got {d.buffer_space}")
    _g1.tensor_copy(src, dtype=d.tdtype, _dst=dst)


def memset(dst, value, engine=engine.unknown, name=None):
    issue("fill", "memset", as_view(dst), scalars=[float(value)])


def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False, is_transpose=False,
              accumulate=None, tile_position=(), tile_size=(), perf_mode=matmul_perf_mode.none, name=None):
    """``dst = stationary.T @ moving`` (``accumulate``: True adds, False overwrites, None adds after the
    first write to the same PSUM region)."""
    d = as_view(dst)
    if d.space != PSUM:
        raise TypeError(f"nc_matmul dst must be in ['psum'], got {d.buffer_space}")
    acc = _accumulates(d, accumulate)
    _g1.nc_matmul(stationary, moving, is_transpose=is_transpose, perf_mode=perf_mode, _dst=dst, _accumulate=acc,
                  _strict=True)


def nc_transpose(dst, data, engine=engine.unknown, name=None):
    _g1.nc_transpose(data, engine=_g1_engine(engine), _dst=dst)


def dma_transpose(dst, src, axes=None, priority=None, dge_mode=dge_mode.unknown, oob_mode=oob_mode.error, name=None):
    _g1.dma_transpose(src, axes=axes, _dst=dst)


def tensor_tensor(dst, data1, data2, op, engine=engine.unknown, name=None):
    _g1.tensor_tensor(data1, data2, op, dtype=_dt(dst), _dst=dst)


def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                  engine=engine.unknown, name=None):
    _g1.tensor_scalar(data, op0, operand0, reverse0, op1, operand1, reverse1, dtype=_dt(dst), _dst=dst)


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None):
    _g1.tensor_reduce(op, data, axis, dtype=_dt(dst), negate=negate, keepdims=True, _dst=dst)


def tensor_partition_reduce(dst, op, data, name=None):
    _g1.tensor_partition_reduce(op, data, dtype=_dt(dst), _dst=dst)


def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None, reduce_cmd=reduce_cmd.idle,
               name=None):
    _g1.activation(op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res,
                   reduce_cmd=reduce_cmd, dtype=_dt(dst), _dst=dst)


def activation_reduce(dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None):
    _g1.activation(op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res, dtype=_dt(dst),
                   _dst=dst)


def scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, dtype=None,
                         name=None):
    """``dst = (data op0 operand0) op1 operand1``; the result is dst's dtype (``dtype``, which the
    NKI library passes, must agree with it)."""
    t = as_view(dst).tensor
    if dtype is not None and to_dtype(dtype) != (t.declared or t.tdtype):
        raise TypeError(f"scalar_tensor_tensor dtype {dtype} differs from dst's {as_view(dst).dtype}")
    _g1.scalar_tensor_tensor(data=data, op0=op0, operand0=operand0, op1=op1, operand1=operand1, reverse0=reverse0,
                             reverse1=reverse1, dtype=_dt(dst), _dst=dst)


def tensor_scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res=None, reverse0=False,
                         reduce_cmd=reduce_cmd.reset_reduce, reduce_init=None, reduce_res_negate=False, name=None):
    _g1.tensor_scalar_reduce(data=data, op0=op0, operand0=operand0, reduce_op=reduce_op, reduce_res=reduce_res,
                             reverse0=reverse0, reduce_cmd=reduce_cmd, reduce_init=reduce_init,
                             reduce_res_negate=reduce_res_negate, dtype=_dt(dst), _dst=dst)


def tensor_tensor_scan(dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False, name=None):
    _g1.tensor_tensor_scan(data0, data1, initial, op0, op1, reverse0, reverse1, dtype=_dt(dst), _dst=dst)


def reciprocal(dst, data, name=None):
    _g1.reciprocal(data, dtype=_dt(dst), _dst=dst)


def bn_stats(dst, data, name=None):
    _g1.bn_stats(data, dtype=_dt(dst), _dst=dst)


def bn_aggr(dst, data, name=None):
    _g1.bn_aggr(data, dtype=_dt(dst), _dst=dst)


def _pattern_values(shape, pattern, offset, channel_multiplier):
    """``offset + c * channel_multiplier + sum(idx_i * step_i)`` over dst's (P, free...) shape."""
    P = shape[0]
    free = math.prod(shape[1:])
    dims = [n for _, n in pattern]
    if math.prod(dims) != free:
        raise ValueError(f"pattern {pattern} covers {math.prod(dims)} elements per partition, dst has {free}")
    v = torch.full((P,) + tuple(dims), int(offset), dtype=torch.int64)
    v += (torch.arange(P) * int(channel_multiplier)).view((P,) + (1,) * len(dims))
    for i, (step, n) in enumerate(pattern):
        shp = [1] * (len(dims) + 1)
        shp[i + 1] = n
        v += (torch.arange(n) * int(step)).view(shp)
    return v.reshape(shape)


def iota(dst, pattern, offset=0, channel_multiplier=0, name=None):
    """``dst[c, ...] = offset + c * channel_multiplier + sum(idx * step)`` (int32 math, cast to dst)."""
    d = as_view(dst)
    if d.space != SBUF:
        raise TypeError(f"iota dst must be in ['sbuf'], got {d.buffer_space}")
    vals = _pattern_values(d.sizes, pattern, offset, channel_multiplier).to(torch.int32)
    issue("const", "iota", d, constant=vals.to(d.tdtype))


_CMP = {"equal": torch.eq, "not_equal": torch.ne, "greater": torch.gt, "greater_equal": torch.ge, "less": torch.lt,
        "less_equal": torch.le}


def affine_select(dst, pattern, channel_multiplier, on_true_tile, on_false_value, cmp_op=_nl.equal, offset=0,
                  name=None):
    """``dst = on_true_tile`` where ``cmp_op(offset + c * channel_multiplier + sum(idx * step), 0)``."""
    d = as_view(dst)
    v = _pattern_values(d.sizes, pattern, offset, channel_multiplier)
    pred = _CMP[_nl._op_name(cmp_op)](v, 0)
    _g1.affine_select(None, on_true_tile, on_false_value, _dst=dst, _pred_values=pred)


def dropout(dst, data, prob, name=None):
    r = _g1.dropout(data, prob, dtype=_dt(dst))
    tensor_copy(dst, r)


def max8(dst, src, name=None):
    _g1.max8(src=src, dtype=_dt(dst), _dst=dst)


def nc_find_index8(dst, data, vals, name=None):
    _g1.nc_find_index8(data=data, vals=vals, dtype=_dt(dst), _dst=dst)


def nc_match_replace8(dst, data, vals, imm, dst_idx=None, name=None):
    _g1.nc_match_replace8(data=data, vals=vals, imm=imm, dst_idx=dst_idx, dtype=_dt(dst), _dst=dst)


def nc_stream_shuffle(dst, src, shuffle_mask, name=None):
    _g1.nc_stream_shuffle(src, dst, shuffle_mask)


def sequence_bounds(dst, segment_ids, name=None):
    _g1.sequence_bounds(segment_ids=segment_ids, dtype=_dt(dst), _dst=dst)


def local_gather(dst, src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, name=None):
    _g1.local_gather(src_buffer, index, num_elem_per_idx, num_valid_indices, _dst=dst)


def range_select(dst, on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd=reduce_cmd.reset_reduce,
                 reduce_res=None, reduce_op=_nl.maximum, range_start=0, on_false_value=-3.4028234663852886e38,
                 name=None):
    _g1.range_select(on_true_tile=on_true_tile, comp_op0=comp_op0, comp_op1=comp_op1, bound0=bound0, bound1=bound1,
                     reduce_res=reduce_res, reduce_op=reduce_op, reduce_cmd=reduce_cmd, range_start=range_start,
                     on_false_value=on_false_value, dtype=_dt(dst), _dst=dst)


def dma_compute(dst, srcs, reduce_op, scales=None, unique_indices=True, oob_mode=oob_mode.error, name=None):
    """``dst = srcs[0] * scales[0] + srcs[1] * scales[1] + ...`` on the DMA engines (fp32 inside);
    a source that is ``dst`` itself (indirect or not) makes it a read-modify-write."""
    if _nl._op_name(reduce_op) != "add":
        raise ValueError("dma_compute supports reduce_op=nl.add only")
    if scales is not None and any(float(x) != 1.0 for x in scales):
        raise ValueError("dma_compute supports scales of 1.0 only")
    d = as_view(dst)
    srcs = [as_view(x) for x in srcs]
    same = [i for i, x in enumerate(srcs) if x.tensor is d.tensor and
            (x.sizes, x.consts, x.coeffs, x.indirect) == (d.sizes, d.consts, d.coeffs, d.indirect)]
    rest = [x for i, x in enumerate(srcs) if i not in same[:1]]
    if not same:  # dst = the first source, then the others added
        _g1.dma_copy(dst=dst, src=rest.pop(0))
    skip = oob_mode == globals()["oob_mode"].skip
    for x in rest:
        _g1.dma_copy(dst=dst, src=x, dst_rmw_op=_nl.add, oob_mode=_g1.oob_mode.skip if skip else _g1.oob_mode.error)


def _meet(kind, participants, payload, action):
    """A meeting of logical cores (kernel[2] instances) at their n-th ``kind`` call."""
    from ..._emit import current
    tr = current()
    me = tr.rank
    participants = {int(r) for r in participants} | {me}
    if participants == {me}:
        action({me: payload})
        return
    grid = tr.grid[0] if tr.grid else 1
    if tr.lockstep is None or max(participants) >= grid:
        raise ValueError(f"{kind[0]}: core {me} meets core(s) {sorted(participants - {me})}, but the launch has "
                         f"{grid} logical core(s); launch the kernel as kernel[2]")
    n = tr.meetings[kind]
    tr.meetings[kind] += 1
    tr.lockstep.meet(kind + (tr.program_id[1:], n), me, participants, payload, action)


def sendrecv(src, dst, send_to_rank, recv_from_rank, pipe_id, dma_engine=dma_engine.dma, name=None):
    """Sends ``src`` to core ``send_to_rank``'s ``dst`` while receiving core ``recv_from_rank``'s
    ``src`` into this core's ``dst`` (both cores of a ``kernel[2]`` launch call it)."""
    s, d = as_view(src), as_view(dst)
    if s.space != SBUF or d.space != SBUF:
        raise ValueError(f"sendrecv src and dst must be in SBUF, got {s.buffer_space} and {d.buffer_space}")
    if s.tdtype != d.tdtype or s.sizes[0] != d.sizes[0] or math.prod(s.sizes) != math.prod(d.sizes):
        raise ValueError(f"sendrecv src {list(s.sizes)} {s.tdtype} and dst {list(d.sizes)} {d.tdtype} must have "
                         f"the same dtype, partitions and elements per partition")

    def exchange(calls):
        for r, (src_r, _, to, _) in calls.items():
            if to not in calls or calls[to][3] != r:
                raise ValueError(f"sendrecv: core {r} sends to core {to}, which does not receive from it")
            target = calls[to][1]
            issue("copy", "sendrecv", target, [src_r if src_r.sizes == target.sizes else src_r.reshape(target.sizes)],
                  roles=["dst", "src"])
    _meet(("sendrecv", int(pipe_id)), {int(send_to_rank), int(recv_from_rank)},
          (s, d, int(send_to_rank), int(recv_from_rank)), exchange)


def core_barrier(data, cores, engine=engine.gpsimd, name=None):
    """Every core of ``cores`` waits here for the others (their writes to ``data`` before it are
    seen by their reads after it)."""
    _meet(("core_barrier",), set(cores), None, lambda calls: None)


def nc_n_gather(dst, data, indices, name=None):
    """Per partition, ``dst[p, k] = data[p].flat[indices[p, k]]`` (GpSimd; indices uint32, in range)."""
    d, v, i = as_view(dst), require_space(data, (SBUF,), "nc_n_gather", "data"), \
        require_space(indices, (SBUF,), "nc_n_gather", "indices")
    if d.space != SBUF:
        raise ValueError(f"nc_n_gather dst must be in SBUF, got {d.buffer_space}")
    P = v.sizes[0]
    issue("gather", "nc_n_gather", _rows(dst, P, math.prod(d.sizes[1:])),
          [_rows(data, P, math.prod(v.sizes[1:])), _rows(indices, P, math.prod(i.sizes[1:]))], same_shape=False,
          roles=["dst", "data", "indices"])


def nonzero_with_count(dst, src, index_offset=0, padding_val=-1, name=None):
    """In partitions 0, 16, ..., 112: the indices of src's nonzero elements (+ ``index_offset``),
    ``padding_val`` after them, and their count in dst's last element."""
    d, v = as_view(dst), as_view(src)
    P = v.sizes[0]
    issue("nonzero", "nonzero_with_count", _rows(dst, P, math.prod(d.sizes[1:])),
          [_rows(src, P, math.prod(v.sizes[1:]))], ints=[int(index_offset), int(padding_val)], same_shape=False,
          roles=["dst", "src"])


def tensor_copy_predicated(dst, src, predicate, reverse_pred=False, name=None):
    _g1.tensor_copy_predicated(src=src, dst=dst, predicate=predicate, reverse_pred=reverse_pred)


def select_reduce(dst, predicate, on_true, on_false, reduce_res=None, reduce_cmd=reduce_cmd.idle,
                  reduce_op=_nl.maximum, reverse_pred=False, name=None):
    _g1.select_reduce(dst=dst, predicate=predicate, on_true=on_true, on_false=on_false, reduce_res=reduce_res,
                      reduce_cmd=reduce_cmd, reduce_op=reduce_op, reverse_pred=reverse_pred)


def tensor_scalar_cumulative(dst, src, op0, op1, imm0, imm1=None, reduce_cmd=reduce_cmd.reset_reduce, name=None):
    _g1.tensor_scalar_cumulative(src=src, dst=dst, op0=op0, op1=op1, imm0=imm0, imm1=imm1,
                                 reduce_cmd=_g1.reduce_cmd(reduce_cmd.value))
