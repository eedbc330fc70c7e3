"""``nki.isa`` (``nisa``) of the Gen-1 API (``neuronxcc.nki.isa``): the
NeuronCore's instructions. Each returns a new tile (Gen-1); the Gen-2 front
end calls the same issue paths with ``dst=``."""
from __future__ import annotations

import enum
import math

import numpy as np
import torch

from .. import language as nl
from .._emit import current, issue, new_tile, precheck, require_space, transpose_masked
from .._index import IndexExpr, Mask
from .._tensor import HBM, PSUM, SBUF, as_view, is_tile, to_dtype


class engine(enum.IntEnum):
    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    dma = 4
    vector = 5
    sync = 6


unknown_engine, tensor_engine, scalar_engine = engine.unknown, engine.tensor, engine.scalar
gpsimd_engine, vector_engine, dma_engine = engine.gpsimd, engine.vector, engine.dma


class nc_version(enum.IntEnum):
    gen2 = 2
    gen3 = 3
    gen4 = 4


class reduce_cmd(enum.IntEnum):
    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class dge_mode(enum.IntEnum):
    none = 0
    swdge = 1
    hwdge = 2
    unknown = 3


class oob_mode(enum.IntEnum):
    error = 0
    skip = 1


fp32 = nl.fp32


def get_nc_version():
    from ... import _C
    return nc_version(_C._nki.target()["nc_version"])


def _op(op):
    return nl._op_name(op)


def _dst_shape(v):
    return nl._tile_shape(v.sizes)


def _out(v, dtype, space=SBUF, dst=None, shape=None):
    """The result: a new tile of ``shape`` (default v's), or Gen-2's ``dst`` viewed in that shape."""
    shape = tuple(v.sizes if shape is None else shape)
    if dst is not None:
        d = as_view(dst)
        if tuple(d.sizes) != shape:
            if math.prod(d.sizes) != math.prod(shape) or d.sizes[0] != shape[0]:
                raise ValueError(f"dst shape {list(d.sizes)} does not match the result's shape {list(shape)}")
            d = d.reshape(shape)
        return dst, d
    t = new_tile(nl._tile_shape(shape), to_dtype(dtype) or v.tdtype, space)
    return t, nl._as_shape(t, shape)


# -- matmul and transposes ---------------------------------------------------------
def _to_sbuf(x):
    """A PSUM tile copied to SBUF (what the Gen-1 compiler inserts before the Tensor Engine reads it)."""
    if is_tile(x) and as_view(x).space == PSUM:
        v = as_view(x)
        t, d = _out(v, v.tdtype, SBUF)
        issue("copy", "tensor_copy", d, [v], roles=["dst", "src"])
        return t
    return x


def nc_matmul(stationary, moving, *, is_stationary_onezero=False, is_moving_onezero=False, is_transpose=False,
              tile_position=(), tile_size=(), mask=None, perf_mode=None, _dst=None, _accumulate=False, _strict=False,
              **kwargs):
    """``stationary.T @ moving`` on the Tensor Engine into a new fp32 PSUM tile. ``perf_mode``
    ``double_row*`` contracts two rows per partition: (K, 2, M) by (K, 2, N)."""
    mode = str(getattr(perf_mode, "value", perf_mode) or "")
    if mode.startswith("double_row"):
        s, m = as_view(stationary), as_view(moving)
        if len(s.sizes) != 3 or s.sizes[1] != 2 or len(m.sizes) != 3 or m.sizes[1] != 2:
            raise ValueError(f"nc_matmul perf_mode={mode} takes (K, 2, M) stationary and (K, 2, N) moving tiles, "
                             f"got {list(s.sizes)} and {list(m.sizes)}")
        t = nc_matmul(s[:, 0, :], m[:, 0, :], mask=mask, _dst=_dst, _accumulate=_accumulate, _strict=_strict)
        nc_matmul(s[:, 1, :], m[:, 1, :], mask=mask, _dst=t, _accumulate=True, _strict=_strict)
        return t
    if not _strict:  # Gen-1: the compiler copies a PSUM operand to SBUF first
        stationary, moving = _to_sbuf(stationary), _to_sbuf(moving)
    s = require_space(stationary, (SBUF,), "nc_matmul", "stationary")
    m = require_space(moving, (SBUF,), "nc_matmul", "moving")
    shape = (math.prod(s.sizes[1:]), math.prod(m.sizes[1:]))
    precheck("matmul", "nc_matmul", shape, PSUM, [s, m], ["stationary", "moving"], [0])
    # is_transpose: the PE passes data through (moving is an identity), keeping the input dtype
    t, d = _out(s, s.tdtype if is_transpose else torch.float32, PSUM, _dst, shape)
    issue("matmul", "nc_matmul", d, [s, m], ints=[int(_accumulate)], mask=mask, same_shape=False,
          roles=["dst", "stationary", "moving"])
    return t


def nc_transpose(data, *, mask=None, dtype=None, engine=engine.unknown, _dst=None, **kwargs):
    v = require_space(data, (SBUF, PSUM), "nc_transpose", "data")
    p, f = v.sizes[0], math.prod(v.sizes[1:])
    if _dst is not None and engine == unknown_engine:
        use_vector = as_view(_dst).space != PSUM
    else:
        use_vector = int(engine) == int(vector_engine) or (engine == unknown_engine and p <= 32 and f <= 32)
    precheck("transpose", "nc_transpose", (f, p), SBUF if use_vector else PSUM, [v], ["data"], [int(use_vector)])
    t, d = _out(v, dtype, SBUF if use_vector else PSUM, _dst, (f, p))
    v, d, mask = transpose_masked(v.reshape((p, f)) if len(v.sizes) != 2 and mask is not None else v, d, mask)
    if mask is not False:
        issue("transpose", "nc_transpose", d, [v], ints=[1 if use_vector else 0], same_shape=False,
              roles=["dst", "data"])
    return t


# -- Scalar Engine ----------------------------------------------------------------
def _pp(x, role, op):
    """A per-partition (P, 1) operand."""
    return require_space(x, (SBUF, PSUM), op, role)


def activation(op, data, *, bias=None, scale=1.0, reduce_op=None, reduce_res=None, reduce_cmd=reduce_cmd.idle,
               mask=None, dtype=None, _dst=None, _name="activation", _alpha=None, _vector_regs=False,
               _reduce_init=None, **kwargs):
    """``op(data * scale + bias)`` in fp32 (``scale`` a constant or a (P, 1) tile; ``bias`` (P, 1)).
    (``_vector_regs``: the reduction uses the Vector Engine's registers, for Gen-2 ``exponential``;
    ``_reduce_init``: a (P, 1) tile ``load_reduce`` starts from; ``_alpha``: the function's parameter.)"""
    v = require_space(data, (SBUF, PSUM), _name, "data")
    t, d = _out(v, dtype, dst=_dst)
    srcs, roles, ints, scalars = [v], ["dst", "data"], [0, 0, 0], [1.0]
    if _alpha is not None:
        scalars.append(float(_alpha))
    if bias is not None:
        srcs.append(_pp(bias, "bias", "activation"))
        roles.append("bias")
        ints[0] = 1
    if is_tile(scale):
        srcs.append(_pp(scale, "scale", "activation"))
        roles.append("scale")
        ints[1] = 1
    else:
        scalars[0] = float(scale)
    fns = [_op(op), _op(reduce_op) if reduce_op is not None else "add"]
    cmd = _cmd(reduce_cmd)
    if reduce_res is not None:
        srcs.append(require_space(reduce_res, (SBUF, PSUM), "activation", "reduce_res"))
        roles.append("reduce_res")
        ints[2] = 1
    # the engine's reduce registers; a reduce_res without a command starts a new reduction
    ints.append(3 if reduce_res is not None and cmd == 0 else cmd)
    ints.append(int(_vector_regs))
    if _reduce_init is not None:
        srcs.append(_pp(_reduce_init, "reduce_init", _name))
        roles.append("reduce_init")
    ints.append(int(_reduce_init is not None))
    issue("activation", _name, d, srcs, fns=fns, scalars=scalars, ints=ints, mask=mask, same_shape=False,
          roles=roles)
    return t


def _cmd(c):
    """A reduce command (either API's enum, or its value) as its number."""
    return int(getattr(c, "value", c))


def activation_reduce(op, data, *, reduce_op, reduce_res, bias=None, scale=1.0, mask=None, dtype=None, _dst=None,
                      **kwargs):
    return activation(op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res,
                      reduce_cmd=reduce_cmd.reset_reduce, mask=mask, dtype=dtype, _dst=_dst)


# -- Vector / GpSimd Engines --------------------------------------------------------
def tensor_tensor(data1, data2, op, *, dtype=None, mask=None, engine=engine.unknown, _dst=None, **kwargs):
    a = require_space(data1, (SBUF, PSUM), "tensor_tensor", "data1")
    b = require_space(data2, (SBUF, PSUM), "tensor_tensor", "data2")
    if a.sizes[0] != b.sizes[0]:
        raise ValueError(f"number of partitions (dimension 0 size of a tile) mismatch in parameters "
                         f"(data1{list(a.sizes)}, data2{list(b.sizes)}) of 'tensor_tensor'")
    t, d = _out(a, to_dtype(dtype) or nl.result_dtype(a, b), dst=_dst)
    d, a, b = _aligned([d, a, b])
    issue("tensor_tensor", "tensor_tensor", d, [a, b], fns=[_op(op)], mask=mask, roles=["dst", "data1", "data2"])
    return t


def _aligned(views):
    """Operands with the same partitions and elements per partition, viewed in one shape: the
    engine walks each in row-major order, so their free shapes are split to a common refinement
    (splitting a dim keeps an access affine; merging need not). The first's shape if none exists."""
    shapes = [tuple(v.sizes[1:]) for v in views]
    if len(set(shapes)) == 1:
        return views
    cuts = set()
    for sh in shapes:  # the element counts at which some operand's dims wrap, from the innermost
        c = 1
        for n in reversed(sh):
            c *= n
            cuts.add(c)
    total = math.prod(shapes[0])
    order = sorted(x for x in cuts if x <= total)
    common, prev = [], 1
    for c in order:
        if c % prev:
            return [views[0]] + [v if tuple(v.sizes) == tuple(views[0].sizes) else v.reshape(views[0].sizes)
                                 for v in views[1:]]
        if c // prev > 1:
            common.insert(0, c // prev)
        prev = c
    shape = (views[0].sizes[0],) + tuple(common)
    return [v if tuple(v.sizes) == shape else v.reshape(shape) for v in views]


def _scalar_operand(x, srcs, roles, role):
    if is_tile(x):
        srcs.append(_pp(x, role, "tensor_scalar"))
        roles.append(role)
        return 1, 0.0
    return 0, float(x)


def tensor_scalar(data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False, *, dtype=None,
                  mask=None, engine=engine.unknown, _dst=None, **kwargs):
    """``(data op0 operand0) op1 operand1``; operands are constants or (P, 1) tiles."""
    v = require_space(data, (SBUF, PSUM), "tensor_scalar", "data")
    t, d = _out(v, dtype, dst=_dst)
    srcs, roles = [v], ["dst", "data"]
    ap0, s0 = _scalar_operand(operand0, srcs, roles, "operand0")
    ap1, s1 = (0, 0.0) if op1 is None else _scalar_operand(operand1, srcs, roles, "operand1")
    issue("tensor_scalar", "tensor_scalar", d, srcs, fns=[_op(op0), _op(op1) if op1 is not None else "", ""],
          scalars=[s0, s1], ints=[int(reverse0), int(reverse1), ap0, ap1, 0], mask=mask, same_shape=False,
          roles=roles)
    return t


def tensor_scalar_reduce(*, data, op0, operand0, reduce_op, reduce_res=None, reverse0=False, dtype=None, mask=None,
                         reduce_cmd=reduce_cmd.reset_reduce, reduce_init=None, reduce_res_negate=False, _dst=None,
                         **kwargs):
    """``op0(data, operand0)``, reduced along the free dims into the Vector Engine's registers under
    ``reduce_cmd`` (``load_reduce`` starts from ``reduce_init``); ``reduce_res`` receives them
    (negated with ``reduce_res_negate``)."""
    v = require_space(data, (SBUF, PSUM), "tensor_scalar_reduce", "data")
    t, d = _out(v, dtype, dst=_dst)
    srcs, roles = [v], ["dst", "data"]
    ap0, s0 = _scalar_operand(operand0, srcs, roles, "operand0")
    if reduce_res is not None:
        srcs.append(require_space(reduce_res, (SBUF, PSUM), "tensor_scalar_reduce", "reduce_res"))
        roles.append("reduce_res")
    init_ap, init = 0, 0.0
    if is_tile(reduce_init):
        srcs.append(_pp(reduce_init, "reduce_init", "tensor_scalar_reduce"))
        roles.append("reduce_init")
        init_ap = 1
    elif reduce_init is not None:
        init = float(reduce_init)
    issue("tensor_scalar", "tensor_scalar_reduce", d, srcs, fns=[_op(op0), "", _op(reduce_op)],
          scalars=[s0, 0.0, init], ints=[int(reverse0), 0, ap0, 0, int(reduce_res is not None), _cmd(reduce_cmd),
                                         int(bool(reduce_res_negate)), init_ap],
          mask=mask, same_shape=False, roles=roles)
    return t


def scalar_tensor_tensor(*, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, dtype=None,
                         mask=None, _dst=None, **kwargs):
    """``(data op0 operand0) op1 operand1``; operand0 a constant or (P, 1), operand1 a tile like data."""
    v = require_space(data, (SBUF, PSUM), "scalar_tensor_tensor", "data")
    o1 = require_space(operand1, (SBUF, PSUM), "scalar_tensor_tensor", "operand1")
    t, d = _out(v, to_dtype(dtype) or nl.result_dtype(v, o1), dst=_dst)
    srcs, roles = [v, o1 if o1.sizes == v.sizes else o1.reshape(v.sizes)], ["dst", "data", "operand1"]
    if is_tile(operand0):
        srcs.append(_pp(operand0, "operand0", "scalar_tensor_tensor"))
        roles.append("operand0")
        ap, s = 1, 0.0
    else:
        ap, s = 0, float(operand0)
    issue("scalar_tensor_tensor", "scalar_tensor_tensor", d, srcs, fns=[_op(op0), _op(op1)], scalars=[s],
          ints=[ap, int(reverse0), int(reverse1)], mask=mask, same_shape=False, roles=roles)
    return t


def tensor_reduce(op, data, axis, *, mask=None, dtype=None, negate=False, keepdims=False, _dst=None, **kwargs):
    return nl.reduce_tile(_op(op), data, axis, dtype, mask, keepdims, negate=negate, dst=_dst, suffix=True)


def tensor_partition_reduce(op, data, *, mask=None, dtype=None, _dst=None, **kwargs):
    v = require_space(data, (SBUF, PSUM), "tensor_partition_reduce", "data")
    t, d = _out(v, dtype, dst=_dst, shape=(1,) + tuple(v.sizes[1:]))
    issue("partition_reduce", "tensor_partition_reduce", d, [v], fns=[_op(op)], mask=mask, same_shape=False,
          roles=["dst", "data"])
    return t


def tensor_tensor_scan(data0, data1, initial, op0, op1, reverse0=False, reverse1=False, *, dtype=None, mask=None,
                       _dst=None, **kwargs):
    a = require_space(data0, (SBUF, PSUM), "tensor_tensor_scan", "data0")
    b = require_space(data1, (SBUF, PSUM), "tensor_tensor_scan", "data1")
    t, d = _out(a, to_dtype(dtype) or nl.result_dtype(a, b), dst=_dst)
    srcs, ints, scalars = [a, b], [0], [0.0]
    if is_tile(initial):
        srcs.append(_pp(initial, "initial", "tensor_tensor_scan"))
        ints[0] = 1
    else:
        scalars[0] = float(initial)
    issue("scan", "tensor_tensor_scan", d, srcs, fns=[_op(op0), _op(op1)], scalars=scalars, ints=ints, mask=mask,
          same_shape=False, roles=["dst", "data0", "data1", "initial"][:len(srcs) + 1])
    return t


def tensor_copy(src, *, mask=None, dtype=None, engine=engine.unknown, _dst=None, **kwargs):
    v = require_space(src, (SBUF, PSUM), "tensor_copy", "src")
    t, d = _out(v, dtype, dst=_dst)
    issue("copy", "tensor_copy", d, [v], mask=mask, roles=["dst", "src"])
    return t


def reciprocal(data, *, dtype=None, mask=None, _dst=None, **kwargs):
    v = require_space(data, (SBUF, PSUM), "reciprocal", "data")
    t, d = _out(v, dtype, dst=_dst)
    issue("activation", "reciprocal", d, [v], fns=["reciprocal"], scalars=[1.0], ints=[0, 0, 0], mask=mask,
          roles=["dst", "data"])
    return t


def memset(shape, value, dtype, *, mask=None, engine=engine.unknown, **kwargs):
    t = new_tile(tuple(int(s) for s in shape), to_dtype(dtype))
    issue("fill", "memset", t.view_all(), scalars=[float(value)], mask=mask)
    return t


def iota(expr, dtype, *, mask=None, **kwargs):
    """The values of an index expression as a tile (int32 math, cast to dtype)."""
    if not isinstance(expr, IndexExpr):
        raise TypeError("iota takes an index expression of nl.arange/nl.mgrid, e.g. nl.arange(512)[None, :]")
    shape = nl._tile_shape(expr.shape)
    t = new_tile(shape, to_dtype(dtype))
    vals = expr.evaluate(expr.shape).to(torch.int32).reshape(shape)
    issue("const", "iota", t.view_all(), constant=vals.to(to_dtype(dtype)), mask=mask)
    return t


def affine_select(pred, on_true_tile, on_false_value, *, mask=None, dtype=None, _dst=None, _pred_values=None,
                  **kwargs):
    """``on_true_tile`` where the affine predicate holds, else ``on_false_value``."""
    if _pred_values is None and (not isinstance(pred, Mask) or len(pred.conds) != 1):
        raise ValueError("affine_select takes one affine comparison of index expressions (no & or |)")
    v = require_space(on_true_tile, (SBUF, PSUM), "affine_select", "on_true_tile")
    t, d = _out(v, dtype, dst=_dst)
    values = _pred_values if _pred_values is not None else pred.evaluate(v.sizes)
    issue("select", "affine_select", d, [v], scalars=[float(on_false_value)], constant=values,
          mask=mask, same_shape=False, roles=["dst", "on_true_tile"])
    return t


def bn_stats(data, *, mask=None, dtype=None, _dst=None, **kwargs):
    """Per partition (count, mean, variance x count) of the even and of the odd elements: (P, 6)."""
    v = require_space(data, (SBUF, PSUM), "bn_stats", "data")
    t, d = _out(v, to_dtype(dtype) or torch.float32, dst=_dst, shape=(v.sizes[0], 6))
    issue("bn_stats", "bn_stats", d, [v], mask=mask, same_shape=False, roles=["dst", "data"])
    return t


def bn_aggr(data, *, mask=None, dtype=None, _dst=None, **kwargs):
    """(mean, variance) per partition from concatenated bn_stats results: (P, 2)."""
    v = require_space(data, (SBUF, PSUM), "bn_aggr", "data")
    if math.prod(v.sizes[1:]) % 3:
        raise ValueError(f"bn_aggr data must hold (count, mean, var*count) triples, got "
                         f"{math.prod(v.sizes[1:])} elements per partition")
    t, d = _out(v, to_dtype(dtype) or torch.float32, dst=_dst, shape=(v.sizes[0], 2))
    issue("bn_aggr", "bn_aggr", d, [v], mask=mask, same_shape=False, roles=["dst", "data"])
    return t


def dropout(data, prob, *, mask=None, dtype=None, **kwargs):
    """Zeroes each element with probability ``prob`` (a constant or a (P, 1) tile)."""
    v = require_space(data, (SBUF, PSUM), "dropout", "data")
    r = new_tile(_dst_shape(v), torch.float32)
    issue("random", "dropout", nl._as_shape(r, v.sizes), ints=[current().program.num_instructions])
    keep = nl.greater_equal(r, prob, dtype=torch.float32) if not is_tile(prob) else \
        nl.greater_equal(r, as_view(prob).broadcast_to(v.sizes) if as_view(prob).sizes != v.sizes else prob,
                         dtype=torch.float32)
    return nl.multiply(v, keep, dtype=to_dtype(dtype) or v.tdtype, mask=mask)


def dma_copy(*, dst, src, mask=None, dst_rmw_op=None, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown, **kwargs):
    d, s = as_view(dst), as_view(src)
    if s.space == PSUM or d.space == PSUM:
        raise TypeError("dma_copy requires HBM or SBUF tensors, got a PSUM tensor")
    if math.prod(d.sizes) != math.prod(s.sizes):
        raise ValueError(f"dma_copy requires src and dst to have the same number of elements, got "
                         f"src={math.prod(s.sizes)}, dst={math.prod(d.sizes)}")
    if s.sizes != d.sizes:  # the same elements in another shape: the HBM side takes the on-chip side's
        if d.space == HBM and s.space != HBM and d.indirect is None:
            d = d.reshape(s.sizes)
        else:
            s = s.reshape(d.sizes)
    skip = int(oob_mode) == int(globals()["oob_mode"].skip)
    if dst_rmw_op is not None and nl._op_name(dst_rmw_op) != "add":
        raise ValueError("dma_copy dst_rmw_op supports only np.add")
    issue("copy", "dma_copy", d, [s], mask=mask, roles=["dst", "src"], oob_skip=skip,
          accumulate=dst_rmw_op is not None)


def dma_transpose(src, *, axes=None, mask=None, dtype=None, _dst=None, **kwargs):
    v = as_view(src)
    nd = len(v.sizes)
    axes = tuple(axes) if axes is not None else {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}.get(nd)
    if axes is None:
        raise ValueError(f"dma_transpose takes 2-4 dimensional tensors, got {nd}")
    from .._tensor import View
    p = View(v.tensor, [v.sizes[a] for a in axes], v.consts, [tuple(c[a] for a in axes) for c in v.coeffs],
             dynamic=v.dynamic)
    t, d = _out(p, dtype, dst=_dst)
    issue("copy", "dma_transpose", d, [p], mask=mask, roles=["dst", "src"])
    return t


def max8(*, src, mask=None, dtype=None, _dst=None, **kwargs):
    """The 8 largest values of each partition, in descending order: (P, 8)."""
    v = require_space(src, (SBUF, PSUM), "max8", "src")
    t, d = _out(v, dtype, dst=_dst, shape=(v.sizes[0], 8))
    issue("max8", "max8", d, [v], mask=mask, same_shape=False, roles=["dst", "src"])
    return t


def nc_find_index8(*, data, vals, mask=None, dtype=None, _dst=None, **kwargs):
    """Per partition, the index of the first occurrence in ``data`` of each of the 8 ``vals``: (P, 8) uint32."""
    v = require_space(data, (SBUF, PSUM), "nc_find_index8", "data")
    w = require_space(vals, (SBUF, PSUM), "nc_find_index8", "vals")
    t, d = _out(v, to_dtype(dtype) or torch.uint32, dst=_dst, shape=(v.sizes[0], 8))
    issue("find_index8", "nc_find_index8", d, [v, w], mask=mask, same_shape=False, roles=["dst", "data", "vals"])
    return t


def _where_into(name, d, predicate, on_true, on_false, reverse_pred, mask=None):
    """d = predicate ? on_true : on_false (tiles or constants; the predicate is nonzero = true)."""
    p = require_space(predicate, (SBUF, PSUM), name, "predicate")
    a, b = (on_false, on_true) if reverse_pred else (on_true, on_false)
    srcs, ints, scalars = [nl._broadcast(p, d.sizes)], [], []
    for o in (a, b):
        if is_tile(o):
            srcs.append(nl._broadcast(o, d.sizes))  # a (P, 1) operand is broadcast along the free dims
            ints.append(1)
            scalars.append(0.0)
        else:
            ints.append(0)
            scalars.append(float(o))
    issue("where", name, d, srcs, ints=ints, scalars=scalars, mask=mask)


def tensor_copy_predicated(*, src, dst, predicate, reverse_pred=False, mask=None, dtype=None, **kwargs):
    """``dst[x] = src[x]`` where ``predicate[x]`` is true (false with ``reverse_pred``); src may be a number."""
    d = require_space(dst, (SBUF, PSUM), "tensor_copy_predicated", "dst")
    _where_into("tensor_copy_predicated", d, predicate, src, d, reverse_pred, mask)


def select_reduce(*, dst, predicate, on_true, on_false, reduce_res=None, reduce_cmd=reduce_cmd.idle,
                  reduce_op=np.amax, reverse_pred=False, mask=None, dtype=None, **kwargs):
    """``dst = predicate ? on_true : on_false``, and optionally ``reduce_res = reduce_op(dst)`` over the free dims."""
    d = require_space(dst, (SBUF, PSUM), "select_reduce", "dst")
    _where_into("select_reduce", d, predicate, on_true, on_false, reverse_pred, mask)
    _reduce_registers("select_reduce", d, reduce_res, reduce_op, reduce_cmd)


def _reduce_registers(name, d, reduce_res, reduce_op, cmd):
    """The Vector Engine's reduction of ``d`` along its free dims into its registers under ``cmd``
    (``reduce_res`` receives them; idle: ``reduce_res`` gets this reduction alone)."""
    cmd = _cmd(cmd)
    if reduce_res is None and cmd == 0:
        return
    srcs, roles = [d], ["dst", "data"]
    if reduce_res is not None:
        srcs.append(require_space(reduce_res, (SBUF, PSUM), name, "reduce_res"))
        roles.append("reduce_res")
    issue("tensor_scalar", name, d, srcs, fns=["bypass", "", _op(reduce_op)], scalars=[0.0, 0.0, 0.0],
          ints=[0, 0, 0, 0, int(reduce_res is not None), cmd, 0, 0], same_shape=False, roles=roles)


def tensor_scalar_cumulative(*, src, dst, op0, op1, imm0, imm1=None, reduce_cmd=reduce_cmd.reset_reduce, mask=None,
                             **kwargs):
    """A running reduction along each partition's free elements on the Vector Engine's accumulator:
    ``acc = acc op1 (src[i] op0 imm0); dst[i] = acc``. ``reduce_cmd`` starts ``acc`` at op1's identity
    (``reset_reduce``), at ``imm1`` (``load_reduce``) or where the previous such instruction left it
    (``reduce``). ``imm0``/``imm1`` are constants or (P, 1) tiles."""
    v = require_space(src, (SBUF, PSUM), "tensor_scalar_cumulative", "src")
    d = require_space(dst, (SBUF, PSUM), "tensor_scalar_cumulative", "dst")
    srcs, roles, ints, scalars = [v], ["dst", "src"], [0, 0, int(reduce_cmd)], [0.0, 0.0]
    for i, (imm, role) in enumerate(((imm0, "imm0"), (imm1, "imm1"))):
        if is_tile(imm):
            srcs.append(_pp(imm, role, "tensor_scalar_cumulative"))
            roles.append(role)
            ints[i] = 1
        elif imm is not None:
            scalars[i] = float(imm)
    issue("cumulative", "tensor_scalar_cumulative", d, srcs, fns=[_op(op0), _op(op1)], scalars=scalars, ints=ints,
          mask=mask, same_shape=False, roles=roles)


def range_select(*, on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd=reduce_cmd.idle, reduce_res=None,
                 reduce_op=np.amax, range_start=0, on_false_value=-3.4028234663852886e38, mask=None, dtype=None,
                 _dst=None, **kwargs):
    """``out = on_true_tile`` where ``comp_op0(i, bound0) & comp_op1(i, bound1)`` for the free index
    ``i = range_start + position``, else ``on_false_value``; optionally ``reduce_res = reduce_op(out)``."""
    v = require_space(on_true_tile, (SBUF, PSUM), "range_select", "on_true_tile")
    P, F = v.sizes[0], math.prod(v.sizes[1:])
    idx = new_tile((P, F), torch.float32)
    issue("const", "range_select", idx.view_all(),
          constant=(float(range_start) + torch.arange(F, dtype=torch.float32)).expand(P, F).contiguous())
    keep = nl.logical_and(tensor_scalar(idx, comp_op0, bound0), tensor_scalar(idx, comp_op1, bound1),
                          dtype=torch.float32)
    t, d = _out(v, dtype, dst=_dst)
    issue("where", "range_select", d, [nl._broadcast(keep, d.sizes) if keep.shape != tuple(d.sizes) else
                                       as_view(keep), v], ints=[1, 0], scalars=[0.0, float(on_false_value)],
          mask=mask)
    _reduce_registers("range_select", d, reduce_res, reduce_op, reduce_cmd)
    return t


from .gpsimd import (  # noqa: E402,F401 - instructions defined in their own module
    local_gather, nc_match_replace8, nc_stream_shuffle, sequence_bounds, tensor_copy_dynamic_dst,
    tensor_copy_dynamic_src)
