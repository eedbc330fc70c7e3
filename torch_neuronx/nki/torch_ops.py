"""NKI kernels as PyTorch operators: ``nki_op`` registers a function that launches
kernels through ``wrap_nki`` as a ``torch.library`` custom op, with a fake kernel
(the kernel traced for its declared outputs, nothing run) so it works in eager
mode, under autograd (``op.register_autograd``) and inside
``torch.compile(backend="neuron")`` as one call."""
from __future__ import annotations

import torch

from ._trace import Kernel


def wrap_nki(kernel):
    """A launchable kernel for use inside an ``nki_op`` function: ``wrap_nki(k)[grid](*tensors)``."""
    if isinstance(kernel, Kernel):
        return kernel
    return Kernel(getattr(kernel, "func", kernel))


def nki_op(name, fn=None, *, mutates_args=(), device_types=None, schema=None):
    """Registers ``fn`` (type-annotated, launching NKI kernels) as the custom op ``name``
    ("namespace::op"). Arguments the kernels write in place are named in ``mutates_args``
    (annotated ``nt.mutable_tensor`` in the kernel). Returns the op; add a backward with
    ``op.register_autograd(backward, setup_context=...)``."""
    def register(f):
        op = torch.library.custom_op(name, f, mutates_args=mutates_args, device_types=device_types, schema=schema)
        op.register_fake(f)  # on fake tensors the launches trace the kernels and return outputs of their shapes
        return op
    return register if fn is None else register(fn)
