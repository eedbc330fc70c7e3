"""``nki.language`` (``nl``) of the Gen-1 API (``neuronxcc.nki.language``):
tensors, memory, indexing, loops, SPMD, and the tile-level math that the
compiler lowers onto the engines' instructions (``nki.isa``)."""
from __future__ import annotations

import builtins
import math
import os

import numpy as np
import torch

from . import _emit, _loops
from ._emit import current, issue, new_tensor, new_tile, require_space, result_dtype
from ._index import DynSlice, IndexExpr, Mask, arange, ds, mgrid  # noqa: F401
from ._spmd_reduce import all_reduce  # noqa: F401
from ._tensor import (HBM, PSUM, SBUF, MemorySpace, NkiTensor, View, as_view, is_tile, nki_dtype,  # noqa: F401
                      packed_dtype, par_dim, to_dtype)

# -- dtypes: NumPy dtypes (ml_dtypes for bf16/fp8), as in neuronxcc, so test code can
# write ``np.zeros(shape, dtype=nl.float16)``; the core stores them as torch dtypes.
float32 = np.dtype(np.float32)
float16 = np.dtype(np.float16)
bfloat16 = nki_dtype(torch.bfloat16)
tfloat32 = np.dtype("V4")  # an opaque 4-byte type, stored as fp32 (tf32 rounding of matmul inputs not modelled)
float8_e4m3 = nki_dtype(torch.float8_e4m3fnuz)  # OCP e4m3 (see _dtypes.E4M3)
float8_e5m2 = nki_dtype(torch.float8_e5m2)
float8_e8m0fnu = np.dtype("float8_e8m0fnu") if "float8_e8m0fnu" in np.sctypeDict else torch.float8_e8m0fnu
float8_e4m3fn_x4, float8_e5m2_x4, float4_e2m1fn_x4 = (
    packed_dtype(n) for n in ("float8_e4m3fn_x4", "float8_e5m2_x4", "float4_e2m1fn_x4"))
int8, int16, int32 = np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.int32)
uint8, uint16, uint32 = np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.uint32)
bool_ = np.dtype(np.bool_)

# -- memories ----------------------------------------------------------------
sbuf = MemorySpace("sbuf", SBUF)
psum = MemorySpace("psum", PSUM)
hbm = MemorySpace("hbm", HBM)
private_hbm = MemorySpace("private_hbm", HBM)
shared_hbm = MemorySpace("shared_hbm", HBM)


class tile_size:
    """Hardware tile limits (elements)."""
    pmax = 128
    psum_fmax = 512
    psum_bank_fmax = 512
    psum_num_banks = 8
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512
    psum_min_align = 4
    sbuf_min_align = 1
    total_available_sbuf_size = 192 * 1024


class _FloatLimits:
    def __init__(self, lo, hi):
        self.min, self.max = lo, hi


fp32 = _FloatLimits(-3.4028234663852886e38, 3.4028234663852886e38)
bfp16 = _FloatLimits(-3.3895313892515355e38, 3.3895313892515355e38)


def finfo(dtype):
    fi = torch.finfo(to_dtype(dtype))
    return _FloatLimits(fi.min, fi.max)


# -- creation ------------------------------------------------------------------
def ndarray(shape, dtype, *, buffer=None, name="", **kwargs):
    """A new tensor; on-chip tiles start as NaN (floats) / 4 (ints), as uninitialised memory shows."""
    return new_tensor(shape, dtype, buffer, name)


def _filled(shape, value, dtype, buffer, name):
    if getattr(buffer, "space", SBUF) == HBM:
        raise ValueError("Creating HBM tensor with init value is not supported.")
    t = new_tensor(shape, dtype, buffer, name)
    if t.partition_axis == 0:
        issue("fill", "memset", t.view_all(), scalars=[value])
    else:
        for idx in np.ndindex(*t.shape[:t.partition_axis]):
            issue("fill", "memset", t[idx], scalars=[value])
    return t


def zeros(shape, dtype, *, buffer=None, name="", **kwargs):
    return _filled(shape, 0.0, dtype, buffer, name)


def ones(shape, dtype, *, buffer=None, name="", **kwargs):
    return _filled(shape, 1.0, dtype, buffer, name)


def full(shape, fill_value, dtype, *, buffer=None, name="", **kwargs):
    return _filled(shape, float(fill_value), dtype, buffer, name)


def zeros_like(a, dtype=None, *, buffer=None, name="", **kwargs):
    return zeros(a.shape, dtype or a.tdtype, buffer=buffer or _buffer_of(a), name=name)


def empty_like(a, dtype=None, *, buffer=None, name="", **kwargs):
    return ndarray(a.shape, dtype or a.tdtype, buffer=buffer or _buffer_of(a), name=name)


def _buffer_of(a):
    return {SBUF: sbuf, PSUM: psum, HBM: hbm}[as_view(a).space]


def shared_constant(constant, dtype=None, **kwargs):
    """An HBM tensor holding a host constant (a NumPy array, or the path of a ``.npy`` file)."""
    if isinstance(constant, (str, os.PathLike)):
        constant = np.load(constant)
    arr = np.asarray(constant)
    dt = to_dtype(dtype) if dtype is not None else to_dtype(arr.dtype)
    t = new_tensor(arr.shape, dt, shared_hbm, "constant")
    issue("const", "shared_constant", t.view_all(), constant=torch.from_numpy(np.ascontiguousarray(arr)).to(dt))
    return t


def shared_identity_matrix(n, dtype=np.uint8, **kwargs):
    """An n×n identity matrix in shared HBM (kernels ``nl.load`` it)."""
    return shared_constant(np.eye(n), dtype=dtype)


# -- memory movement -------------------------------------------------------------
def load(src, *, mask=None, dtype=None, **kwargs):
    """HBM → a new SBUF tile of the access's shape (at least 2-D: a scalar loads as (1, 1))."""
    v = require_space(src, (HBM,), "load", "src")
    shape = _tile_shape(v.sizes)
    t = new_tile(shape, to_dtype(dtype) or v.tdtype)
    issue("copy", "load", t.view_all(), [_padded(v, shape)], mask=mask, roles=["dst", "src"])
    return t


def _padded(v, shape):
    """An access with trailing size-1 dims added to reach ``shape`` ((N,) as (N, 1), () as (1, 1))."""
    if len(v.sizes) >= len(shape):
        return v
    extra = len(shape) - len(v.sizes)
    return View(v.tensor, tuple(v.sizes) + (1,) * extra, v.consts, [tuple(c) + (0,) * extra for c in v.coeffs],
                v.indirect, v.dynamic)


def store(dst, value, *, mask=None, **kwargs):
    """A tile (or scalar) → HBM."""
    d = require_space(dst, (HBM,), "store", "dst")
    if not is_tile(value):
        issue("fill", "store", d, scalars=[float(value)], mask=mask)
        return
    v = as_view(value)
    if v.space == HBM:
        raise TypeError("Expected operand 'value' of 'store' to be in address space 'sbuf|psum', "
                        "but got a tile in 'hbm' instead.")
    if mask is None and isinstance(value, NkiTensor) and getattr(value, "_mask", None) is not None:
        mask = value._mask
        if mask is False:
            return
    if len(d.sizes) < 2 <= len(v.sizes) and math.prod(d.sizes) == math.prod(v.sizes):
        d = _padded(d, v.sizes)  # a (1, 1) tile into a scalar, (N, 1) into (N,)
    issue("copy", "store", d, [_broadcast(v, d.sizes)], mask=mask, roles=["dst", "value"])


def atomic_rmw(dst, value, op, *, mask=None, **kwargs):
    """``dst = op(dst, value)`` on HBM rows chosen by an index tile (``op`` must be np.add)."""
    from . import isa
    isa.dma_copy(dst=dst, src=value, dst_rmw_op=op, mask=mask)


def load_transpose2d(src, *, mask=None, dtype=None, **kwargs):
    v = require_space(src, (HBM,), "load_transpose2d", "src").transposed()
    t = new_tile(v.sizes, to_dtype(dtype) or v.tdtype)
    issue("copy", "load_transpose2d", t.view_all(), [v], mask=mask, roles=["dst", "src"])
    return t


def copy(src, *, mask=None, dtype=None, **kwargs):
    v = require_space(src, (SBUF, PSUM), "copy", "src")
    t = new_tile(v.sizes, to_dtype(dtype) or v.tdtype)
    issue("copy", "tensor_copy", t.view_all(), [v], mask=mask, roles=["dst", "src"])
    return t


def _tile_shape(sizes):
    return tuple(sizes) if len(sizes) >= 2 else (tuple(sizes) + (1,) if sizes else (1, 1))


def _as_shape(t, sizes):
    v = t.view_all()
    return v if tuple(v.sizes) == tuple(sizes) else v.reshape(sizes)


def _broadcast(v, sizes):
    v = as_view(v)
    if tuple(v.sizes) == tuple(sizes):
        return v
    if math.prod(v.sizes) == math.prod(sizes) and len(v.sizes) != len(sizes):
        return v.reshape(sizes)
    return v.broadcast_to(sizes)


class _LoopReduced:
    """``nl.loop_reduce``'s result: assigning it reduces into the destination across the loop."""

    def __init__(self, x, op, dtype, mask):
        self.x, self.op, self.dtype, self.mask = x, op, dtype, mask


def loop_reduce(x, op, loop_indices, *, dtype=None, mask=None, **kwargs):
    """``dst[...] = nl.loop_reduce(x, op, loop_indices)`` makes ``dst = op(dst, x)`` in every
    iteration of the named loops (unrolled here), so ``dst`` ends as their reduction."""
    return _LoopReduced(x, _op_name(op), dtype, mask)


def _into(dst, value, mask=None, sole=False):
    """``dst[...] = value``: a copy (or fill) into an existing tensor's access; when ``value`` is
    an instruction's result that nothing else references (``sole``), that instruction writes
    ``dst`` directly."""
    d = as_view(dst)
    if value is d:
        return
    if isinstance(value, View) and (value.tensor, value.sizes, value.consts, value.coeffs, value.indirect) == (
            d.tensor, d.sizes, d.consts, d.coeffs, d.indirect):
        return  # x[i] += y assigns x[i] to itself
    if sole and mask is None and isinstance(value, NkiTensor) and _emit.retarget(d, value):
        return
    if isinstance(value, _LoopReduced):
        _update(d, value.op, value.x, mask=value.mask if mask is None else mask)
        return
    if not is_tile(value):
        issue("fill", "memset", d, scalars=[float(value)], mask=mask)
        return
    v = as_view(value)
    if mask is None and isinstance(value, NkiTensor) and getattr(value, "_mask", None) is not None:
        mask = value._mask
        if mask is False:
            return
    if math.prod(v.sizes) > math.prod(d.sizes) and v.sizes != d.sizes:
        raise ValueError(f"Illegal assignment destination shape: shape {list(d.sizes)} is smaller than "
                         f"the value's shape {list(v.sizes)}")
    if d.space == HBM and len(d.sizes) < 2 <= len(v.sizes) and math.prod(d.sizes) == math.prod(v.sizes):
        d = _padded(d, v.sizes)
    elif v.space == HBM and len(v.sizes) < 2 <= len(d.sizes) and math.prod(d.sizes) == math.prod(v.sizes):
        v = _padded(v, d.sizes)
    name = "store" if d.space == HBM else ("load" if v.space == HBM else "tensor_copy")
    issue("copy", name, d, [_broadcast(v, d.sizes)], mask=mask, roles=["dst", "src"])


def _update(dst, op, value, mask=None, sole=False):
    """``dst op= value`` in place; ``psum += nc_matmul(...)`` is the Tensor Engine's accumulation
    (the matmul adds into ``dst`` itself when its result is held by nothing else: ``sole``)."""
    d = as_view(dst)
    vt = value if isinstance(value, NkiTensor) else getattr(value, "tensor", None)
    if mask is None and vt is not None and getattr(vt, "_mask", None) is not None:
        mask = vt._mask  # a result made under a mask: only what was computed is added
        if mask is False:
            return
    if (sole and op == "add" and d.space == PSUM and is_tile(value) and as_view(value).space == PSUM
            and _emit.retarget(d, value, accumulate=_emit.was_written(d))):
        return
    if not is_tile(value):
        issue("tensor_scalar", "tensor_scalar", d, [d], fns=[op, "", ""], scalars=[float(value), 0.0],
              ints=[0, 0, 0, 0, 0], roles=["dst", "data"], mask=mask)
        return
    v = _broadcast(value, d.sizes)
    accumulate = int(op == "add" and d.space == PSUM and v.space == PSUM)
    if accumulate and not _emit.was_written(d):
        # the first accumulation into a PSUM region overwrites it (as the Tensor Engine does)
        issue("copy", "nc_matmul", d, [v], roles=["dst", "data"], mask=mask)
        return
    issue("tensor_tensor", "nc_matmul" if accumulate else "tensor_tensor", d, [d, v], fns=[op], ints=[accumulate],
          roles=["dst", "data1", "data2"], mask=mask)


# -- loops and SPMD ---------------------------------------------------------------
def affine_range(*args, **kwargs):
    """A loop whose iterations are independent (run per iteration when traced; NKI traces the
    body once, which matters to manual allocation: see ``_loops``)."""
    return _loops.SymbolicRange(range(*[int(a) for a in args]), affine=True)


def sequential_range(*args, **kwargs):
    """A loop whose iterations depend on each other (traced like ``affine_range``)."""
    return _loops.SymbolicRange(range(*[int(a) for a in args]), affine=False)


def static_range(*args, **kwargs):
    """A loop unrolled by the tracer: its body's Python runs per iteration, as in NKI."""
    return range(*[int(a) for a in args])


def program_id(axis=0):
    tr = current()
    if axis >= len(tr.program_id):
        if not tr.program_id and axis == 0:
            return 0
        raise ValueError(f"program_id({axis}): the launch grid has {len(tr.program_id)} dimensions")
    return tr.program_id[axis]


def num_programs(axes=None):
    tr = current()
    if axes is None:
        return math.prod(tr.grid) if tr.grid else 1
    if isinstance(axes, (tuple, list)):
        return math.prod(tr.grid[a] for a in axes)
    return tr.grid[axes] if axes < len(tr.grid) else 1


def program_ndim():
    return len(current().grid)


class nc(int):
    """A logical NeuronCore grid dimension: ``kernel[nl.nc(2), n]`` (instances run as two cores)."""

    def __new__(cls, n):
        return super().__new__(cls, n)


def spmd_dim(*dims):
    return math.prod(int(d) for d in dims)


# -- math: how nl functions lower onto instructions --------------------------------
def _op_name(op):
    """The instruction-level name of an op given as an nl function, NumPy ufunc or string."""
    if isinstance(op, str):
        return op
    n = getattr(op, "_nki_op", None)
    if n is not None:
        return n
    n = getattr(op, "__name__", None)
    return _NUMPY_NAMES.get(n, n)


_NUMPY_NAMES = {"true_divide": "divide", "absolute": "abs", "amax": "maximum", "amin": "minimum", "max": "maximum",
                "min": "minimum", "sum": "add", "invert": "bitwise_not", "fabs": "abs", "arctan": "arctan",
                "negative": "negative", "copy": "copy", "prod": "multiply"}


def _unary(fn_name, x, dtype, mask, out_dtype=None):
    v = require_space(x, (SBUF, PSUM), fn_name, "x")
    dt = to_dtype(dtype) or out_dtype or v.tdtype
    t = new_tile(_tile_shape(v.sizes), dt)
    issue("activation", "activation", _as_shape(t, v.sizes), [v], fns=[fn_name], scalars=[1.0], ints=[0, 0, 0],
          mask=mask, roles=["dst", "data"])
    return t


def _binary(op, x, y, dtype, mask, out_dtype=None):
    xt, yt = is_tile(x), is_tile(y)
    if not xt and not yt:
        raise TypeError(f"nl.{op} needs at least one tile operand")
    dt = to_dtype(dtype) or out_dtype or result_dtype(x, y)
    if xt and yt:
        a = require_space(x, (SBUF, PSUM), op, "x")
        b = require_space(y, (SBUF, PSUM), op, "y")
        shape = _emit_shape(a.sizes, b.sizes)
        t = new_tile(_tile_shape(shape), dt)
        issue("tensor_tensor", "tensor_tensor", _as_shape(t, shape), [_broadcast(a, shape), _broadcast(b, shape)],
              fns=[op], mask=mask, roles=["dst", "data1", "data2"])
        return t
    tile, scalar, reverse = (x, y, 0) if xt else (y, x, 1)
    a = require_space(tile, (SBUF, PSUM), op, "x" if xt else "y")
    t = new_tile(_tile_shape(a.sizes), dt)
    issue("tensor_scalar", "tensor_scalar", _as_shape(t, a.sizes), [a], fns=[op, "", ""],
          scalars=[float(scalar), 0.0], ints=[reverse, 0, 0, 0, 0], mask=mask, roles=["dst", "data"])
    return t


def _emit_shape(a, b):
    try:
        return tuple(torch.broadcast_shapes(torch.Size(a), torch.Size(b)))
    except RuntimeError:
        raise ValueError(f"operand shapes {list(a)} and {list(b)} do not broadcast") from None


def _make_unary(name, fn=None):
    def f(x, *, dtype=None, mask=None, **kwargs):
        return _unary(fn or name, x, dtype, mask)
    f.__name__ = f.__qualname__ = name
    f._nki_op = fn or name
    f.__doc__ = f"``nl.{name}``: elementwise on the Scalar Engine (computed in fp32)."
    return f


def _make_binary(name, logical=False):
    def f(x, y, *, dtype=None, mask=None, **kwargs):
        if not is_tile(x) and not is_tile(y):
            return _PY_BINARY[name](x, y)
        out = torch.bool if logical else None
        if name == "divide" and dtype is None and not any(
                (as_view(v).tdtype.is_floating_point if is_tile(v) else isinstance(v, float)) for v in (x, y)):
            out = torch.float32  # true division, as numpy.divide (kernels floor the result themselves)
        return _binary(name, x, y, dtype, mask, out_dtype=out)
    f.__name__ = f.__qualname__ = name
    f._nki_op = name
    f.__doc__ = f"``nl.{name}``: elementwise on two tiles or a tile and a scalar (numpy broadcasting)."
    return f


import operator as _op  # noqa: E402

_PY_BINARY = {"add": _op.add, "subtract": _op.sub, "multiply": _op.mul, "divide": _op.truediv,
              "maximum": builtins.max, "minimum": builtins.min, "power": _op.pow, "mod": _op.mod,
              "fmod": math.fmod, "equal": _op.eq, "not_equal": _op.ne, "greater": _op.gt, "greater_equal": _op.ge,
              "less": _op.lt, "less_equal": _op.le, "logical_and": lambda a, b: a and b,
              "logical_or": lambda a, b: a or b, "logical_xor": lambda a, b: bool(a) != bool(b),
              "bitwise_and": _op.and_, "bitwise_or": _op.or_, "bitwise_xor": _op.xor, "left_shift": _op.lshift,
              "right_shift": _op.rshift}

for _n in ["add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "mod", "fmod", "bitwise_and",
           "bitwise_or", "bitwise_xor", "left_shift", "right_shift"]:
    globals()[_n] = _make_binary(_n)
for _n in ["equal", "not_equal", "greater", "greater_equal", "less", "less_equal", "logical_and", "logical_or",
           "logical_xor"]:
    globals()[_n] = _make_binary(_n, logical=True)
for _n in ["exp", "log", "tanh", "sigmoid", "relu", "gelu", "gelu_dx", "gelu_apprx_tanh", "gelu_apprx_sigmoid",
           "gelu_apprx_sigmoid_dx",
           "silu", "silu_dx", "erf", "erf_dx", "softplus", "mish", "sqrt", "rsqrt", "square", "reciprocal", "sin",
           "cos", "tan", "arctan", "sign", "ceil", "floor", "trunc", "negative", "abs"]:
    globals()[_n] = _make_unary(_n)
invert = _make_unary("invert", "bitwise_not")
logical_not = _make_unary("logical_not")


def abs_max(x, y, *, dtype=None, mask=None, **kwargs):
    return _binary("abs_max", x, y, dtype, mask)


# -- reductions ---------------------------------------------------------------------
def _axes(axis, ndim, suffix=False):
    """Reduced axes: free ones; the instruction (``suffix``) takes only the last ones."""
    axes = [axis] if isinstance(axis, int) else list(axis)
    axes = sorted(a % ndim for a in axes)
    if 0 in axes:
        raise ValueError("reductions run along free axes; axis 0 is the partition dimension "
                         "(transpose the tile, or use nki.isa.tensor_partition_reduce)")
    if suffix and axes != list(range(ndim - len(axes), ndim)):
        raise ValueError(f"reduction axes {axes} must be the last free axes of a {ndim}-D tile "
                         f"(e.g. [{ndim - 1}] or [1..{ndim - 1}])")
    return axes


def reduce_tile(op, x, axis, dtype, mask, keepdims, negate=False, name="tensor_reduce", dst=None, suffix=False):
    v = require_space(x, (SBUF, PSUM), name, "data")
    axes = _axes(axis, len(v.sizes), suffix)
    kept = [1 if d in axes else s for d, s in enumerate(v.sizes)]
    out_shape = kept if keepdims else [s for d, s in enumerate(v.sizes) if d not in axes]
    dt = to_dtype(dtype) or v.tdtype
    t = dst if dst is not None else new_tile(_tile_shape(out_shape), dt)
    issue("reduce", name, _as_shape(t, kept), [v], fns=[op], ints=[int(negate)] + axes, mask=mask, same_shape=False,
          roles=["dst", "data"])
    return t


def sum(x, axis, *, dtype=None, mask=None, keepdims=False, **kwargs):
    return reduce_tile("add", x, axis, dtype, mask, keepdims)


def max(x, axis, *, dtype=None, mask=None, keepdims=False, **kwargs):
    return reduce_tile("maximum", x, axis, dtype, mask, keepdims)


def min(x, axis, *, dtype=None, mask=None, keepdims=False, **kwargs):
    return reduce_tile("minimum", x, axis, dtype, mask, keepdims)


def prod(x, axis, *, dtype=None, mask=None, keepdims=False, **kwargs):
    return reduce_tile("multiply", x, axis, dtype, mask, keepdims)


sum._nki_op, max._nki_op, min._nki_op, prod._nki_op = "add", "maximum", "minimum", "multiply"


def mean(x, axis, *, dtype=None, mask=None, keepdims=False, **kwargs):
    v = as_view(x)
    n = math.prod(v.sizes[a] for a in _axes(axis, len(v.sizes)))
    dt = to_dtype(dtype) or (v.tdtype if v.tdtype.is_floating_point else torch.float32)
    s = reduce_tile("add", x, axis, torch.float32, mask, keepdims)
    return _binary("multiply", s, 1.0 / n, dt, None)


def var(x, axis, *, dtype=None, mask=None, keepdims=False, **kwargs):
    m = mean(x, axis, dtype=torch.float32, mask=mask, keepdims=True)
    d = subtract(x, m, dtype=torch.float32)
    return mean(multiply(d, d, dtype=torch.float32), axis, dtype=dtype, keepdims=keepdims)


def all(x, axis, *, dtype=torch.bool, mask=None, **kwargs):
    nz = not_equal(x, 0, dtype=torch.float32)
    return reduce_tile("minimum", nz, axis, dtype, mask, False)


# -- other compute -------------------------------------------------------------------
def where(condition, x, y, *, dtype=None, mask=None, **kwargs):
    c = as_view(condition)
    shape = tuple(c.sizes)
    for o in (x, y):
        if is_tile(o):
            shape = _emit_shape(shape, as_view(o).sizes)
    dt = to_dtype(dtype) or result_dtype(*[o for o in (x, y) if is_tile(o)] or [x])
    t = new_tile(_tile_shape(shape), dt)
    srcs, ints, scalars = [_broadcast(c, shape)], [], []
    for o in (x, y):
        if is_tile(o):
            srcs.append(_broadcast(o, shape))
            ints.append(1)
            scalars.append(0.0)
        else:
            ints.append(0)
            scalars.append(float(o))
    issue("where", "select", _as_shape(t, shape), srcs, ints=ints, scalars=scalars, mask=mask)
    return t


def matmul(x, y, *, transpose_x=False, mask=None, **kwargs):
    """``x @ y`` (``x.T @ y`` with ``transpose_x``) on the Tensor Engine, into a new PSUM tile."""
    from .isa import _to_sbuf
    a = require_space(_to_sbuf(x), (SBUF,), "matmul", "x")
    b = require_space(_to_sbuf(y), (SBUF,), "matmul", "y")
    stationary = a if transpose_x else a.transposed()
    m, n = stationary.sizes[1] if len(stationary.sizes) > 1 else 1, math.prod(b.sizes[1:])
    t = new_tile((m, n), torch.float32, PSUM)
    issue("matmul", "nc_matmul", t.view_all(), [stationary, b], ints=[0], mask=mask, same_shape=False,
          roles=["dst", "stationary", "moving"])
    return t


def transpose(x, *, dtype=None, mask=None, **kwargs):
    v = require_space(x, (SBUF, PSUM), "transpose", "x")
    if len(v.sizes) != 2:
        raise ValueError(f"parameter 'x{list(v.sizes)}' of 'transpose' exceed max supported number of dimensions of 2.")
    for d, s in enumerate(v.sizes):
        if s > 128:
            raise ValueError(f"size of dimension {d} in 'x{list(v.sizes)}' of 'transpose' exceed architecture "
                             f"limitation of 128.")
    vector = v.sizes[0] <= 32 and v.sizes[1] <= 32
    t = new_tile((v.sizes[1], v.sizes[0]), to_dtype(dtype) or v.tdtype, SBUF if vector else PSUM)
    src, d, mask = _emit.transpose_masked(v, t.view_all(), mask)
    if mask is not False:
        issue("transpose", "nc_transpose", d, [src], ints=[1 if vector else 0], same_shape=False,
              roles=["dst", "data"])
    return t


def softmax(x, axis, *, dtype=None, compute_dtype=None, mask=None, **kwargs):
    m = max(x, axis, dtype=torch.float32, mask=mask, keepdims=True)
    e = exp(subtract(x, m, dtype=torch.float32, mask=mask), dtype=torch.float32, mask=mask)
    s = sum(e, axis, dtype=torch.float32, mask=mask, keepdims=True)
    return divide(e, s, dtype=to_dtype(dtype) or as_view(x).tdtype, mask=mask)


def rms_norm(x, w, axis, n, epsilon=1e-06, *, dtype=None, compute_dtype=None, mask=None, **kwargs):
    sq = square(x, dtype=torch.float32, mask=mask)
    ms = multiply(sum(sq, axis, dtype=torch.float32, mask=mask, keepdims=True), 1.0 / n, dtype=torch.float32)
    r = rsqrt(add(ms, float(epsilon), dtype=torch.float32))
    return multiply(multiply(x, r, dtype=torch.float32), w, dtype=to_dtype(dtype) or as_view(x).tdtype, mask=mask)


def gather_flattened(data, indices, *, mask=None, dtype=None, **kwargs):
    """``out[p, k] = data[p, indices[p, k]]``, indexing each partition's flattened free elements."""
    d = require_space(data, (SBUF, PSUM), "gather_flattened", "data")
    i = require_space(indices, (SBUF,), "gather_flattened", "indices")
    t = new_tile(_tile_shape(i.sizes), to_dtype(dtype) or d.tdtype)
    issue("gather", "gather_flattened", _as_shape(t, i.sizes), [d, i], mask=mask, same_shape=False,
          roles=["dst", "data", "indices"])
    return t


def broadcast_to(src, *, shape=None, **kwargs):
    v = as_view(src)
    t = new_tile(tuple(shape), v.tdtype)
    issue("copy", "tensor_copy", t.view_all(), [v.broadcast_to(tuple(shape))], roles=["dst", "src"])
    return t


def expand_dims(data, axis):
    v = as_view(data)
    axis = axis % (len(v.sizes) + 1)
    return v.reshape(v.sizes[:axis] + (1,) + v.sizes[axis:])


def dropout(x, rate, *, dtype=None, mask=None, **kwargs):
    from . import isa
    return isa.dropout(x, rate, dtype=dtype, mask=mask)


def rand(shape, dtype=torch.float32, **kwargs):
    t = new_tile(tuple(shape), to_dtype(dtype))
    tr = current()
    issue("random", "rand", t.view_all(), ints=[tr.program.num_instructions])
    return t


def random_seed(seed, *, mask=None, **kwargs):
    """Seeds the core's generator: random instructions after it give the same values for the same
    seed (without it, each launch draws new values)."""
    if is_tile(seed):
        raise TypeError("nl.random_seed takes an integer seed here (a seed tile is not supported)")
    current().program.emit("seed", "random_seed", [], [], [], [int(seed) & 0xFFFFFFFF], None, None, "")


def device_print(prefix, x, *, mask=None, **kwargs):
    """Prints ``prefix`` and the values of ``x`` (a tile or an HBM tensor) when the kernel runs, at
    this point of the program."""
    if not is_tile(x):
        print(prefix, x)
        return
    v = as_view(x)
    issue("print", "device_print", v if len(v.sizes) >= 2 else _padded(v, _tile_shape(v.sizes)), fns=[str(prefix)],
          roles=["x"])


def static_cast(value, dtype):
    """Host-side cast of a scalar or array to an NKI dtype (``nl.bfloat16`` gives an ml_dtypes
    bfloat16 array); on a tile inside a kernel, a copy converting to ``dtype``."""
    if is_tile(value):
        return copy(value, dtype=dtype)
    return np.asarray(value).astype(nki_dtype(to_dtype(dtype)))
