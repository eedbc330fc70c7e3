"""Import aliases for NKI kernels: ``import neuronxcc.nki.language as nl`` (Gen-1)
resolves to ``torch_neuronx.nki`` when the real Neuron compiler package is not
installed, so kernel files from public repositories import unchanged.
``TORCH_NEURONX_NKI_ALIASES=0`` turns this off."""
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

_GEN1 = {
    "neuronxcc.nki": "torch_neuronx.nki",
    "neuronxcc.nki.language": "torch_neuronx.nki.language",
    "neuronxcc.nki.isa": "torch_neuronx.nki.isa",
    "neuronxcc.nki.typing": "torch_neuronx.nki.typing",
    "neuronxcc.nki.compiler": "torch_neuronx.nki.compiler",
}
_GEN2 = {
    "nki": "torch_neuronx.nki.v2",
    "nki.language": "torch_neuronx.nki.v2.language",
    "nki.isa": "torch_neuronx.nki.v2.isa",
    "nki.collectives": "torch_neuronx.nki.v2.collectives",
    "nki.typing": "torch_neuronx.nki.typing",
}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target):
        self.target = target

    def create_module(self, spec):
        if self.target is None:  # the bare "neuronxcc" package
            m = types.ModuleType(spec.name, "Alias package: NKI from torch_neuronx (the Neuron compiler is not installed)")
            m.__path__ = []
            return m
        m = importlib.import_module(self.target)
        self._spec = m.__spec__
        return m

    def exec_module(self, module):
        # the import system set the alias's spec on the (shared) module: keep the module's own
        if self.target is not None:
            module.__spec__ = self._spec


class _NkiAliasFinder(importlib.abc.MetaPathFinder):
    def __init__(self, roots):
        self.names = dict(roots)
        if "neuronxcc.nki" in self.names:
            self.names["neuronxcc"] = None

    def _target(self, fullname):
        if fullname in self.names:
            return True, self.names[fullname]
        # other submodules of an aliased package map by name (never a second copy of ours)
        for alias, real in self.names.items():
            if real is not None and fullname.startswith(alias + ".") and alias in ("neuronxcc.nki", "nki"):
                target = real + fullname[len(alias):]
                return importlib.util.find_spec(target) is not None, target
        return False, None

    def find_spec(self, fullname, path=None, target=None):
        ok, real = self._target(fullname)
        if not ok:
            return None
        is_pkg = real is None or hasattr(importlib.import_module(real), "__path__")
        return importlib.util.spec_from_loader(fullname, _AliasLoader(real), is_package=is_pkg)


def _real_package(name):
    return importlib.machinery.PathFinder.find_spec(name) is not None


def install():
    """Adds the finder when the real packages are absent (first on ``sys.meta_path``: the alias
    package's __path__ is our directory, where the path finder would load second copies)."""
    if os.environ.get("TORCH_NEURONX_NKI_ALIASES", "1") == "0":
        return
    if any(isinstance(f, _NkiAliasFinder) for f in sys.meta_path):
        return
    names = {}
    if not _real_package("neuronxcc"):
        names.update(_GEN1)
    if not _real_package("nki"):
        names.update(_GEN2)
    if names:
        sys.meta_path.insert(0, _NkiAliasFinder(names))
