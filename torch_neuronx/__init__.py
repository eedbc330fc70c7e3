"""torch-neuronx: the ``neuron`` PyTorch device.

An independent, open implementation of the TorchNeuron design running on a
*simulated* NeuronCore (host CPU threads with accelerator semantics). ``import
torch`` registers the device through the ``torch.backends`` entry point; this
package never needs to be imported by user code.
"""
import atexit as _atexit
import sys as _sys
import os as _os


def _autoload():
    """Entry point of the ``torch.backends`` group: importing the package registers the device.

    Defined before ``import torch``: when user code imports ``torch_neuronx`` first, torch's
    backend autoloading looks this name up on the partially initialized package."""


import torch  # noqa: E402

from . import _C  # noqa: E402

__all__ = ["metrics", "reset_metrics", "set_execution_mode", "get_execution_mode", "nki_op", "wrap_nki", "nki_jit"]
__version__ = "0.1.0"


def _register():
    if getattr(torch, "neuron", None) is not None and torch._C._get_privateuse1_backend_name() == "neuron":
        return
    torch.utils.rename_privateuse1_backend("neuron")
    from . import neuron as _neuron

    torch._register_device_module("neuron", _neuron)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )


_register()

from . import _torch_compat  # noqa: E402

_torch_compat.apply()

from . import distributed as _distributed  # noqa: E402

_distributed._register()

from . import _nki_aliases  # noqa: E402

_nki_aliases.install()


def set_execution_mode(mode):
    """Choose how ``neuron`` runs eager code: ``"eager"`` (each op its own kernel) or ``"adaptive"``.

    In ``"adaptive"`` mode the device fuses runs of queued pointwise ops into one generated
    kernel when it takes them from the queue, with results bitwise equal to eager's (float32).
    The first sight of a group runs its kernels one by one while the fused kernel builds in the
    background. The mode is per process and takes effect for work the device takes from now on;
    ``TORCH_NEURONX_EXECUTION_MODE`` sets it at import. See docs/adaptive_eager.md.
    """
    _C._compiler._set_execution_mode(str(mode))


def get_execution_mode():
    """The current execution mode: ``"eager"`` or ``"adaptive"`` (see :func:`set_execution_mode`)."""
    return _C._compiler._execution_mode()


def metrics():
    """Per-op dispatch counts on neuron, by execution path, and host synchronization points.

    Returns a dict ``{"ops": {op: {"async"|"sync"|"view"|"native": count}}, "syncs": {reason: count},
    "aliases": {"made"|"reused": count}}``.
    ``async`` ops were enqueued and returned at once; ``sync`` ops drained the stream first
    (no meta kernel, or an output shape that depends on data); ``view`` ops touched metadata
    only; ``native`` ops have a neuron kernel of their own (copies, allocation, ``item``).
    ``aliases`` counts the CPU views of device buffers that queued kernels ran on: made new, or
    reused from a kernel that finished (the engine keeps a few).
    ``kernel_scratch``: the host memory CPU kernels allocate on the engine threads, cached by
    size: idle bytes and blocks, blocks served fresh and reused, bytes evicted, and ``placed``:
    allocations served from a compiled graph's output lent to the kernel (docs/device.md).
    ``adaptive`` counts adaptive eager's work (:func:`set_execution_mode`): groups run fused and
    run kernel by kernel (first sight, kernel still building), ops fused, kernel variants, kernels
    built and found in the cache, and ``ended``: why groups ended (or did not start), by reason.
    Once ``torch.compile`` has used the ``neuron`` backend, ``"compile"`` holds the compile tier's
    counters (see :func:`torch_neuronx.compile.compile_metrics`).
    """
    out = _C._metrics()
    out["adaptive"] = _C._compiler._adaptive_metrics()
    import sys

    if "torch_neuronx.compile" in sys.modules:  # loaded with the Dynamo backend, on first use
        out["compile"] = sys.modules["torch_neuronx.compile"].compile_metrics()
    return out


def reset_metrics():
    """Zero all counters reported by :func:`metrics`."""
    _C._reset_metrics()
    _C._compiler._adaptive_reset_metrics()


def _shutdown():
    # Let queued work finish before the interpreter tears down tensors it uses;
    # collectives complete on threads that must not outlive the interpreter's Python objects.
    # Leaving after Ctrl-C, kernels not yet started are dropped instead (the one running ends):
    # the user asked to stop, and nothing can read their results any more.
    _C._distributed._drain(30.0)
    _C._distributed._shutdown()
    if _C._is_initialized() and not _C._in_bad_fork():
        if isinstance(getattr(_sys, "last_value", None), KeyboardInterrupt):
            for d in range(_C._device_count()):
                _C._discard_pending(d)
        _quiesce_autograd_device_threads()  # first: it queues kernels the synchronize below waits for
        for d in range(_C._device_count()):
            try:
                _C._synchronize(d, interruptible=False)
            except RuntimeError:
                pass


def _quiesce_autograd_device_threads():
    # The autograd engine runs neuron backward nodes on a thread per device. That thread drops its
    # last reference to a finished graph task just after the caller's backward() returned; the
    # task holds the Python context torch stashed for it, whose release needs the GIL. If the
    # interpreter is already finalizing by then, the thread is forced to exit inside a noexcept
    # destructor and the process aborts ("terminate called without an active exception").
    # One more backward through the C++ engine per device (without a stashed context) is served
    # by that thread only after it finished the previous task, and leaves nothing Python-owned.
    engine = torch.autograd.Variable._execution_engine
    for d in range(_C._device_count()):
        try:
            x = torch.zeros((), device=torch.device("neuron", d), requires_grad=True)
            y = x * 1.0
            engine.run_backward((y,), (torch.ones_like(y),), False, False, (), True, True)
        except Exception:  # exiting: a failed device must not turn into a failed exit
            pass


_atexit.register(_shutdown)

if _os.environ.get("TORCH_NEURONX_EXECUTION_MODE"):
    set_execution_mode(_os.environ["TORCH_NEURONX_EXECUTION_MODE"])

if _os.environ.get("TORCH_NEURONX_NKI_KERNELS"):
    # opt-in: route SDPA / rms_norm / MoE experts on neuron to the NKI kernel library
    from .nki.kernels import routing as _nki_routing
    _nki_routing.enable_from_env()


def __getattr__(name):
    # torch_neuronx.nki_op / wrap_nki / nki_jit (TorchNeuron's names), loaded with the kernel language on first use
    if name in ("nki_op", "wrap_nki"):
        from .nki import torch_ops
        return getattr(torch_ops, name)
    if name == "nki_jit":
        from .nki import jit
        return jit
    raise AttributeError(f"module 'torch_neuronx' has no attribute '{name}'")
