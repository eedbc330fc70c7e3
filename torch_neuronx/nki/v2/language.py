"""``nki.language`` of the Gen-2 API: the Gen-1 functions without ``mask=``
(and with positional ``buffer``), plus the 0.6 additions."""
from __future__ import annotations

import math

import numpy as np

from .. import language as _g1
from .._emit import issue, new_tensor
from .._tensor import HBM
from ..language import (  # noqa: F401
    abs, add, arctan, bfloat16, bitwise_and, bitwise_or, bitwise_xor, bool_, ceil, copy, cos, divide,
    ds, empty_like, equal, erf, erf_dx, exp, expand_dims, float8_e4m3, float8_e5m2, float16, float32, floor, fmod,
    gelu, gelu_apprx_sigmoid, gelu_apprx_tanh, gelu_dx, greater, greater_equal, hbm, int8, int16, int32, invert,
    left_shift, less, less_equal, load, load_transpose2d, log, logical_and, logical_not, logical_or, logical_xor,
    matmul, max, maximum, mean, min, minimum, mish, mod, multiply, negative, not_equal, num_programs, power, private_hbm,
    prod, program_id, program_ndim, psum, rand, random_seed, reciprocal, relu, right_shift, rsqrt, sbuf, shared_hbm,
    sigmoid, sign, silu, silu_dx, sin, softmax, softplus, sqrt, square, store, subtract, sum, tan, tanh, tfloat32,
    tile_size, transpose, trunc, uint8, uint16, uint32, where, abs_max, all, var, rms_norm, dropout, device_print,
    shared_constant, shared_identity_matrix)
from ..language import nki_dtype as _nki_dtype

import torch as _torch

float8_e4m3fn = np.dtype("float8_e4m3fn") if "float8_e4m3fn" in np.sctypeDict else _nki_dtype(_torch.float8_e4m3fn)
bypass = "bypass"
prelu = "prelu"
average = "average"


def abs_min(x, y, dtype=None):
    return _g1._binary("abs_min", x, y, dtype, None)


def broadcast_to(x, shape, dtype=None):
    """A new SBUF tile of ``shape`` holding ``x`` broadcast (NumPy rules)."""
    t = _g1.broadcast_to(x, shape=shape)
    return t if dtype is None else _g1.copy(t, dtype=dtype)


def ndarray(shape, dtype, buffer=sbuf, name="", address=None):
    """A new tensor (on-chip memory is uninitialised: NaN / 4 here). ``address`` placement is
    taken by the simulator's own allocator, which checks the same capacity."""
    return new_tensor(shape, dtype, buffer, name)


def zeros(shape, dtype, buffer=sbuf, name=""):
    return _g1.zeros(shape, dtype, buffer=buffer, name=name)


def ones(shape, dtype, buffer=sbuf, name=""):
    return _g1.ones(shape, dtype, buffer=buffer, name=name)


def full(shape, fill_value, dtype, buffer=sbuf, name=""):
    return _g1.full(shape, fill_value, dtype, buffer=buffer, name=name)


def zeros_like(x, dtype=None, buffer=None, name=""):
    return _g1.zeros_like(x, dtype, buffer=buffer, name=name)


def affine_range(start, stop=None, step=1):
    return range(start, stop, step) if stop is not None else range(start)


sequential_range = static_range = affine_range


def is_hbm(buffer):
    return getattr(buffer, "space", None) == HBM


def is_psum(buffer):
    return buffer is psum


def is_sbuf(buffer):
    return buffer is sbuf


def is_on_chip(buffer):
    return buffer is sbuf or buffer is psum


class NKIObject:
    """Base class of user dataclasses passed to kernels (plain Python objects here)."""
