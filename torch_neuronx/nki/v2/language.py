"""``nki.language`` of the Gen-2 API: the Gen-1 functions without ``mask=``
(and with positional ``buffer``), plus the 0.6 additions."""
from __future__ import annotations

import builtins as _builtins
import math

import numpy as np

from .. import language as _g1
from .._emit import issue, new_tensor
from .._tensor import HBM, PSUM as _PSUM, SBUF as _SBUF, as_view as _as_view
from ..language import (  # noqa: F401
    abs, add, arctan, bfloat16, bitwise_and, bitwise_or, bitwise_xor, bool_, ceil, copy, cos, divide,
    ds, empty_like, equal, erf, erf_dx, exp, expand_dims, float8_e4m3, float8_e5m2, float16, float32, floor, fmod,
    gelu, gelu_apprx_sigmoid, gelu_apprx_sigmoid_dx, gelu_apprx_tanh, gelu_dx, greater, greater_equal, hbm, int8, int16, int32, invert,
    left_shift, less, less_equal, load, load_transpose2d, log, logical_and, logical_not, logical_or, logical_xor,
    matmul, max, maximum, mean, min, minimum, mish, mod, multiply, negative, not_equal, num_programs, power, private_hbm,
    prod, program_id, program_ndim, psum, rand, random_seed, reciprocal, relu, right_shift, rsqrt, sbuf, shared_hbm,
    sigmoid, sign, silu, silu_dx, sin, softmax, softplus, sqrt, square, store, subtract, sum, tan, tanh, tfloat32,
    tile_size, transpose, trunc, uint8, uint16, uint32, where, abs_max, all, var, rms_norm, dropout, device_print,
    shared_constant, float8_e8m0fnu, float8_e4m3fn_x4, float8_e5m2_x4, float4_e2m1fn_x4)
from ..language import nki_dtype as _nki_dtype
from .._registers import dynamic_range, fori_loop, while_loop  # noqa: F401
from ..language import gather_flattened  # noqa: F401


class no_reorder:  # noqa: N801 - NKI's name
    """``with nl.no_reorder():`` keeps the block's instructions in program order. The simulated
    NeuronCore runs every instruction in program order, so the block needs nothing more; dynamic
    loops inside it are rejected, as by NKI."""

    def __enter__(self):
        from .._emit import current
        tr = current()
        tr.__dict__["_no_reorder"] = tr.__dict__.get("_no_reorder", 0) + 1
        return self

    def __exit__(self, *exc):
        from .._emit import current
        current().__dict__["_no_reorder"] -= 1
        return False

import torch as _torch

float8_e4m3fn = _nki_dtype(_torch.float8_e4m3fn)
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
    """A new tensor (on-chip memory is uninitialised: NaN / 4 here). ``address=(partition, byte)``
    places an SBUF/PSUM tensor there (PSUM: ``byte = bank * 2048 + offset``) instead of letting
    the allocator choose; tensors placed at the same address share memory, as on hardware."""
    if address is not None:
        if getattr(buffer, "space", None) not in (_SBUF, _PSUM):
            raise ValueError(f"address= places SBUF or PSUM tensors, not {buffer!r}")
        part, byte = (int(a) for a in address)
        bank = 0
        if buffer.space == _PSUM:
            bank, byte = divmod(byte, _bank_bytes())
        space = buffer.space
        buffer = buffer.alloc(lambda idx, pdim_size, fdim_size: (part, byte) if space == _SBUF else (bank, part, byte))
    return new_tensor(shape, dtype, buffer, name)


def _bank_bytes():
    from .._emit import current
    return current().psum_bank_bytes


def shared_identity_matrix(n, dtype=uint8, dst=None):
    """An n×n identity matrix in SBUF (Gen-2; Gen-1's lives in shared HBM)."""
    if dst is None:
        dst = ndarray((n, n), dtype, buffer=sbuf)
    d = _as_view(dst)
    issue("const", "shared_identity_matrix", d, constant=_torch.eye(n, dtype=d.tdtype))
    return dst


def zeros(shape, dtype, buffer=sbuf, name=""):
    return _g1.zeros(shape, dtype, buffer=buffer, name=name)


def ones(shape, dtype, buffer=sbuf, name=""):
    return _g1.ones(shape, dtype, buffer=buffer, name=name)


def full(shape, fill_value, dtype, buffer=sbuf, name=""):
    return _g1.full(shape, fill_value, dtype, buffer=buffer, name=name)


def zeros_like(x, dtype=None, buffer=None, name=""):
    return _g1.zeros_like(x, dtype, buffer=buffer, name=name)


def affine_range(start, stop=None, step=1):
    """An alias of ``range`` in NKI 0.6 (unrolled at trace time; ``static_range`` is preferred)."""
    return _builtins.range(start, stop, step) if stop is not None else _builtins.range(start)


sequential_range = static_range = affine_range
range = affine_range  # noqa: A001 - nl.range, as the NKI library writes it
bool = bool_  # noqa: A001 - nl.bool, as the NKI library writes it


def is_hbm(buffer):
    return getattr(buffer, "space", None) == HBM


def is_psum(buffer):
    return buffer is psum


def is_sbuf(buffer):
    return buffer is sbuf


def is_on_chip(buffer):
    return buffer is sbuf or buffer is psum


class _NKIObjectType(type):
    """NKI's frontend builds an ``NKIObject`` from keyword arguments naming its attributes, even
    where Python's ``@dataclass`` made no such parameter (unannotated class attributes) or one
    is left out: constructed the same way here when the ordinary call does not fit."""

    def __call__(cls, *args, **kwargs):
        import dataclasses
        import inspect
        try:
            if cls.__init__ is object.__init__ and (args or kwargs):
                raise TypeError
            inspect.signature(cls.__init__).bind(None, *args, **kwargs)
        except TypeError:
            obj = cls.__new__(cls)
            fields = list(getattr(cls, "__dataclass_fields__", {}).values())
            for f in fields:
                if f.default is not dataclasses.MISSING:
                    setattr(obj, f.name, f.default)
                elif f.default_factory is not dataclasses.MISSING:
                    setattr(obj, f.name, f.default_factory())
                else:
                    setattr(obj, f.name, None)
            names = [f.name for f in fields] or list(getattr(cls, "__annotations__", {}))
            if len(args) > len(names):
                raise TypeError(f"{cls.__name__}() takes {len(names)} positional arguments, got {len(args)}") from None
            for name, value in [*zip(names, args), *kwargs.items()]:
                setattr(obj, name, value)
            if hasattr(obj, "__post_init__"):
                obj.__post_init__()
            return obj
        return super().__call__(*args, **kwargs)


class NKIObject(metaclass=_NKIObjectType):
    """Base class of user dataclasses passed to kernels (plain Python objects here)."""
