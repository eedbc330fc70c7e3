"""``nki.typing`` (``nt``): parameter annotations of kernels."""
from __future__ import annotations


class _TensorAnnotation:
    """``nt.tensor[128, 512]``: a shape annotation (checked by ``nt.tensor[...]`` users only)."""

    def __init__(self, shape=None, dtype=None):
        self.shape, self.dtype = shape, dtype

    def __getitem__(self, shape):
        return _TensorAnnotation(shape if isinstance(shape, tuple) else (shape,))

    def __repr__(self):
        return f"nt.tensor[{', '.join(str(s) for s in self.shape or ())}]"


tensor = _TensorAnnotation()
mutable_tensor = _TensorAnnotation()
