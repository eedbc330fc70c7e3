"""``nki.compiler`` (``ncc``) of the Gen-1 API: memory placement hints.

Manual placement (``mod_alloc``, ``alloc``) puts tensors at the addresses the
kernel gives (blocks mapped to one address share memory, as on hardware); the
scheduling hints are no-ops here (instructions run in program order)."""
from __future__ import annotations

import contextlib

from . import language as _nl


class _Space:
    """``ncc.sbuf`` / ``ncc.psum``: the language's memory space with its placement methods."""

    def __init__(self, buffer):
        self._buffer = buffer
        self.space = buffer.space
        self.name = buffer.name

    def mod_alloc(self, *args, **kwargs):
        return self._buffer.mod_alloc(*args, **kwargs)

    def auto_alloc(self):
        return self._buffer

    def alloc(self, func):
        return self._buffer.alloc(func)


sbuf = _Space(_nl.sbuf)
psum = _Space(_nl.psum)


def _passthrough(func=None, **kwargs):
    if func is None:
        return lambda f: f
    return func


skip_middle_end_transformations = _passthrough
enable_stack_allocator = _passthrough
force_auto_alloc = _passthrough


def multi_buffer(factor=2):
    return contextlib.nullcontext()


def no_reorder():
    return contextlib.nullcontext()


def allocation_scope():
    return contextlib.nullcontext()
