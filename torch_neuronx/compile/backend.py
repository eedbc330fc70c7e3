"""The Dynamo backend ``neuron``: AOTAutograd around the C++ compiler."""
import functools
import os
import time
import warnings

import torch

from .. import _C
from . import export, metrics

aten = torch.ops.aten

# Ops the compiler runs better whole (one library kernel) than decomposed into core ATen.
KEEP_WHOLE = [
    aten.native_layer_norm, aten.native_layer_norm_backward, aten._softmax, aten._softmax_backward_data,
    aten._log_softmax, aten._log_softmax_backward_data, aten.nll_loss_forward, aten.nll_loss_backward,
    aten.native_batch_norm, aten.native_batch_norm_backward, aten._native_batch_norm_legit,
    aten._native_batch_norm_legit_functional, aten._native_batch_norm_legit_no_training,
    aten.convolution_backward, aten.embedding_dense_backward, aten.addmm, aten.mm, aten.bmm, aten.baddbmm,
    aten.matmul, aten.linear, aten.gelu, aten.gelu_backward, aten.silu, aten.silu_backward, aten.mse_loss,
    aten.mse_loss_backward, aten.native_group_norm, aten.native_group_norm_backward, aten.cross_entropy_loss,
    aten._scaled_dot_product_flash_attention_for_cpu, aten._scaled_dot_product_flash_attention_for_cpu_backward,
]


@functools.lru_cache(None)
def decompositions():
    from torch._decomp import core_aten_decompositions

    table = dict(core_aten_decompositions())
    for packet in KEEP_WHOLE:
        for overload in packet.overloads():
            table.pop(getattr(packet, overload), None)
    return table


def _debug_dir():
    return os.environ.get("TORCH_NEURONX_DEBUG_DIR", "")


def _warn_once(key, msg, _seen=set()):  # noqa: B006 (a process-wide set of warned keys)
    if key not in _seen:
        _seen.add(key)
        warnings.warn(msg, stacklevel=3)


def compile_graph(gm, example_inputs, kind):
    """One FX graph (forward, backward or inference) → a boxed callable running the executable."""
    t0 = time.perf_counter()
    dbg = _debug_dir()
    try:
        desc, consts = export.export(gm)
    except export.Unsupported as e:
        reason = f"{kind} graph runs eagerly: {e}"
        metrics.record_eager(reason)
        _warn_once(str(e), f"torch_neuronx compile: {reason}")
        return torch._functorch.aot_autograd.make_boxed_func(gm.forward)
    if dbg:
        os.makedirs(dbg, mode=0o700, exist_ok=True)
        with open(os.path.join(dbg, f"fx_{kind}_{id(gm):x}.py"), "w") as f:
            f.write(gm.print_readable(print_output=False))
    exe, stats = _C._compiler.compile(desc, dbg)
    metrics.record(stats)
    metrics.record_frontend_seconds(time.perf_counter() - t0 - stats["seconds"])
    consts = [c.to("neuron") if c.device.type == "cpu" and c.dim() > 0 else c for c in consts]

    def run(args):
        out = exe(list(args) + consts if consts else list(args))
        args.clear()  # boxed convention: the inputs can be freed as soon as possible
        return out

    run._boxed_call = True
    run.executable = exe
    return run


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
    _note_recompile()
    backend = aot_autograd(
        fw_compiler=functools.partial(compile_graph, kind="forward"),
        bw_compiler=functools.partial(compile_graph, kind="backward"),
        inference_compiler=functools.partial(compile_graph, kind="inference"),
        decompositions=decompositions(),
        partition_fn=min_cut_rematerialization_partition,
        keep_inference_input_mutations=True,
    )
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
