"""Moving sample inputs to neuron and comparing neuron results with CPU results."""
import math

import torch

DEVICE = "neuron"


class Mismatch(AssertionError):
    """A neuron result differs from the CPU result; ``max_error`` is the largest absolute difference."""

    def __init__(self, msg, max_error=None):
        super().__init__(msg)
        self.max_error = max_error


def to_device(t, device=DEVICE):
    """Copy a tensor to ``device`` keeping its strides, storage offset, conj/neg bits and
    requires_grad, so a strided or offset sample stays strided on the other device."""
    if not isinstance(t, torch.Tensor):
        return t
    rg = t.requires_grad
    t = t.detach()
    if t.device.type == "meta":
        return t  # error inputs use meta tensors as such
    if t.layout != torch.strided:
        return t.to(device).requires_grad_(rg)
    if t.is_conj():
        return _leaf(to_device(t.conj(), device).conj(), rg)
    if t.is_neg():
        return _leaf(torch._neg_view(to_device(torch._neg_view(t), device)), rg)
    if t.is_contiguous() and t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t.to(device).requires_grad_(rg)
    n = t.untyped_storage().nbytes() // max(t.element_size(), 1)
    flat = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), 0, (n,), (1,))
    out = flat.to(device).as_strided(t.size(), t.stride(), t.storage_offset())
    return _leaf(out, rg)


def to_cpu(t):
    return to_device(t, "cpu")


def _is_device_arg(v):
    return (isinstance(v, torch.device) and v.type == DEVICE) or (
        isinstance(v, str) and (v == DEVICE or v.startswith(DEVICE + ":")))


def map_sample(sample, tensor_fn, device):
    """``sample`` with every tensor mapped by ``tensor_fn`` and every ``neuron`` device argument
    replaced by ``device`` (factory ops take their device as an argument)."""
    memo = {}  # a tensor passed twice stays one tensor (gradients accumulate into it)

    def m(v):
        if isinstance(v, torch.Tensor):
            if id(v) not in memo:
                with torch.no_grad():
                    memo[id(v)] = (v, tensor_fn(v))
            return memo[id(v)][1]
        if _is_device_arg(v):
            return torch.device(device) if isinstance(v, torch.device) else device
        if isinstance(v, list):
            return [m(x) for x in v]
        if isinstance(v, tuple) and not hasattr(v, "_fields"):
            return tuple(m(x) for x in v)
        if isinstance(v, dict):
            return {k: m(x) for k, x in v.items()}
        return v

    return type(sample)(m(sample.input), args=m(sample.args), kwargs=m(sample.kwargs),
                        output_process_fn_grad=sample.output_process_fn_grad,
                        broadcasts_input=sample.broadcasts_input, name=sample.name)


def targets_device(sample):
    """Whether ``sample`` puts the op on neuron (a neuron tensor or device argument); samples of
    factory ops without a device argument produce host tensors on every backend."""
    found = []

    def visit(v):
        if isinstance(v, torch.Tensor):
            found.append(v.device.type == DEVICE)
        elif _is_device_arg(v):
            found.append(True)
        elif isinstance(v, (list, tuple)):
            for x in v:
                visit(x)
        elif isinstance(v, dict):
            for x in v.values():
                visit(x)

    visit([sample.input, sample.args, sample.kwargs])
    return any(found)


def names_host(sample):
    """Whether ``sample`` asks for host results explicitly (``device="cpu"``, e.g. ``new_zeros``)."""
    vals = list(sample.kwargs.values()) + list(sample.args)
    return any((isinstance(v, torch.device) and v.type == "cpu") or v == "cpu" for v in vals
               if isinstance(v, (torch.device, str)))


def sample_to_cpu(sample):
    return map_sample(sample, to_cpu, "cpu")


def untracked(t):
    """A view taken under no_grad of a tensor that requires grad: it reports requires_grad, but
    autograd does not track ops on it (samples built on the device can contain these; a copy to
    the host is a plain leaf, so such inputs are left out of gradient comparisons)."""
    return t.requires_grad and t.grad_fn is None and t._base is not None and t._base.requires_grad


def _leaf(t, rg):
    # A view of a copied storage is a leaf only once detached from its base.
    if rg:
        t = t.detach().requires_grad_(True)
    return t


def memoized(fn):
    """``fn`` over tensors, mapping the same tensor object to the same result."""
    memo = {}

    def g(t):
        if id(t) not in memo:
            memo[id(t)] = (t, fn(t))
        return memo[id(t)][1]
    return g


def tree_map(fn, obj):
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(tree_map(fn, o) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(tree_map(fn, o) for o in obj)
    if isinstance(obj, dict):
        return {k: tree_map(fn, v) for k, v in obj.items()}
    return obj


def tensors_of(obj):
    out = []
    tree_map(lambda t: out.append(t) or t, obj)
    return out


def _bitwise_equal(a, b):
    if a.dtype.is_floating_point or a.dtype.is_complex:
        a = torch.view_as_real(a) if a.is_complex() else a
        b = torch.view_as_real(b) if b.is_complex() else b
        both_nan = a.isnan() & b.isnan()
        return bool(((a == b) | both_nan).all())
    return torch.equal(a, b)


def max_error(a, b):
    """Largest absolute difference between two same-shaped tensors (NaN where exactly one is NaN)."""
    if a.numel() == 0:
        return 0.0
    if a.dtype == torch.bool:
        return float((a != b).sum())
    a64 = a.to(torch.complex128 if a.is_complex() else torch.float64)
    b64 = b.to(a64.dtype)
    d = (a64 - b64).abs()
    both_nan = a64.isnan() & b64.isnan()
    same_inf = (a64 == b64)
    d = torch.where(both_nan | same_inf, torch.zeros_like(d), d)
    return float(d.max())


def assert_same(actual, expected, where="output", check_strides=True, values=True, atol=None, rtol=None,
                host_ok=False, check_bits=True):
    """Compare a neuron result tree with a CPU result tree.

    ``host_ok``: a result may stay on the host where CPU's is (optimizer step counters).
    Returns ``bitwise`` (True when every tensor matched bit for bit). Raises ``Mismatch``.
    """
    bitwise = True
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            raise Mismatch(f"{where}: expected a tensor, got {type(actual).__name__}")
        if actual.device.type != DEVICE and not (host_ok and actual.device.type == expected.device.type):
            raise Mismatch(f"{where}: result is on {actual.device}, expected {DEVICE}")
        if actual.dtype != expected.dtype:
            raise Mismatch(f"{where}: dtype {actual.dtype} vs CPU {expected.dtype}")
        if actual.shape != expected.shape:
            raise Mismatch(f"{where}: shape {tuple(actual.shape)} vs CPU {tuple(expected.shape)}")
        if actual.layout != expected.layout:
            raise Mismatch(f"{where}: layout {actual.layout} vs CPU {expected.layout}")
        if check_strides and expected.layout == torch.strided and expected.numel() > 1:
            if _significant_strides(actual) != _significant_strides(expected):
                raise Mismatch(f"{where}: strides {actual.stride()} vs CPU {expected.stride()}")
        if check_bits and (actual.is_conj() != expected.is_conj() or actual.is_neg() != expected.is_neg()):
            raise Mismatch(f"{where}: conj/neg bit differs from CPU")
        if not values or expected.layout != torch.strided:
            return True
        a = actual.detach().resolve_conj().resolve_neg().cpu()
        e = expected.detach().resolve_conj().resolve_neg()
        if _bitwise_equal(a, e):
            return True
        err = max_error(a, e)
        try:
            torch.testing.assert_close(a, e, equal_nan=True, atol=atol, rtol=rtol, check_stride=False)
        except AssertionError as ex:
            first = str(ex).strip().splitlines()[0]
            raise Mismatch(f"{where}: values differ ({first}); max abs error {err:.3g}", err) from None
        return False
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            raise Mismatch(f"{where}: expected a sequence of {len(expected)}, got {type(actual).__name__}")
        for i, (a, e) in enumerate(zip(actual, expected)):
            bitwise &= assert_same(a, e, f"{where}[{i}]", check_strides, values, atol, rtol, host_ok, check_bits)
        return bitwise
    if isinstance(expected, dict):
        if set(actual) != set(expected):
            raise Mismatch(f"{where}: keys differ")
        for k in expected:
            bitwise &= assert_same(actual[k], expected[k], f"{where}[{k!r}]", check_strides, values, atol, rtol,
                                   host_ok, check_bits)
        return bitwise
    if isinstance(expected, float) and isinstance(actual, float):
        if actual == expected or (math.isnan(actual) and math.isnan(expected)):
            return True
        if values and not math.isclose(actual, expected, rel_tol=1e-5, abs_tol=1e-6):
            raise Mismatch(f"{where}: {actual} vs CPU {expected}", abs(actual - expected))
        return False
    if values and actual != expected:
        raise Mismatch(f"{where}: {actual!r} vs CPU {expected!r}")
    return True


def _significant_strides(t):
    # Strides of size-1 dimensions carry no meaning; PyTorch itself is inconsistent about them.
    return tuple(s for s, n in zip(t.stride(), t.shape) if n != 1)
