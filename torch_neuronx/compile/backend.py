"""The Dynamo backend ``neuron``: AOTAutograd around the C++ compiler."""
import collections.abc
import functools
import hashlib
import os
import pathlib
import time
import warnings

import torch

from . import export, graph_cache, layout, metrics, relu_pool
from .decompositions import NEURON_DECOMPOSITIONS
from .output_code import EagerOutputCode, NeuronOutputCode

aten = torch.ops.aten


def keep_whole():
    """The ops the compiler runs better whole (lowered, or one library kernel) than decomposed into
    core ATen: the entries of its op table marked keep_whole."""
    from .. import _C

    return [getattr(aten, e["target"].split("::", 1)[1].split(".", 1)[0])
            for e in _C._compiler._op_table() if e["keep_whole"]]


class _Decompositions(collections.abc.Mapping):
    """The decomposition table, built on first use: AOTAutograd reads it only to trace a graph,
    and a graph found in the cache is not traced."""

    def __getitem__(self, op):
        return decompositions()[op]

    def __iter__(self):
        return iter(decompositions())

    def __len__(self):
        return len(decompositions())


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
    if kind == "inference":  # (training graphs: in the joint graph, before partitioning)
        metrics.record_relu_pool_swaps(relu_pool.swap_relu_max_pool(gm))
    metrics.record_layout(*layout.channels_last(gm, kind))
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
    for name in ("backend.py", "decompositions.py", "export.py", "graph_cache.py", "layout.py", "output_code.py",
                 "relu_pool.py", "../_torch_compat.py"):
        h.update((here / name).read_bytes())
    # What decides the decomposition table without building it (~0.25 s, needed only to trace):
    # the torch build (in the key already) and the ops kept whole or decomposed our way.
    from .. import _C

    h.update(repr(sorted(e["target"] for e in _C._compiler._op_table() if e["keep_whole"])).encode())
    h.update(repr(sorted(str(k) for k in NEURON_DECOMPOSITIONS)).encode())
    return f"neuron:{h.hexdigest()[:20]}"


def cache_dir():
    """The on-disk cache: ``TORCH_NEURONX_CACHE_DIR``, default ``~/.cache/torch_neuronx``, created
    user-only (0700) if missing. Raises ``RuntimeError`` if another user could change it: compiled
    kernels and graphs are loaded back from it. If it cannot be written (a read-only file system),
    a private scratch directory of this process, removed at exit (warned once); kernels already in
    the read-only cache are still loaded from it."""
    from .. import _C

    return _C._compiler._cache_dir()


def _note_recompile():
    from torch._guards import CompileContext

    cid = CompileContext.current_compile_id()
    if cid is not None and cid.frame_compile_id:
        from torch._dynamo.utils import guard_failures

        reasons = [str(r) for failures in guard_failures.values() for r in failures[-1:]]
        metrics.record_recompile(reasons[-1:] or ["unknown"])


def _partition(joint, joint_inputs, **kwargs):
    """AOTAutograd's min-cut partitioner, after the rewrites that change what the forward saves."""
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    metrics.record_relu_pool_swaps(relu_pool.swap_relu_max_pool(joint))
    return min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)


def neuron_backend(gm, example_inputs, **kwargs):
    """The ``neuron`` Dynamo backend (``torch.compile(model, backend="neuron")``).

    ``mode`` values other than ``"default"`` are accepted with a warning (they tune Inductor);
    ``dynamic=True`` and dimensions Dynamo marks dynamic are compiled with sizes as runtime
    arguments."""
    from torch._dynamo.backends.common import aot_autograd
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
        decompositions=_Decompositions(),
        partition_fn=_partition,
        keep_inference_input_mutations=True,
    )
    # "Bundled": the cache entry holds our OutputCode itself (not Inductor's FX graph cache key).
    # The backward is compiled with the forward, so the entry is complete when it is saved.
    # With TORCH_NEURONX_DEBUG_DIR set every graph is traced and dumped again (no cache).
    tag = torch.compiler.config.cache_key_tag
    with torch._functorch.config.patch(bundled_autograd_cache=True, force_non_lazy_backward_lowering=True,
                                       enable_autograd_cache=not _debug_dir()), \
            torch.compiler.config.patch(cache_key_tag=f"{tag}|{_cache_key_tag()}" if tag else _cache_key_tag()), \
            graph_cache.directory(), graph_cache.compiling(), layout.saved_layouts():
        return backend(gm, example_inputs)


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
graph_cache.install()
