"""NKI dtypes: NumPy dtypes (ml_dtypes for bf16/fp8, named raw words for the packed MX
types), as ``neuronxcc`` exposes them, and the torch dtypes the core stores them as."""
from __future__ import annotations

import numpy as np
import torch

_NUMPY_TO_TORCH = {
    np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16, np.dtype(np.float64): torch.float64,
    np.dtype(np.int8): torch.int8, np.dtype(np.int16): torch.int16, np.dtype(np.int32): torch.int32,
    np.dtype(np.int64): torch.int64, np.dtype(np.uint8): torch.uint8, np.dtype(np.uint16): torch.uint16,
    np.dtype(np.uint32): torch.uint32, np.dtype(np.bool_): torch.bool,
}
# nl.float8_e4m3 (OCP e4m3 with infinities, largest finite 240) has no torch dtype: the core keeps
# its bits in float8_e4m3fnuz tensors and converts them itself (csrc/nki/fp8.h).
E4M3 = torch.float8_e4m3fnuz
_NAMED = {"bfloat16": torch.bfloat16, "float8_e4m3": E4M3, "float8_e4m3fn": torch.float8_e4m3fn,
          "float8_e5m2": torch.float8_e5m2, "float8_e8m0fnu": torch.float8_e8m0fnu, "tfloat32": torch.float32, "float32": torch.float32,
          "float16": torch.float16, "bool_": torch.bool}


# Packed MX element types (4 values per element): stored as raw words of their size.
PACKED = {"float8_e4m3fn_x4": torch.uint32, "float8_e5m2_x4": torch.uint32, "float4_e2m1fn_x4": torch.uint16}


def packed_dtype(name):
    """The NumPy dtype standing for a packed NKI type (a named raw word)."""
    return np.dtype([(name, np.uint32 if PACKED[name] == torch.uint32 else np.uint16)])


def packed_name(d):
    """The packed MX type a dtype names (``"float8_e4m3fn_x4"`` ...), or None."""
    if isinstance(d, str):
        return d if d in PACKED else None
    try:
        nd = np.dtype(d)
    except TypeError:
        return None
    return nd.names[0] if nd.names and nd.names[0] in PACKED else None


def to_dtype(d):
    """A torch dtype from an NKI, NumPy (incl. ml_dtypes) or torch dtype."""
    if d is None or isinstance(d, torch.dtype):
        return d
    if isinstance(d, str) and d in _NAMED:
        return _NAMED[d]
    try:
        nd = np.dtype(d)
    except TypeError:
        raise TypeError(f"{d!r} is not a dtype") from None
    if nd.name in _NAMED:
        return _NAMED[nd.name]
    if nd.names and nd.names[0] in PACKED:  # nl.float8_e4m3fn_x4 ...: raw words (MX matmul operands)
        return PACKED[nd.names[0]]
    if nd.kind == "V" and nd.itemsize == 4:  # nl.tfloat32
        return torch.float32
    if nd in _NUMPY_TO_TORCH:
        return _NUMPY_TO_TORCH[nd]
    raise TypeError(f"dtype {nd} is not an NKI dtype")


try:
    import ml_dtypes as _ml
    _NKI_NAMES = {torch.bfloat16: np.dtype(_ml.bfloat16), E4M3: np.dtype(_ml.float8_e4m3),
                  torch.float8_e4m3fn: np.dtype(_ml.float8_e4m3fn), torch.float8_e5m2: np.dtype(_ml.float8_e5m2),
                  torch.float8_e8m0fnu: np.dtype(_ml.float8_e8m0fnu)}
except ImportError:  # without ml_dtypes, the low-precision NKI dtypes are torch's
    _NKI_NAMES = {torch.bfloat16: torch.bfloat16, E4M3: E4M3, torch.float8_e4m3fn: torch.float8_e4m3fn,
                  torch.float8_e5m2: torch.float8_e5m2}
_TORCH_TO_NUMPY = {t: n for n, t in _NUMPY_TO_TORCH.items()}


def nki_dtype(t):
    """The NKI dtype (a NumPy dtype, ml_dtypes for bf16/fp8) of a torch dtype."""
    return _NKI_NAMES.get(t) or _TORCH_TO_NUMPY[t]


def itemsize(dtype):
    return torch.empty((), dtype=dtype).element_size()
