"""Checks of one OpInfo at one dtype: forward, out=, in-place, non-contiguous, backward and
error inputs, each sample on neuron against the same sample on CPU."""
import contextlib
import warnings

import torch

from .compare import (DEVICE, Mismatch, assert_same, names_host, sample_to_cpu, targets_device, tensors_of,
                      tree_map, untracked)

SEED = 1234

# Ops whose outputs are uninitialized memory: only metadata is comparable.
UNINITIALIZED = {
    "empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted",
    "resize_", "resize_as_",
}

# Categories in the order they run for a sample.
CATEGORIES = ("forward", "out", "inplace", "noncontiguous", "backward", "error_inputs")


def op_key(op):
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def _call(fn, sample, **extra):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(sample.input, *sample.args, **sample.kwargs, **extra)


def _sync():
    torch.neuron.synchronize()


def _run(fn, sample, device, **extra):
    """Run ``fn`` on ``sample`` seeded the same way for both devices; return (result, exception).

    The device run is synchronized inside, so errors raised by queued kernels surface here."""
    torch.manual_seed(SEED)
    try:
        out = _call(fn, sample, **extra)
        if device == DEVICE:
            _sync()
        return out, None
    except Exception as e:  # the op's own error is an outcome, compared with CPU's
        if device == DEVICE:
            with contextlib.suppress(Exception):
                _sync()
        return None, e


def _same_exception(cpu_exc, dev_exc):
    if dev_exc is None:
        raise Mismatch(f"CPU raises {type(cpu_exc).__name__} ({_msg(cpu_exc)}), neuron does not")
    if type(dev_exc) is not type(cpu_exc):
        raise Mismatch(f"neuron raises {type(dev_exc).__name__} ({_msg(dev_exc)}), CPU raises "
                       f"{type(cpu_exc).__name__} ({_msg(cpu_exc)})")
    return "both raise " + type(cpu_exc).__name__


def _msg(e):
    s = str(e).strip().splitlines()
    return (s[0] if s else "")[:200]


class Outcome(Exception):
    """Raised by a check to report a skip."""

    def __init__(self, outcome, detail):
        super().__init__(detail)
        self.outcome = outcome
        self.detail = detail


def _skip(reason):
    raise Outcome("skip", reason)


def counting_eager_graphs(thunk):
    """``thunk`` as a compile check: when it passes but a graph it compiled ran eagerly (the
    compiler refused it), the case's outcome is ``eager``, not a pass: the compile tier did not
    run it."""
    def run():
        from torch_neuronx.compile import compile_metrics

        before = len(compile_metrics()["eager_reasons"])
        result = thunk()
        reasons = compile_metrics()["eager_reasons"][before:]
        if reasons:
            raise Outcome("eager", f"{len(reasons)} graph(s) ran eagerly: {reasons[0]}"[:300])
        return result
    return run


def _compare_results(op, cpu, cpu_exc, dev, dev_exc, where="output", sample=None):
    if cpu_exc is not None:
        return False, _same_exception(cpu_exc, dev_exc)
    if dev_exc is not None:
        raise dev_exc
    values = op.name not in UNINITIALIZED
    host_ok = sample is not None and (not targets_device(sample) or names_host(sample))
    return assert_same(dev, cpu, where, values=values, host_ok=host_ok), None


def check_forward(op, sample):
    cpu_s = sample_to_cpu(sample)  # before anything runs: an op may mutate its input
    cpu, ce = _run(op, cpu_s, "cpu")
    dev, de = _run(op, sample, DEVICE)
    return _compare_results(op, cpu, ce, dev, de, sample=sample)


def check_compile(op, sample):
    """The sample through ``torch.compile(backend="neuron")`` on neuron against eager CPU; a
    graph that ran eagerly makes the outcome ``eager``."""
    return counting_eager_graphs(lambda: _check_compile(op, sample))()


def _check_compile(op, sample):
    cpu_s = sample_to_cpu(sample)
    cpu, ce = _run(op, cpu_s, "cpu")
    if ce is not None:
        _skip("CPU raises: error behaviour is checked in eager mode")
    torch._dynamo.reset()  # each sample compiles afresh (no recompile limit across samples)

    def compiled(inp, *args, **kwargs):
        return op(inp, *args, **kwargs)

    fn = torch.compile(compiled, backend="neuron")
    dev, de = _run(fn, sample, DEVICE)
    if de is not None:
        raise de
    values = op.name not in UNINITIALIZED
    host_ok = not targets_device(sample) or names_host(sample)
    # A compiled graph returns materialized results: a lazily conjugated/negated view in eager
    # (is_conj()/is_neg()) comes back with the same values, resolved (as with Inductor).
    return assert_same(dev, cpu, "compiled output", values=values, host_ok=host_ok, check_bits=False), None


def _empty_outs(result, device):
    if isinstance(result, torch.Tensor):
        return torch.empty(0, dtype=result.dtype, device=device)
    if isinstance(result, (tuple, list)) and result and all(isinstance(r, torch.Tensor) for r in result):
        return tuple(torch.empty(0, dtype=r.dtype, device=device) for r in result)
    return None


def check_out(op, sample):
    if not op.supports_out:
        _skip("op has no out= variant")
    ref, ce = _run(op, sample_to_cpu(sample), "cpu")
    if ce is not None:
        _skip("CPU rejects the sample")
    cpu_out = _empty_outs(ref, "cpu")
    if cpu_out is None:
        _skip("output is not a tensor or tuple of tensors")
    dev_out = _empty_outs(ref, DEVICE)
    cpu_s = sample_to_cpu(sample)
    cpu, ce = _run(op, cpu_s, "cpu", out=cpu_out)
    dev, de = _run(op, sample, DEVICE, out=dev_out)
    bitwise, note = _compare_results(op, cpu, ce, dev, de, "returned")
    if ce is None:
        bitwise &= assert_same(dev_out, cpu_out, "out", values=op.name not in UNINITIALIZED)
    return bitwise, note


def _clone_input(sample):
    # In-place variants mutate sample.input: give each device a private copy.
    inp = tree_map(lambda t: t.clone(), sample.input)
    return type(sample)(inp, args=sample.args, kwargs=sample.kwargs)


def check_inplace(op, sample):
    fn = op.inplace_variant
    if fn is None:
        _skip("op has no in-place variant")
    cpu_s = _clone_input(sample_to_cpu(sample))
    dev_s = _clone_input(sample)
    cpu, ce = _run(fn, cpu_s, "cpu")
    dev, de = _run(fn, dev_s, DEVICE)
    bitwise, note = _compare_results(op, cpu, ce, dev, de, "returned")
    if ce is None:
        bitwise &= assert_same(dev_s.input, cpu_s.input, "self", values=op.name not in UNINITIALIZED)
    return bitwise, note


def check_noncontiguous(op, sample):
    try:
        cpu_s = sample_to_cpu(sample).noncontiguous()
    except Exception as e:  # e.g. sparse CSR inputs have no strides to change
        _skip(f"the sample cannot be made non-contiguous ({type(e).__name__}: {_msg(e)})")
    dev_s = sample.noncontiguous()
    if not any(not t.is_contiguous() for t in tensors_of([cpu_s.input, cpu_s.args, cpu_s.kwargs])):
        _skip("sample has no tensor that can be made non-contiguous")
    cpu, ce = _run(op, cpu_s, "cpu")
    dev, de = _run(op, dev_s, DEVICE)
    return _compare_results(op, cpu, ce, dev, de, sample=dev_s)


def _differentiable_outputs(out):
    return [t for t in tensors_of(out) if t.requires_grad and (t.is_floating_point() or t.is_complex())]


def _grads(op, sample, device, wanted):
    torch.manual_seed(SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = op(sample.input, *sample.args, **sample.kwargs)
        out = sample.output_process_fn_grad(out)
    outs = _differentiable_outputs(out)
    inputs = [t for t, w in zip(tensors_of([sample.input, sample.args, sample.kwargs]), wanted) if w]
    if not outs or not inputs:
        return None
    g = torch.Generator().manual_seed(SEED + 1)
    gos = [torch.randn(o.shape, dtype=o.dtype, generator=g).to(device) for o in outs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        grads = torch.autograd.grad(outs, inputs, gos, allow_unused=True)
    if device == DEVICE:
        _sync()
    return list(grads)


def check_backward(op, sample, dtype):
    if not op.supports_autograd:
        _skip("op does not support autograd")
    if dtype not in op.supported_backward_dtypes("cpu"):
        _skip(f"no backward for {dtype} on CPU")
    cpu_s = sample_to_cpu(sample)
    # Inputs whose gradients are compared, decided on the device sample for both.
    wanted = [t.requires_grad and not untracked(t) for t in tensors_of([sample.input, sample.args, sample.kwargs])]
    try:
        cpu = _grads(op, cpu_s, "cpu", wanted)
    except Exception as e:
        _skip(f"CPU backward raises {type(e).__name__}: {_msg(e)}")
    if cpu is None:
        _skip("no differentiable output or input")
    dev = _grads(op, sample, DEVICE, wanted)
    return assert_same(dev, cpu, "grad", check_strides=False), None


def check_error_input(op, err):
    """The error input must raise on neuron what it raises on CPU, or what the OpInfo declares
    for every device (device mixing and out= aliasing errors have no CPU-only equivalent)."""
    s = err.sample_input
    cpu_s = sample_to_cpu(s)
    _, de = _run(op, s, DEVICE)
    _, ce = _run(op, cpu_s, "cpu")
    if de is not None and isinstance(de, err.error_type):
        return True, None
    if ce is None and de is None:
        return True, f"neither CPU nor neuron raises (OpInfo declares {err.error_type.__name__})"
    if ce is None:
        raise Mismatch(f"neuron raises {type(de).__name__} ({_msg(de)}); the OpInfo declares "
                       f"{err.error_type.__name__} and a CPU copy raises nothing")
    note = _same_exception(ce, de)
    return True, note + f" (OpInfo declares {err.error_type.__name__})"


def cases(op, dtype, max_samples=None, categories=CATEGORIES):
    """Yield ``(case_id, category, thunk)`` for every check of ``op`` at ``dtype``; ``dtype=None``
    yields the op's error inputs (they choose their own dtypes).

    The order is deterministic (samples are generated under a fixed seed) so a worker that
    crashed can resume after the case that killed it."""
    key = op_key(op)
    if dtype is None:
        yield from _error_cases(op, key, max_samples)
        return
    dt = str(dtype).replace("torch.", "")

    def samples(requires_grad):
        torch.manual_seed(SEED)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = []
            for i, s in enumerate(op.sample_inputs(DEVICE, dtype, requires_grad=requires_grad)):
                if max_samples is not None and i >= max_samples:
                    break
                out.append(s)
            return out

    plain = None
    for cat in ("forward", "out", "inplace", "noncontiguous", "compile"):
        if cat not in categories:
            continue
        if plain is None:
            plain = samples(False)
        for i, s in enumerate(plain):
            fn = {"forward": check_forward, "out": check_out, "inplace": check_inplace,
                  "noncontiguous": check_noncontiguous, "compile": check_compile}[cat]
            yield f"{key}|{dt}|{cat}|{i}", cat, (lambda fn=fn, s=s: fn(op, s))
    if "backward" in categories and op.supports_autograd and dtype in op.supported_backward_dtypes("cpu"):
        for i, s in enumerate(samples(True)):
            yield f"{key}|{dt}|backward|{i}", "backward", (lambda s=s: check_backward(op, s, dtype))


def _error_cases(op, key, max_samples):
    torch.manual_seed(SEED)
    try:
        errs = list(op.error_inputs(DEVICE))
    except Exception as e:
        yield f"{key}|any|error_inputs|gen", "error_inputs", (lambda e=e: _raise(e))
        return
    for i, e in enumerate(errs):
        if max_samples is not None and i >= max_samples:
            break
        yield f"{key}|any|error_inputs|{i}", "error_inputs", (lambda e=e: check_error_input(op, e))


def _raise(e):
    raise e
