"""Loaded at interpreter start (torch_neuronx_nki.pth): the first ``import neuronxcc``
or ``import nki`` loads torch_neuronx, whose import aliases then serve the NKI
kernel language, so a kernel file that imports only NumPy and ``neuronxcc.nki``
runs unchanged. Does nothing when the real packages are installed, or with
``TORCH_NEURONX_NKI_ALIASES=0``."""
import importlib.abc
import importlib.machinery
import os
import sys


class _NkiBootFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in ("neuronxcc", "nki") or "torch_neuronx" in sys.modules:
            return None
        if importlib.machinery.PathFinder.find_spec(fullname) is not None:
            return None  # the real package
        import torch_neuronx  # noqa: F401  (installs the alias finder first on sys.meta_path)
        for f in sys.meta_path:
            if type(f).__name__ == "_NkiAliasFinder":
                return f.find_spec(fullname, path, target)
        return None


if os.environ.get("TORCH_NEURONX_NKI_ALIASES", "1") != "0" and \
        not any(type(f).__name__ == "_NkiBootFinder" for f in sys.meta_path):
    sys.meta_path.append(_NkiBootFinder())
