"""The Dynamo backend ``neuron``: AOTAutograd around the C++ compiler."""
import contextlib
import contextvars
import functools
import hashlib
import os
import pathlib
import time
import warnings

import torch

from . import export, metrics
from .decompositions import NEURON_DECOMPOSITIONS
from .output_code import EagerOutputCode, NeuronOutputCode

aten = torch.ops.aten


def keep_whole():
    """The ops the compiler runs better whole (lowered, or one library kernel) than decomposed into
    core ATen: the entries of its op table marked keep_whole."""
    from .. import _C

    return [getattr(aten, e["target"].split("::", 1)[1].split(".", 1)[0])
            for e in _C._compiler._op_table() if e["keep_whole"]]


@functools.lru_cache(None)
def decompositions():
    from torch._decomp import core_aten_decompositions

    table = dict(core_aten_decompositions())
    for packet in keep_whole():
        for overload in packet.overloads():
            table.pop(getattr(packet, overload), None)
    table.update(NEURON_DECOMPOSITIONS)
    return table


def _debug_dir():
    return os.environ.get("TORCH_NEURONX_DEBUG_DIR", "")


def _warn_once(key, msg, _seen=set()):  # noqa: B006 (a process-wide set of warned keys)
    if key not in _seen:
        _seen.add(key)
        warnings.warn(msg, stacklevel=3)


def compile_graph(gm, example_inputs, kind):
    """One FX graph (forward, backward or inference) → an ``OutputCode`` running the executable."""
    t0 = time.perf_counter()
    dbg = _debug_dir()
    try:
        desc, consts = export.export(gm)
    except export.Unsupported as e:
        reason = f"{kind} graph runs eagerly: {e}"
        metrics.record_eager(reason)
        _warn_once(str(e), f"torch_neuronx compile: {reason}")
        return EagerOutputCode(gm, reason)
    if dbg:
        os.makedirs(dbg, mode=0o700, exist_ok=True)
        with open(os.path.join(dbg, f"fx_{kind}_{id(gm):x}.py"), "w") as f:
            f.write(gm.print_readable(print_output=False))
    before = metrics.compile_metrics()["compile_seconds"]
    code = NeuronOutputCode(desc, consts, dbg)
    compiler_seconds = metrics.compile_metrics()["compile_seconds"] - before
    metrics.record_frontend_seconds(time.perf_counter() - t0 - compiler_seconds)
    return code


@functools.lru_cache(None)
def _cache_key_tag():
    """Part of AOTAutograd's cache key: what decides the cached entries besides the graph (the
    export format, this frontend, the decompositions). The C++ compiler is not part of it: a
    loaded entry is compiled again (its kernels from the kernel cache)."""
    h = hashlib.sha256()
    here = pathlib.Path(__file__).resolve().parent
    for name in ("backend.py", "decompositions.py", "export.py", "output_code.py"):
        h.update((here / name).read_bytes())
    h.update(repr(sorted(str(k) for k in decompositions())).encode())
    return f"neuron:{h.hexdigest()[:20]}"


def cache_dir():
    """The on-disk cache: ``TORCH_NEURONX_CACHE_DIR``, default ``~/.cache/torch_neuronx``, created
    user-only (0700) if missing. Raises ``RuntimeError`` if another user could change it: compiled
    kernels and graphs are loaded back from it. If it cannot be written (a read-only file system),
    a private scratch directory of this process, removed at exit (warned once); kernels already in
    the read-only cache are still loaded from it."""
    from .. import _C

    return _C._compiler._cache_dir()


@contextlib.contextmanager
def _graph_cache():
    """AOTAutograd keeps its cache under Inductor's cache directory; for the neuron backend's
    graphs that is ``<cache dir>/graphs`` (user-only), beside the kernels."""
    graphs = os.path.join(cache_dir(), "graphs")
    os.makedirs(graphs, mode=0o700, exist_ok=True)
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = graphs
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = before


def _note_recompile():
    from torch._guards import CompileContext

    cid = CompileContext.current_compile_id()
    if cid is not None and cid.frame_compile_id:
        from torch._dynamo.utils import guard_failures

        reasons = [str(r) for failures in guard_failures.values() for r in failures[-1:]]
        metrics.record_recompile(reasons[-1:] or ["unknown"])


def neuron_backend(gm, example_inputs, **kwargs):
    """The ``neuron`` Dynamo backend (``torch.compile(model, backend="neuron")``).

    ``mode`` values other than ``"default"`` are accepted with a warning (they tune Inductor);
    ``dynamic=True`` and dimensions Dynamo marks dynamic are compiled with sizes as runtime
    arguments."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    mode = kwargs.get("mode") or kwargs.get("options", {}).get("mode") if kwargs else None
    if mode not in (None, "default"):
        _warn_once(("mode", mode), f"torch_neuronx compile: mode={mode!r} tunes Inductor; the neuron backend "
                   "compiles the same way for every mode")
    from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler

    _note_recompile()

    def compiler(kind):  # returns OutputCode: AOTAutograd caches the compiled graphs across processes
        return SerializableAOTDispatchCompiler(NeuronOutputCode, functools.partial(compile_graph, kind=kind))

    backend = aot_autograd(
        fw_compiler=compiler("forward"),
        bw_compiler=compiler("backward"),
        inference_compiler=compiler("inference"),
        decompositions=decompositions(),
        partition_fn=min_cut_rematerialization_partition,
        keep_inference_input_mutations=True,
    )
    # "Bundled": the cache entry holds our OutputCode itself (not Inductor's FX graph cache key).
    # The backward is compiled with the forward, so the entry is complete when it is saved.
    # With TORCH_NEURONX_DEBUG_DIR set every graph is traced and dumped again (no cache).
    tag = torch.compiler.config.cache_key_tag
    with torch._functorch.config.patch(bundled_autograd_cache=True, force_non_lazy_backward_lowering=True,
                                       enable_autograd_cache=not _debug_dir()), \
            torch.compiler.config.patch(cache_key_tag=f"{tag}|{_cache_key_tag()}" if tag else _cache_key_tag()), \
            _graph_cache(), _compiling():
        return backend(gm, example_inputs)


_COMPILING = contextvars.ContextVar("torch_neuronx_compiling", default=False)


@contextlib.contextmanager
def _compiling():
    token = _COMPILING.set(True)
    try:
        yield
    finally:
        _COMPILING.reset(token)


def _guard_graph_cache():
    """Entries whose outputs alias are not written to AOTAutograd's cache for the neuron backend:
    AOTAutograd regenerates such outputs by replaying the views it recorded, and replayed from a
    loaded entry those read garbage sizes (torch 2.13; regenerating with as_strided instead is
    wrong for some graphs). Such graphs compile again in a new process."""
    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache

    save = AOTAutogradCache.save
    if getattr(save, "_neuronx", False):
        return

    def guarded(key, entry, remote):
        meta = getattr(entry, "runtime_metadata", None)
        if _COMPILING.get() and meta is not None and any(
                getattr(o, "view_meta_sequence", None) is not None for o in meta.output_info):
            metrics.record_graph_cache_skip()
            return None
        return save(key, entry, remote)

    guarded._neuronx = True
    AOTAutogradCache.save = staticmethod(guarded)


def _host_only_functions():
    """The device module's RNG-state functions are host work (they drain the device and copy the
    generator state): Dynamo runs them as they are instead of tracing into them, as it does for
    torch.cuda's. Installed when the backend is first looked up, before any tracing."""
    import torch._dynamo

    mod = torch.neuron
    for name in ("get_rng_state", "get_rng_state_all", "set_rng_state", "set_rng_state_all", "manual_seed",
                 "manual_seed_all", "seed", "seed_all", "initial_seed", "synchronize"):
        fn = getattr(mod, name, None)
        if fn is not None and not getattr(fn, "_neuronx_host_only", False):
            wrapped = torch._dynamo.disable(fn, recursive=True)
            wrapped._neuronx_host_only = True
            setattr(mod, name, wrapped)


_host_only_functions()
_guard_graph_cache()
