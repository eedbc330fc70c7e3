"""The Gen-2 NKI API (``import nki``; NKI 0.6): instructions write into ``dst=``,
tensors are sliced (no arange/mask), ``kernel[lnc]`` launches logical cores,
``nki.simulate(kernel)(*numpy_or_torch)``. Same core as the Gen-1 API;
``import nki`` resolves here when the real package is absent."""
from __future__ import annotations

import functools

from numpy import dtype  # noqa: F401 - nki.dtype: the type of NKI dtypes (kernels annotate with it)

from .. import _trace
from .. import typing  # noqa: F401
from . import isa, language  # noqa: F401


def jit(fn=None, **kwargs):
    """Makes ``fn`` a kernel; ``kernel[lnc](...)`` runs ``lnc`` logical-core instances."""
    if fn is None:
        return functools.partial(jit, **kwargs)
    if "platform_target" in kwargs:
        raise ValueError("nki.jit(platform_target=...) is not supported in NKI 0.6; "
                         "set NEURON_PLATFORM_TARGET_OVERRIDE instead")
    return _trace.Kernel(fn, gen=2)


def simulate(kernel):
    """A callable running ``kernel`` (or ``kernel[lnc]``) on NumPy arrays or torch tensors, results alike."""
    return kernel if isinstance(kernel, (_trace.Kernel, _trace._Launcher)) else _trace.Kernel(kernel, gen=2)
