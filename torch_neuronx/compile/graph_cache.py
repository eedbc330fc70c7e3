"""AOTAutograd's graph cache as the neuron backend uses it: where it lives, which entries it keeps,
and a cache key that does not pay for Inductor's code generators.

A warm process finds the compiled forward and backward graphs in AOTAutograd's cache; what it
still pays is Dynamo's tracing and AOTAutograd's cache key. Part of that key is Inductor's
``FxGraphHashDetails``, which imports and registers every Inductor code generator (~0.5 s), hashes
the installed Triton (~0.3 s) and every source file of Inductor (~0.15 s). None of that decides a
neuron graph: for the neuron backend that part is replaced by what does (``_neuron_graph_details``);
the rest of the key (the graph, AOTAutograd's config, grad mode, autocast) is AOTAutograd's own."""
import contextlib
import contextvars
import functools
import hashlib
import os

import torch

from . import metrics

_COMPILING = contextvars.ContextVar("torch_neuronx_compiling", default=False)


@contextlib.contextmanager
def compiling():
    """Marks the neuron backend's compilation (the hooks below act only inside it)."""
    token = _COMPILING.set(True)
    try:
        yield
    finally:
        _COMPILING.reset(token)


@contextlib.contextmanager
def directory():
    """AOTAutograd keeps its cache under Inductor's cache directory; for the neuron backend's
    graphs that is ``<cache dir>/graphs`` (user-only), beside the kernels."""
    from .. import _C

    graphs = os.path.join(_C._compiler._cache_dir(), "graphs")
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


def _guard_saves():
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


@functools.lru_cache(None)
def torch_build_key():
    """Stands in for Inductor's ``torch_key`` (a hash of Inductor's sources) in the neuron
    backend's keys: the torch version and build, and the size and modification time of every
    Python file of the installed torch (~25 ms), so a reinstalled or edited torch misses."""
    h = hashlib.sha256(f"{torch.__version__}|{torch.version.git_version}".encode())
    root = os.path.dirname(torch.__file__)
    for d, subdirs, files in os.walk(root):
        subdirs.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                st = os.stat(os.path.join(d, name))
                h.update(f"{os.path.relpath(d, root)}/{name}:{st.st_mtime_ns}:{st.st_size}".encode())
    return h.digest()


def _neuron_graph_details(details, gm, example_inputs, fx_config):
    """What decides a neuron graph besides what AOTAutograd records itself (its config, grad mode,
    autocast, determinism): the graph and its inputs' metadata, the compile kwargs, the cache key
    tag, Inductor's config (the min-cut partitioner reads some of it), the default dtype, the
    float32 matmul precision, determinism's settings and the torch build. Inductor's code
    generators, custom passes and Triton are not used by the neuron backend."""
    from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache
    from torch._inductor import config as inductor_config
    from torch._inductor.codecache import BypassFxGraphCache, FxGraphCache, FxGraphHashDetails

    try:
        FxGraphCache._check_can_cache(gm, example_inputs, fx_config)
    except BypassFxGraphCache as e:
        raise BypassAOTAutogradCache(str(e)) from e
    details.gm = gm
    details.example_inputs = list(example_inputs)
    details.cache_key_tag = torch.compiler.config.cache_key_tag
    details.fx_kwargs = {k: (sorted(v) if isinstance(v, (set, frozenset)) else v)
                         for k, v in sorted(fx_config.items()) if k not in FxGraphHashDetails.EXCLUDED_KWARGS}
    details.inductor_config = inductor_config.save_config_portable(ignore_private_configs=False,
                                                                   readonly_values=True)
    details.deterministic_algorithms_settings = (
        torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.utils.deterministic.fill_uninitialized_memory)
    details.default_dtype = torch.get_default_dtype()
    details.float32_matmul_precision = torch.get_float32_matmul_precision()
    details.torch_version = torch_build_key()
    details.system_info = {"device": "neuron"}
    details.precompile_enabled = torch._functorch.config.bundled_autograd_cache


def _lean_key():
    """Inside the neuron backend (``compiling()``, a context variable, so other threads and other
    backends are unaffected), the Inductor part of AOTAutograd's key details is
    ``_neuron_graph_details`` and Triton is not looked for (a Triton kernel cannot run on neuron).
    Left as it is if this torch lacks any of the names. Graphs with opaque-reference inputs keep
    Inductor's details (they number those)."""
    from torch._functorch._aot_autograd import autograd_cache
    from torch._library.opaque_object import is_opaque_reference_type

    details_cls = getattr(autograd_cache, "AOTAutogradCacheDetails", None)
    init = getattr(details_cls, "_init_fx_graph_hash_details", None)
    has_triton = getattr(autograd_cache, "has_triton_package", None)
    check_triton = getattr(autograd_cache, "_check_triton_cache_version", None)
    if None in (init, has_triton, check_triton) or getattr(init, "_neuronx", False):
        return

    def lean_init(self, gm, example_inputs, fx_config):
        if _COMPILING.get() and not any(is_opaque_reference_type(type(x)) for x in example_inputs):
            return _neuron_graph_details(self, gm, example_inputs, fx_config)
        return init(self, gm, example_inputs, fx_config)

    def lean_has_triton():
        return False if _COMPILING.get() else has_triton()

    def lean_check_triton():
        if not _COMPILING.get():
            check_triton()

    lean_init._neuronx = True
    details_cls._init_fx_graph_hash_details = lean_init
    autograd_cache.has_triton_package = lean_has_triton
    autograd_cache._check_triton_cache_version = lean_check_triton


def install():
    """Installs the save guard and the lean key (idempotent)."""
    _guard_saves()
    _lean_key()
