"""What the neuron compilers return to AOTAutograd: a picklable ``OutputCode``.

AOTAutograd's cache (``torch._functorch`` "bundled" autograd cache) stores it whole, so a new
process running the same program skips AOTAutograd's tracing, partitioning and our export: the
entry holds the exported graph description and its constants, and the executable is rebuilt from
them (its kernels come from the kernel cache)."""
import dataclasses

import torch
from torch._inductor.output_code import OutputCode

from .. import _C
from . import metrics


def _real(fn, consts):
    # Compilers run under AOTAutograd's fake mode; constants are real tensors.
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        return [fn(c) for c in consts]


def _to_device(consts):
    return _real(lambda c: c.to("neuron") if c.device.type == "cpu" and c.dim() > 0 else c, consts)


def _to_cpu(consts):
    return _real(lambda c: c.detach().cpu(), consts)


@dataclasses.dataclass(init=False)
class NeuronOutputCode(OutputCode):
    """A compiled graph: the exported description, its constants, and the executable."""

    desc: dict = None
    cpu_consts: list = None

    def __init__(self, desc, consts, debug_dir=""):
        super().__init__()
        self.desc = desc
        self.cpu_consts = _to_cpu(consts)
        self._boxed_call = True
        self._exe = None
        self._consts = None
        self._build(debug_dir)

    def _build(self, debug_dir=""):
        exe, stats = _C._compiler.compile(self.desc, debug_dir)
        metrics.record(stats)
        self._exe = exe
        self._consts = _to_device(self.cpu_consts)

    def __call__(self, inputs):
        args = list(inputs) + self._consts if self._consts else list(inputs)
        out = self._exe(args)
        inputs.clear()  # boxed convention: the inputs can be freed as soon as possible
        return out

    def post_compile(self, example_inputs, constants, graph_kwargs):
        if self._exe is None:  # loaded from AOTAutograd's cache
            self._build()
            metrics.record_graph_cache_hit()

    def prepare_for_serialization(self):
        pass  # pickling leaves the executable and the device constants out (__getstate__)

    def set_triton_bundle(self, triton_bundle):
        pass

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_exe"] = None
        state["_consts"] = None
        return state


@dataclasses.dataclass(init=False)
class EagerOutputCode(OutputCode):
    """A graph the compiler could not take, run eagerly; never cached (the reason is reported)."""

    def __init__(self, gm, reason):
        super().__init__()
        self._fn = torch._functorch.aot_autograd.make_boxed_func(gm.forward)
        self._boxed_call = True
        self.reason = reason

    def __call__(self, inputs):
        return self._fn(inputs)

    def post_compile(self, example_inputs, constants, graph_kwargs):
        pass

    def prepare_for_serialization(self):
        from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache

        raise BypassAOTAutogradCache(self.reason)

    def set_triton_bundle(self, triton_bundle):
        pass
