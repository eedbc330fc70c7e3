"""The microscaling (OCP MX) instructions of NeuronCore-v4: ``quantize_mx`` and ``nc_matmul_mx``.

MX data tiles hold packed words (``nl.float8_e4m3fn_x4``, ``nl.float8_e5m2_x4``: four fp8 values in
32 bits; ``nl.float4_e2m1fn_x4``: four fp4 values in 16 bits), four consecutive contraction elements
per word. Scales are 8-bit exponents (``uint8`` or ``float8_e8m0fnu``), one per 8 partitions x 4
elements, stored in the 32-partition quadrant their group came from (rows 0-3 of each quadrant)."""
from __future__ import annotations

import math

import torch

from ...isa.gpsimd import _rows
from ..._emit import issue
from ..._tensor import PSUM, SBUF, as_view

_FORMATS = {"float8_e4m3fn_x4": 0, "float8_e5m2_x4": 1, "float4_e2m1fn_x4": 2}
_SCALE_DTYPES = (torch.uint8, torch.float8_e8m0fnu)


def _accumulates(d, accumulate):
    """Whether a matmul into PSUM view ``d`` adds to it: ``accumulate`` when given, else whether this
    region of PSUM was written by a matmul before."""
    key = d.access("")[:5]
    key = (key[0], key[2], tuple(key[3]), tuple(key[4]))
    written = d.tensor.__dict__.setdefault("_psum_written", set())
    acc = (key in written) if accumulate is None else bool(accumulate)
    written.add(key)
    return acc


def _operand(x, op, role, spaces=(SBUF,)):
    v = as_view(x)
    if v.space not in spaces:
        names = {SBUF: "sbuf", PSUM: "psum"}
        raise TypeError(f"{op} {role} must be in {[names.get(s, 'hbm') for s in spaces]}, got {v.tensor.buffer_space}")
    return v


def _format(v, op, role, allowed):
    name = v.tensor.packed
    if name not in allowed:
        raise TypeError(f"{op} {role} dtype must be one of {', '.join(allowed)}, got {v.dtype}")
    return _FORMATS[name]


def _scale(x, op, role, partitions, free):
    """A scale operand that covers ``partitions`` data partitions' groups and ``free`` words, as (rows, free)."""
    v = _operand(x, op, role)
    if v.tdtype not in _SCALE_DTYPES:
        raise TypeError(f"{op} {role} dtype must be float8_e8m0fnu or uint8, got {v.dtype}")
    groups = partitions // 8
    need = groups if groups <= 4 else (groups - 1) // 4 * 32 + 4  # the last group's row, + 1
    have, width = v.sizes[0], math.prod(v.sizes[1:])
    if have < need:
        raise ValueError(f"{op} {role} partition dimension {have} is too small: the scales of {partitions} "
                         f"partitions need {need} (4 rows at the start of each 32-partition quadrant)")
    if width < free:
        raise ValueError(f"{op} {role} free size {width} is smaller than the data's {free} packed elements")
    return _rows(x, have, width)


def _partitions(P, op, role):
    if P % 32 or not 0 < P <= 128:
        raise ValueError(f"{op} {role} partition dimension {P} must be a multiple of 32, at most 128")


def quantize_mx(dst, src, dst_scale, name=None):
    """``src`` (P, F) fp16/bf16 quantized to MXFP8 (Vector Engine): per group of 8 partitions x 4
    elements, the scale is the group's largest fp32 exponent less the format's largest (8 for
    e4m3fn, 15 for e5m2); values are divided by it, clipped to the format's range and rounded;
    ``dst`` (P, F/4) gets the packed words, ``dst_scale`` the scales in the quadrant layout."""
    op = "quantize_mx"
    s, d = _operand(src, op, "src"), _operand(dst, op, "dst")
    fmt = _format(d, op, "dst", ("float8_e4m3fn_x4", "float8_e5m2_x4"))
    if s.tdtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"{op} src dtype must be float16 or bfloat16, got {s.dtype}")
    P, F = s.sizes[0], math.prod(s.sizes[1:])
    _partitions(P, op, "src")
    if F % 4:
        raise ValueError(f"{op} src free size {F} must be a multiple of 4")
    if d.sizes[0] != P or math.prod(d.sizes[1:]) != F // 4:
        raise ValueError(f"{op} dst shape {tuple(d.sizes)} must be ({P}, {F // 4}): src's partitions and a "
                         f"quarter of its free size {F}")
    sc = _scale(dst_scale, op, "dst_scale", P, F // 4)
    if sc.sizes[1] != F // 4:
        raise ValueError(f"{op} dst_scale free size {sc.sizes[1]} must be {F // 4} (src's free size / 4)")
    issue("quantize_mx", op, _rows(dst, P, F // 4), [_rows(src, P, F), sc], ints=[fmt], same_shape=False,
          roles=["dst", "src", "dst_scale"])


def nc_matmul_mx(dst, stationary, moving, stationary_scale, moving_scale, tile_position=None, tile_size=None,
                 accumulate=None, name=None):
    """``dst = stationaryᵀ · moving`` over MX data (Tensor Engine): the contraction runs over the
    partitions and the four elements of each packed word, every element dequantized by its group's
    scale first; fp32 accumulation in PSUM (``accumulate`` as for ``nc_matmul``)."""
    op = "nc_matmul_mx"
    d = _operand(dst, op, "dst", (PSUM,))
    s, m = _operand(stationary, op, "stationary"), _operand(moving, op, "moving")
    formats = tuple(_FORMATS)
    fs, fm = _format(s, op, "stationary", formats), _format(m, op, "moving", formats)
    if d.tdtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"{op} dst dtype must be float32 or bfloat16, got {d.dtype}")
    K, M, N = s.sizes[0], math.prod(s.sizes[1:]), math.prod(m.sizes[1:])
    if m.sizes[0] != K:
        raise ValueError(f"{op} stationary and moving partition dimensions differ: {K} and {m.sizes[0]}")
    _partitions(K, op, "stationary")
    if M % 2 or M > 128:
        raise ValueError(f"{op} stationary free size {M} must be even and at most 128")
    limit = 4096 if d.tdtype == torch.float32 else 8192
    if N > limit:
        raise ValueError(f"{op} moving free size {N} exceeds maximum {limit} for a {d.dtype} dst")
    if d.sizes[0] != M or math.prod(d.sizes[1:]) != N:
        raise ValueError(f"{op} dst shape {tuple(d.sizes)} must be ({M}, {N})")
    if (tile_position is None) != (tile_size is None) or (tile_position is not None and (
            len(tile_position) != 2 or len(tile_size) != 2)):
        raise ValueError(f"{op}: set both tile_position=(row, 0) and tile_size=(rows, 128), or neither")
    if tile_size is not None:
        (row, col), (rows, cols) = (int(x) for x in tile_position), (int(x) for x in tile_size)
        if col != 0 or cols != 128 or rows not in (32, 64, 128) or row % rows or row + rows > 128 or K > rows:
            raise ValueError(f"{op} tile_position {tuple(tile_position)} / tile_size {tuple(tile_size)}: row tiles "
                             f"are 32, 64 or 128 rows at a multiple of their size, columns (0, 128), and hold "
                             f"the {K} stationary partitions")
    ss = _scale(stationary_scale, op, "stationary_scale", K, M)
    ms = _scale(moving_scale, op, "moving_scale", K, N)
    issue("matmul_mx", op, _rows(dst, M, N), [_rows(stationary, K, M), _rows(moving, K, N), ss, ms],
          ints=[int(_accumulates(d, accumulate)), fs, fm], same_shape=False,
          roles=["dst", "stationary", "moving", "stationary_scale", "moving_scale"])
