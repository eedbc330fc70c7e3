"""The few places where PyTorch's Python decides by device name what a backend gets.

PyTorch keys some behaviour on ``device.type in {"cuda", "cpu", ...}`` lists that a backend
cannot register itself into. Each adjustment below gives ``neuron`` what CUDA (or, where the
kernels are CPU's, CPU) gets, is checked against the torch version it was written for, and is
listed in docs/device.md ("Adjustments to PyTorch"). Nothing else in the package patches torch.

- FlexAttention: ``torch.nn.attention.flex_attention._validate_device`` allows only a fixed list
  of device types; ``neuron`` runs the higher-order op's dense implementation (forward and
  backward), like CPU for the forward and unlike CPU for the backward, which CPU refuses.
- FlexAttention under ``torch.autocast("neuron")``: the higher-order op has autocast kernels for
  CPU and CUDA only; ``neuron`` gets the same cast-then-redispatch kernel. Every other
  higher-order op gets the fallthrough that PyTorch gives AutocastCPU/AutocastCUDA.
- ``linear_cross_entropy``: the chunked path picks fp32 accumulation for bf16/fp16 inputs on CPU
  and CUDA only; ``neuron`` gets fp32 and CPU's chunking defaults (its kernels are CPU's).
- Process groups with a backend per device (``"cpu:gloo,neuron:neuron"``): ``torch.distributed``
  looks for a registered backend's name among the device map's values in upper case (the
  plugin registry's keys) while the values are lower case, so such a group gets no default
  backend and ``destroy_process_group`` warns "No backend of type 0". ``neuron`` groups get the
  default backend torch gives a matching plugin (CUSTOM).
- ``out_dtype(aten.mm, int32, int8, int8)`` (TorchAO's int8 matmuls): the higher-order op's dense
  kernel uses ``torch._int_mm`` on CUDA and XPU only and otherwise multiplies in int32 (a GEMM
  without BLAS); ``neuron`` gets ``_int_mm`` too, through a ``PrivateUse1`` kernel (the results
  are the same integers).
- ``torch.compile`` with its default backend, Inductor: Inductor has code generators for CPU,
  CUDA, XPU and MPS only and fails on a graph on ``neuron`` (``KeyError: 'neuron'``, "No interface
  for device neuron"); such a graph is compiled by the ``neuron`` backend instead, as
  ``backend="neuron"`` would (graphs on other devices still go to Inductor).
- ``run_and_save_rng_state`` / ``run_with_rng_state`` (the higher-order ops AOTAutograd uses to
  replay random ops when activation checkpointing recomputes a compiled region): their kernels
  pick an implementation from a map of cuda, cpu, hpu and xpu and raise "Backend not supported"
  for any other device; ``neuron`` gets CUDA's implementation over ``torch.neuron``'s RNG state.
- Traced convolutions (``torch.compile``): the fake convolution asks the device's convolution
  backend for its result's layout, and for any device but CPU, CUDA and XPU the answer is NCHW;
  ``neuron`` runs CPU's kernels, which return channels-last when the input or the weight is, so a
  compiled graph returned NCHW where eager returned channels-last. ``neuron`` gets CPU's rule.
- Printing a tensor: ``torch._tensor_str`` copies xla, lazy, ipu and mtia tensors to the host
  before formatting them and formats any other device's tensor with device ops, reading element
  after element back (dozens of host synchronizations per print, each draining the queues).
  ``neuron`` tensors are formatted from one host copy of the elements printing reads (all of
  them, or for a summarized tensor the first and last ``edgeitems`` along every dimension).
"""
import warnings

import torch

# The torch releases these adjustments were checked against (the project pins torch==2.13.0).
_CHECKED = ("2.13.",)
_applied = []


def applied():
    """Names of the adjustments in effect in this process."""
    return list(_applied)


def _flex_attention_device():
    import torch.nn.attention.flex_attention as fa

    original = fa._validate_device
    if getattr(original, "_neuron", False):
        return

    def _validate_device(query, key, value):
        if query.device.type == "neuron":
            return
        return original(query, key, value)

    _validate_device._neuron = True
    fa._validate_device = _validate_device
    _applied.append("flex_attention_device")


def _higher_order_autocast():
    from torch._C import DispatchKey
    from torch._higher_order_ops.flex_attention import flex_attention
    from torch._ops import _higher_order_ops
    from torch.amp.autocast_mode import _cast

    key = DispatchKey.AutocastPrivateUse1
    if key not in flex_attention.py_kernels:

        @flex_attention.py_impl(key)
        def _flex_attention_autocast(query, key_, value, score_mod, block_mask, scale, kernel_options,
                                     score_mod_other_buffers=(), mask_mod_other_buffers=()):
            # As PyTorch's AutocastCUDA kernel: q, k, v in the autocast dtype, then the op itself.
            dtype = torch.get_autocast_dtype(query.device.type)
            q, k, v = (_cast(t, query.device.type, dtype) for t in (query, key_, value))
            with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(key)):
                return flex_attention(q, k, v, score_mod, block_mask, scale, kernel_options,
                                      score_mod_other_buffers, mask_mod_other_buffers)

    for op in list(_higher_order_ops.values()):  # those defined when torch_neuronx loads
        if key not in op.py_kernels:
            op.fallthrough(key)
    _applied.append("higher_order_autocast")


def is_int8_mm(op, output_dtype, args):
    """Whether ``out_dtype(op, output_dtype, *args)`` is an int8 x int8 -> int32 matmul (``_int_mm``)."""
    return (op is torch.ops.aten.mm.default and output_dtype == torch.int32 and len(args) == 2
            and all(isinstance(a, torch.Tensor) and a.dtype == torch.int8 for a in args))


def _out_dtype_int_mm():
    from torch._C import DispatchKey
    from torch._higher_order_ops.out_dtype import out_dtype, out_dtype_fallback

    key = DispatchKey.PrivateUse1
    if key not in out_dtype.py_kernels:

        @out_dtype.py_impl(key)
        def _out_dtype_neuron(op, output_dtype, *args):
            if is_int8_mm(op, output_dtype, args):
                return torch._int_mm(*args)
            return out_dtype_fallback(op, output_dtype, *args)

    _applied.append("out_dtype_int_mm")


def _graph_on_neuron(gm, example_inputs):
    if any(isinstance(t, torch.Tensor) and t.device.type == "neuron" for t in example_inputs):
        return True
    graph = getattr(gm, "graph", None)
    for node in graph.nodes if graph is not None else ():
        v = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(v, torch.Tensor) and v.device.type == "neuron":
            return True
    return False


def _inductor_on_neuron():
    import logging

    cls = torch._TorchCompileInductorWrapper
    original = cls.__call__
    if getattr(original, "_neuron", False):
        return

    def __call__(self, model_, inputs_, *args, **kwargs):
        if _graph_on_neuron(model_, inputs_):
            from .compile import neuron_backend

            logging.getLogger("torch_neuronx").info(
                "torch.compile: Inductor has no code generator for neuron; this graph is compiled by the neuron backend")
            return neuron_backend(model_, inputs_)
        return original(self, model_, inputs_, *args, **kwargs)

    __call__._neuron = True
    cls.__call__ = __call__
    _applied.append("inductor_on_neuron")


def _conv_memory_format():
    original = torch._C._conv_determine_backend_memory_format
    if getattr(original, "_neuron", False):
        return
    channels_last = torch.channels_last

    def determine(input_, weight, backend):
        device = getattr(input_, "fake_device", input_.device)
        if device.type == "neuron" and input_.dim() == 4 and weight.dim() == 4 and not input_.is_complex():
            # CPU's 2-d convolution backends (oneDNN and the slow ones) return channels-last when
            # the input or the weight is: the device runs CPU's kernels.
            fmt = torch._prims_common.suggest_memory_format
            if fmt(input_) == channels_last or fmt(weight) == channels_last:
                return channels_last
            return torch.contiguous_format
        return original(input_, weight, backend)

    determine._neuron = True
    torch._C._conv_determine_backend_memory_format = determine
    _applied.append("conv_memory_format")


def _rng_state_higher_order_ops():
    from torch._C import DispatchKey
    from torch._higher_order_ops.utils import registered_hop_fake_fns
    from torch._prims import rng_prims

    def run_and_save(op, *args, **kwargs):
        return torch.neuron.get_rng_state(), op(*args, **kwargs)

    def run_with(rng_state, op, *args, **kwargs):
        current = torch.neuron.get_rng_state()
        torch.neuron.set_rng_state(rng_state.cpu())
        try:
            return op(*args, **kwargs)
        finally:
            torch.neuron.set_rng_state(current)

    def on_neuron(original, neuron_impl, leading):
        # `leading` arguments (the op, and the state for run_with) come before the op's own.
        def kernel(*args, **kwargs):
            if rng_prims.get_device(args[leading:], kwargs) == "neuron":
                return neuron_impl(*args, **kwargs)
            return original(*args, **kwargs)

        kernel._neuron = True
        return kernel

    for hop, impl, leading in ((rng_prims.run_and_save_rng_state, run_and_save, 1),
                               (rng_prims.run_with_rng_state, run_with, 2)):
        select = hop.py_kernels[DispatchKey.BackendSelect]
        if getattr(select, "_neuron", False):
            continue
        hop.py_kernels[DispatchKey.BackendSelect] = on_neuron(select, impl, leading)
        hop.py_impl(DispatchKey.PrivateUse1)(impl)
        hop._dispatch_cache.clear()
    # Under fake tensors run_and_save_rng_state asks the same device map for the state's shape.
    fake = registered_hop_fake_fns[rng_prims.run_and_save_rng_state]
    if not getattr(fake, "_neuron", False):
        registered_hop_fake_fns[rng_prims.run_and_save_rng_state] = on_neuron(fake, run_and_save, 1)
    _applied.append("rng_state_higher_order_ops")


def _host_copy_for_printing(t):
    """A host tensor of t's shape holding the elements printing reads; None to print as is."""
    from torch._tensor_str import PRINT_OPTS

    if t.device.type != "neuron" or t.layout != torch.strided or t.dim() == 0:
        return None
    with torch.no_grad():
        if t.numel() <= PRINT_OPTS.threshold:
            return t.cpu()
        e = PRINT_OPTS.edgeitems
        if e == 0:
            return None
        def rows(n, device=None):  # the indices printing reads along a dimension of size n
            if n <= 2 * e:
                return torch.arange(n, device=device)
            return torch.cat((torch.arange(e, device=device), torch.arange(n - e, n, device=device)))

        index = [rows(n) for n in t.shape]
        corners = t
        try:
            for d, n in enumerate(t.shape):
                if n > 2 * e:  # made on the device: no host-to-device copy
                    corners = corners.index_select(d, rows(n, t.device))
        except (RuntimeError, NotImplementedError):  # a dtype index_select lacks: format on the device
            return None
        host = torch.empty(t.shape, dtype=t.dtype)  # elements outside the corners are never read
        host[tuple(i.view([-1 if k == d else 1 for k in range(t.dim())]) for d, i in enumerate(index))] = corners.cpu()
        return host


def _print_from_host_copy():
    from torch import _tensor_str

    original = _tensor_str._tensor_str
    if getattr(original, "_neuron", False):
        return

    def _format(self, indent):
        # Only index_select's refusal is caught (inside): an earlier kernel's error raised by the
        # copy must reach the caller, not be consumed here.
        host = _host_copy_for_printing(self)
        return original(self if host is None else host, indent)

    _format._neuron = True
    _format._original = original
    _tensor_str._tensor_str = _format
    _applied.append("print_from_host_copy")


def _linear_cross_entropy_accumulation():
    from torch.nn.modules import linear_cross_entropy_options as lce

    cls = lce.LinearCrossEntropyOptions
    original = cls.__dict__["_resolve_auto_acc_dtype"].__func__
    if getattr(original, "_neuron", False):
        return

    def _resolve_auto_acc_dtype(dtype, device):
        if device is not None and device.type == "neuron" and dtype in (torch.float16, torch.bfloat16):
            return torch.float32
        return original(dtype, device)

    _resolve_auto_acc_dtype._neuron = True
    cls._resolve_auto_acc_dtype = staticmethod(_resolve_auto_acc_dtype)
    for dtype in (torch.bfloat16, torch.float16):
        if ("cpu", dtype) in lce._AUTO_DEFAULTS:
            lce._AUTO_DEFAULTS.setdefault(("neuron", dtype), lce._AUTO_DEFAULTS[("cpu", dtype)])
    _applied.append("linear_cross_entropy_accumulation")


def _multi_backend_default():
    import inspect

    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    original = c10d._new_process_group_helper
    if getattr(original, "_neuron", False):
        return
    signature = inspect.signature(original)

    def _new_process_group_helper(*args, **kwargs):
        pg, store = original(*args, **kwargs)
        backend = str(signature.bind(*args, **kwargs).arguments.get("backend", ""))
        if ("," in backend or ":" in backend) and pg is not None and pg is not c10d.GroupMember.NON_GROUP_MEMBER:
            values = c10d.BackendConfig(dist.Backend(backend)).get_device_backend_map().values()
            if "neuron" in values and dist.Backend.NCCL not in values:
                pg._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
        return pg, store

    _new_process_group_helper._neuron = True
    c10d._new_process_group_helper = _new_process_group_helper
    _applied.append("multi_backend_default")


def apply():
    """Applies every adjustment once; on an unchecked torch version, warns and applies none."""
    if _applied:
        return
    if not torch.__version__.startswith(_CHECKED):
        warnings.warn(
            f"torch_neuronx: torch {torch.__version__} is not a version its PyTorch adjustments were checked "
            f"against ({', '.join(v + 'x' for v in _CHECKED)}); FlexAttention, linear_cross_entropy, "
            "out_dtype, Inductor on neuron graphs, RNG-state replay, printing, traced convolution layouts and "
            "multi-backend process groups keep PyTorch's own device rules on neuron. Install torch==2.13.0.",
            stacklevel=2,
        )
        return
    for adjust in (_flex_attention_device, _higher_order_autocast, _linear_cross_entropy_accumulation,
                   _multi_backend_default, _out_dtype_int_mm, _inductor_on_neuron, _rng_state_higher_order_ops,
                   _print_from_host_copy, _conv_memory_format):
        try:
            adjust()
        except (AttributeError, ImportError, KeyError) as e:  # torch moved something: say which
            warnings.warn(f"torch_neuronx: PyTorch adjustment {adjust.__name__[1:]} not applied: {e!r}",
                          stacklevel=2)
