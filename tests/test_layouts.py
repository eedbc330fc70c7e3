"""Output layouts and strided out= arguments as CPU gives them: channels_last modules keep
channels_last whatever ran before, and a strided out= is written through its strides."""
import copy

import pytest
import torch
import torch.nn as nn

DEV = torch.device("neuron")

MODULES = {
    "ReplicationPad2d": lambda: nn.ReplicationPad2d((1, 2, 3, 1)),
    "ReplicationPad3d": lambda: nn.ReplicationPad3d(1),
    "ReflectionPad2d": lambda: nn.ReflectionPad2d(2),
    "Conv2d": lambda: nn.Conv2d(8, 16, 3),
    "ConvTranspose2d": lambda: nn.ConvTranspose2d(8, 16, 3),
    "GroupNorm": lambda: nn.GroupNorm(2, 8),
    "MaxPool2d": lambda: nn.MaxPool2d(2),
}


@pytest.mark.parametrize("name", list(MODULES))
def test_channels_last_modules_equal_cpu_in_values_and_strides(name):
    torch.manual_seed(0)
    m = MODULES[name]()
    md = copy.deepcopy(m).to(DEV)
    three_d = name.endswith("3d")
    cl = torch.channels_last_3d if three_d else torch.channels_last
    shape = (2, 8, 6, 7, 5) if three_d else (2, 8, 12, 14)
    # Contiguous first (validates the op on the device), then channels_last, then both again:
    # the layout must not depend on what ran before.
    for mf in (torch.contiguous_format, cl, torch.contiguous_format, cl):
        x = torch.randn(shape).to(memory_format=mf)
        want = m(x)
        got = md(x.to(DEV))
        assert got.stride() == want.stride(), (mf, got.stride(), want.stride())
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fn", [
    lambda out: torch.softmax(torch.zeros(5, device=out.device), 0, out=out),
    lambda out: torch.log_softmax(torch.zeros(5, device=out.device), 0, out=out),
    lambda out: torch.full((5,), 3.0, out=out),
    lambda out: torch.ones(5, out=out),
    lambda out: torch.add(torch.arange(5.0, device=out.device), 1, out=out),
], ids=["softmax", "log_softmax", "full", "ones", "add"])
def test_strided_out_is_written_through_its_strides(fn):
    want = torch.full((10,), -1.0)
    fn(want[::2])
    buf = torch.full((10,), -1.0, device=DEV)
    view = buf[::2]
    fn(view)
    assert view.stride() == (2,)
    torch.testing.assert_close(buf.cpu(), want, rtol=0, atol=0)


def test_out_resize_warns_on_every_call_as_on_cpu():
    import warnings

    for device in ("cpu", DEV):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for _ in range(3):
                torch.add(torch.ones(5, device=device), 1, out=torch.empty(3, device=device))
        n = sum("An output with one or more elements was resized" in str(x.message) for x in w)
        assert n >= 3, (device, n)


def test_functional_op_whose_out_form_resizes_gives_cpu_result_and_no_foreign_warning():
    # The eager path runs a functional op through its out= form into device memory; mse_loss's
    # out= kernel grows its output through an intermediate shape, which a device buffer refuses
    # (a typed error the kernel recognises). The op then runs functionally: the user, who called
    # the functional op, sees CPU's result and none of the abandoned out= call's warnings.
    import warnings

    a, b = torch.randn(512, 256), torch.randn(512, 256)
    want = torch.nn.functional.mse_loss(a, b)
    for _ in range(3):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            got = torch.nn.functional.mse_loss(a.to(DEV), b.to(DEV))
            torch.testing.assert_close(got.cpu(), want)
        assert not [x for x in w if "was resized" in str(x.message)], [str(x.message) for x in w]
