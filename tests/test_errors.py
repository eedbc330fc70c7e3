"""Errors: device mismatches (CUDA's wording), 0-dim CPU scalars, asynchronous kernel failures
surfacing at the next synchronization (and at the op with NEURON_LAUNCH_BLOCKING=1), unsupported
tensor kinds (nested), invalid device indices.
"""
import contextlib
import json
import subprocess
import sys
import textwrap

import pytest
import torch
from helpers import clean_env

_SAME_DEVICE = "Expected all tensors to be on the same device"


def _drain():
    """Report and clear any error left on the devices; returns the messages."""
    msgs = []
    for d in range(torch.neuron.device_count()):
        try:
            torch.neuron.synchronize(d)
        except RuntimeError as e:
            msgs.append(str(e))
    return msgs


@pytest.fixture(autouse=True)
def _no_leftover_errors():
    # Start every test on healthy devices, and do not let one test's deferred error leak into
    # the next: a test that expects no deferred error asserts it itself.
    _drain()
    yield
    _drain()


def _assert_device_healthy(device="neuron", drain=True):
    """Work on the current stream of `device` gives right results; with drain, no error is
    pending anywhere (device synchronize of every device)."""
    x = torch.arange(10, dtype=torch.float32, device=device)
    assert torch.equal((x * 2 + 1).cpu(), torch.arange(10, dtype=torch.float32) * 2 + 1)
    if drain:
        assert _drain() == []


# --------------------------------------------------------------------------- device mismatch


_MIXED = {
    "add": lambda n, c: n + c,
    "add_reversed": lambda n, c: c + n,
    "mul_": lambda n, c: n.clone().mul_(c),
    "cpu_inplace_with_neuron": lambda n, c: c.clone().add_(n),
    "matmul": lambda n, c: n.reshape(2, 3) @ c.reshape(3, 2),
    "cat": lambda n, c: torch.cat([n, c]),
    "stack": lambda n, c: torch.stack([n, c]),
    "where": lambda n, c: torch.where(n > 0, n, c),
    "out_on_cpu": lambda n, c: torch.add(n, n, out=c),
    "index_add_": lambda n, c: torch.zeros(6, device="neuron").index_add_(0, torch.tensor([0, 1]), c[:2]),
    "maximum": lambda n, c: torch.maximum(n, c),
    "lerp": lambda n, c: torch.lerp(n, c, 0.5),
}


@pytest.mark.parametrize("name", list(_MIXED))
def test_mixing_neuron_and_cpu_raises(name):
    n = torch.randn(6, device="neuron")
    c = torch.randn(6)
    with pytest.raises(RuntimeError) as ei:
        _MIXED[name](n, c)
    msg = str(ei.value)
    assert _SAME_DEVICE in msg
    assert "neuron:0" in msg and "cpu" in msg
    _assert_device_healthy()


def test_mixing_two_neuron_devices_raises():
    a = torch.ones(4, device="neuron:0")
    b = torch.ones(4, device="neuron:1")
    for fn in (lambda: a + b, lambda: torch.cat([a, b]), lambda: a @ b):
        with pytest.raises(RuntimeError) as ei:
            fn()
        msg = str(ei.value)
        assert _SAME_DEVICE in msg
        assert "neuron:0" in msg and "neuron:1" in msg
    _assert_device_healthy("neuron:0")
    _assert_device_healthy("neuron:1")


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, s: x + s,
        lambda x, s: s * x,
        lambda x, s: x / s,
        lambda x, s: torch.where(x > 0, x, s),
        lambda x, s: torch.clamp(x, max=s),
        lambda x, s: x.clone().add_(s),
        lambda x, s: torch.pow(x, s),
    ],
    ids=["add", "rmul", "div", "where", "clamp", "add_", "pow"],
)
def test_zero_dim_cpu_tensor_is_a_scalar(fn):
    cpu_x = torch.linspace(-2, 2, 9)
    s = torch.tensor(1.5)
    out = fn(cpu_x.to("neuron"), s)
    assert out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), fn(cpu_x, s), rtol=0, atol=0, equal_nan=True)


def test_zero_dim_cpu_int_scalar_type_promotion():
    x = torch.arange(5, dtype=torch.float16)
    s = torch.tensor(3)  # int64 0-dim: does not promote a float16 tensor
    out = x.to("neuron") * s
    assert out.dtype == (x * s).dtype == torch.float16
    assert torch.equal(out.cpu(), x * s)


def test_one_element_cpu_tensor_is_not_a_scalar():
    # Only 0-dim CPU tensors are scalars; a 1-element 1-d tensor is an operand like any other.
    with pytest.raises(RuntimeError, match=_SAME_DEVICE):
        torch.ones(3, device="neuron") + torch.ones(1)


# --------------------------------------------------------------------------- asynchronous kernel errors


def _bad_index_select():
    x = torch.arange(5, dtype=torch.float32, device="neuron")
    idx = torch.tensor([0, 10], device="neuron")
    return torch.index_select(x, 0, idx)  # enqueued: must not raise here


def _cpu_index_error_message():
    with pytest.raises(IndexError) as ei:
        torch.index_select(torch.arange(5.0), 0, torch.tensor([0, 10]))
    return str(ei.value)


def test_async_error_raises_at_synchronize():
    y = _bad_index_select()
    assert y.device.type == "neuron" and y.shape == (2,)
    with pytest.raises(IndexError) as ei:
        torch.neuron.synchronize()
    # IndexError, as CPU raises for this index (the kernel's exception type survives the queue).
    msg = str(ei.value)
    assert "index_select" in msg
    assert _cpu_index_error_message() in msg  # the kernel's own message, as on CPU
    assert "NEURON_LAUNCH_BLOCKING" in msg  # says how to find the faulting op
    # Reported once; the device keeps working.
    torch.neuron.synchronize()
    _assert_device_healthy()


def test_async_error_raises_at_cpu_copy():
    y = _bad_index_select()
    with pytest.raises(IndexError, match="index_select"):
        y.cpu()
    _assert_device_healthy()


def test_async_error_raises_at_item_of_dependent_op():
    y = _bad_index_select()
    with pytest.raises(IndexError) as ei:
        # Later ops on the same stream are skipped and the first failure is reported at the
        # first synchronization: item(), or an op's first (validating) call with new dtypes.
        z = (y * 2).sum()
        z.item()
    assert "index_select" in str(ei.value)
    _assert_device_healthy()


def test_async_error_negative_index():
    x = torch.arange(5.0, device="neuron")
    y = torch.index_select(x, 0, torch.tensor([-7], device="neuron"))
    with pytest.raises(IndexError, match="index_select"):
        y.cpu()
    _assert_device_healthy()


def test_async_error_message_has_no_cpp_backtrace():
    # Python-facing errors read like CPU ones: the kernel's message, not a C++ stack dump.
    _bad_index_select()
    with pytest.raises(IndexError) as ei:
        torch.neuron.synchronize()
    msg = str(ei.value)
    assert "frame #" not in msg
    assert "Exception raised from" not in msg


def test_async_error_on_side_stream_reported_by_its_sync():
    s = torch.neuron.Stream()
    with torch.neuron.stream(s):
        y = _bad_index_select()
        ev = torch.neuron.Event()
        ev.record()
    # Work on the default stream is unaffected, and its synchronization does not report the
    # side stream's error.
    _assert_device_healthy(drain=False)
    torch.neuron.current_stream().synchronize()
    with pytest.raises(IndexError, match="index_select"):
        ev.synchronize()
    s.synchronize()  # already reported
    with torch.neuron.stream(s):
        _assert_device_healthy()
    del y


def test_async_error_on_side_stream_reported_by_stream_sync():
    s = torch.neuron.Stream()
    with torch.neuron.stream(s):
        _bad_index_select()
    with pytest.raises(IndexError, match="index_select"):
        s.synchronize()
    with torch.neuron.stream(s):
        out = torch.ones(3, device="neuron") + 1
    s.synchronize()
    assert torch.equal(out.cpu(), torch.full((3,), 2.0))


def _line_of(marker):
    """This file's line holding `marker` (a comment on the line that queues the failing op)."""
    import inspect
    src = inspect.getsource(inspect.getmodule(_line_of)).splitlines()
    return next(i + 1 for i, text in enumerate(src) if marker in text and "_line_of" not in text)


def test_async_error_names_the_line_that_queued_the_op_through_library_frames():
    # F.embedding's own frames (torch/nn/functional.py) are skipped: the error names this file.
    s = torch.neuron.Stream()
    w = torch.randn(1000, 64, device="neuron")
    ids = (torch.arange(8, device="neuron") * 300)  # computed on the device: the host never saw 2100
    with torch.neuron.stream(s):
        torch.nn.functional.embedding(ids, w)  # origin-marker-embedding
    with pytest.raises(IndexError) as ei:
        s.synchronize()
    assert f"(enqueued at {__file__}:{_line_of('origin-marker-embedding')})" in str(ei.value), str(ei.value)
    _assert_device_healthy()


def test_op_origins_can_be_turned_off():
    script = textwrap.dedent(
        """
        import torch, torch_neuronx
        x = torch.arange(5.0, device="neuron")
        torch.index_select(x, 0, torch.tensor([0, 10], device="neuron"))
        try:
            torch.neuron.synchronize()
        except IndexError as e:
            print("enqueued at" in str(e))
        """
    )
    for value, named in (("0", "False"), ("1", "True")):
        p = subprocess.run([sys.executable, "-c", script], env=clean_env(TORCH_NEURONX_OP_ORIGINS=value),
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0 and p.stdout.split() == [named], (value, p.stdout, p.stderr[-2000:])


def test_async_error_on_other_device():
    with torch.neuron.device(1):
        _bad_index_select()
    _assert_device_healthy("neuron:0", drain=False)  # device 0 is not affected
    torch.neuron.synchronize(0)
    with pytest.raises(IndexError, match="index_select"):
        torch.neuron.synchronize(1)
    _assert_device_healthy("neuron:1")


def test_shape_errors_raise_at_op_like_cpu():
    a, b = torch.randn(2, 3), torch.randn(4, 5)
    with pytest.raises(RuntimeError) as cpu_err:
        a @ b
    with pytest.raises(RuntimeError) as neuron_err:
        a.to("neuron") @ b.to("neuron")
    assert str(neuron_err.value) == str(cpu_err.value)
    with pytest.raises(RuntimeError) as neuron_err:
        torch.ones(3, device="neuron") + torch.ones(4, device="neuron")
    assert "size of tensor a (3) must match the size of tensor b (4)" in str(neuron_err.value)
    assert _drain() == []


def test_dtype_errors_raise_at_op_like_cpu():
    # CPU (and CUDA) reject an unsupported dtype when the op is called, with NotImplementedError.
    x = torch.randn(3)
    with pytest.raises(NotImplementedError) as cpu_err:
        x.bitwise_and(1)
    try:
        with pytest.raises(NotImplementedError) as neuron_err:
            x.to("neuron").bitwise_and(1)
        assert "bitwise_and" in str(neuron_err.value) and "Float" in str(neuron_err.value)
    finally:
        leftover = _drain()
    assert leftover == [], f"the dtype error surfaced later instead: {leftover}"
    assert "Float" in str(cpu_err.value)


def test_launch_blocking_raises_at_op():
    script = textwrap.dedent(
        """
        import json, torch
        res = {}
        x = torch.arange(5, dtype=torch.float32, device="neuron")
        idx = torch.tensor([0, 10], device="neuron")
        try:
            torch.index_select(x, 0, idx)
            res["at_op"] = None
        except IndexError as e:  # CPU's exception type
            res["at_op"] = str(e)
        try:
            torch.neuron.synchronize()
            res["at_sync"] = None
        except RuntimeError as e:
            res["at_sync"] = str(e)
        res["after"] = (torch.arange(4.0, device="neuron") * 3).tolist()
        print(json.dumps(res))
        """
    )
    env = clean_env(NEURON_LAUNCH_BLOCKING=1)
    p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["at_op"] is not None, "NEURON_LAUNCH_BLOCKING=1 did not raise at the faulting op"
    assert "index_select" in r["at_op"]
    assert "index out of range" in r["at_op"]
    assert r["at_sync"] is None  # reported once, at the op
    assert r["after"] == [0.0, 3.0, 6.0, 9.0]


# --------------------------------------------------------------------------- unsupported tensor kinds


def _nested_cpu():
    return torch.nested.nested_tensor([torch.randn(2), torch.randn(3)])


_UNSUPPORTED = {
    "nested_to_neuron": ("nested", lambda: _nested_cpu().to("neuron")),
}


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", list(_UNSUPPORTED))
def test_unsupported_tensor_kind_raises_not_implemented(name):
    feature, fn = _UNSUPPORTED[name]
    try:
        with pytest.raises(NotImplementedError) as ei:
            fn()
        assert feature in str(ei.value).lower()
    finally:
        leftover = _drain()
    assert leftover == [], f"a deferred failure instead of an error at the call: {leftover}"
    _assert_device_healthy()


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("feature,make,use", [
    ("nested", lambda: torch.nested.nested_tensor([torch.randn(2), torch.randn(3)], device="neuron"),
     lambda t: t + 1),
    ("nested", lambda: torch.nested.nested_tensor([torch.randn(2), torch.randn(3)], device="neuron"),
     lambda t: t.cpu()),
], ids=["nested_add", "nested_cpu"])
def test_unsupported_kind_built_by_composite_paths_fails_at_first_use(feature, make, use):
    # Composite constructors assemble these from strided neuron buffers without a
    # neuron kernel ever running; the first op on them names the feature.
    t = make()
    with pytest.raises(NotImplementedError) as ei:
        use(t)
    assert feature in str(ei.value).lower()
    assert _drain() == []
    _assert_device_healthy()


def test_jagged_nested_tensor_works_like_cpu():
    # Jagged nested tensors are a Python subclass over dense buffers, so they are supported.
    nt = torch.nested.nested_tensor([torch.arange(2.0), torch.arange(3.0)], layout=torch.jagged)
    out = (nt.to("neuron") * 2 + 1).sin()
    ref = (nt * 2 + 1).sin()
    for a, b in zip(out.unbind(), ref.unbind()):
        assert a.device.type == "neuron"
        torch.testing.assert_close(a.cpu(), b)


# --------------------------------------------------------------------------- invalid device index


def test_invalid_device_index_clear_error():
    with pytest.raises(RuntimeError) as ei:
        torch.empty(1, device="neuron:7")
    msg = str(ei.value)
    assert "invalid neuron device index 7" in msg
    assert f"{torch.neuron.device_count()} NeuronCore" in msg
    assert "NEURON_RT_VISIBLE_CORES" in msg  # what to check
    _assert_device_healthy()


def test_invalid_device_index_for_copy_and_stream():
    with pytest.raises(RuntimeError, match="invalid neuron device index 7"):
        torch.ones(2).to("neuron:7")
    with pytest.raises(RuntimeError, match="invalid neuron device index 7"):
        torch.neuron.Stream(device=7)
    with pytest.raises(RuntimeError, match="invalid neuron device index 7"):
        torch.Generator(device="neuron:7").manual_seed(0)
    _assert_device_healthy()


def test_negative_device_string_rejected():
    with pytest.raises(RuntimeError):
        torch.empty(1, device="neuron:-2")


def test_host_checkable_kernel_errors_raise_at_the_op_with_cpus_wording():
    # A weight of another dtype: the CPU kernel's check, not a deferred failure at a later op.
    def call(device):
        x = torch.randn(3, 4, device=device).log_softmax(1)
        w = torch.ones(4, dtype=torch.float64, device=device)
        return torch.nn.functional.nll_loss(x, torch.tensor([0, 1, 2], device=device), weight=w)

    with pytest.raises(RuntimeError) as cpu:
        call("cpu")
    for _ in range(2):  # each call, not only the first with these dtypes
        with pytest.raises(RuntimeError) as dev:
            call("neuron")
        assert str(dev.value).split("\n")[0] == str(cpu.value).split("\n")[0]
    assert _drain() == []
    with pytest.raises(RuntimeError, match="narrow\\(\\) cannot be applied to a 0-dim tensor"):
        torch.tensor(1.0, device="neuron").narrow_copy(0, 0, 1)
    assert _drain() == []


# --------------------------------------------------------------------------- index values the host wrote


def _data_dependent_syncs():
    import torch_neuronx

    return torch_neuronx.metrics()["syncs"]["data_dependent"]


_HOST_WRITTEN_INDICES = {
    "from_cpu": lambda v: torch.tensor([0, v], device="neuron"),
    "to_device": lambda v: torch.LongTensor([v]).to("neuron"),
    "full": lambda v: torch.full((4,), v, device="neuron"),
    "ones_then_setitem": lambda v: _ones_with_last(v),
}


def _ones_with_last(v):
    ind = torch.ones(20, dtype=torch.int64, device="neuron")
    ind[-1] = v  # a 0-dim device tensor filled on the host, copied into a view
    return ind


@pytest.mark.parametrize("make", list(_HOST_WRITTEN_INDICES))
@pytest.mark.parametrize("value", [10, -11])
def test_index_the_host_wrote_out_of_range_raises_at_the_op(make, value):
    # CPU raises IndexError at x[idx]; CUDA asserts on the device. Values the host wrote itself
    # (copies from CPU, fills) are known without reading device memory: checked at the op.
    x, ref = torch.arange(10.0, device="neuron"), torch.arange(10.0)
    for op in (lambda t, i: t[i], lambda t, i: t.__setitem__(i, 0.0),
               lambda t, i: t.index_put_((i,), torch.tensor(1.0))):
        idx = _HOST_WRITTEN_INDICES[make](value)
        with pytest.raises(IndexError) as cpu:
            op(ref, idx.cpu())
        with pytest.raises(IndexError) as dev:
            op(x, idx)
        assert str(dev.value) == str(cpu.value)
    assert _drain() == []  # nothing deferred to a later op
    assert torch.equal(x.cpu(), ref)  # written as far as CPU's kernel writes
    _assert_device_healthy()


def test_index_the_host_wrote_in_range_is_not_read():
    x = torch.arange(10.0, device="neuron")
    idx = torch.tensor([0, 9, -10], device="neuron")
    x[idx]  # first call of the signature
    before = _data_dependent_syncs()
    for _ in range(3):
        y = x[idx]
        x[idx] = y
    assert _data_dependent_syncs() == before  # queued, no wait for the index
    assert torch.equal(x[idx].cpu(), torch.tensor([0.0, 9.0, 0.0]))


def test_index_fixed_on_device_after_host_wrote_out_of_range():
    # The host saw 10 written; a kernel then clamped it. The index is read once, found in range,
    # and its range updated: the result is right and the next use does not wait again.
    x = torch.arange(5.0, device="neuron")
    idx = torch.tensor([10, 2], device="neuron").clamp_(0, 4)
    before = _data_dependent_syncs()
    assert torch.equal(x[idx].cpu(), torch.tensor([4.0, 2.0]))
    assert _data_dependent_syncs() == before + 1
    assert torch.equal(x[idx].cpu(), torch.tensor([4.0, 2.0]))
    assert _data_dependent_syncs() == before + 1


def test_index_computed_on_device_out_of_range_raises_at_next_sync():
    # Values only a kernel produced are not read at the op (that would wait for every index):
    # the kernel's IndexError surfaces at the next synchronization, as CUDA's device-side assert.
    x = torch.arange(5.0, device="neuron")
    idx = torch.arange(2, device="neuron") * 10
    y = x[idx]
    with pytest.raises(IndexError, match="out of bounds"):
        y.cpu()
    _assert_device_healthy()
