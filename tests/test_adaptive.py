"""Adaptive eager: queued pointwise ops fused by the device at run time, with eager's exact results.

Groups form from what is queued when the engine takes a kernel; the tests queue a whole run
behind a device-side sleep (``_C._sleep``) so that the engine sees all of it at once.
"""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import torch_neuronx
from torch_neuronx import _C
from helpers import clean_env

DEV = "neuron"


@pytest.fixture
def adaptive():
    before = torch_neuronx.get_execution_mode()
    torch_neuronx.set_execution_mode("adaptive")
    torch_neuronx.reset_metrics()
    yield
    torch.neuron.synchronize()
    torch_neuronx.set_execution_mode(before)


def counts():
    return torch_neuronx.metrics()["adaptive"]


def run_queued(fn, *args):
    """fn(*args) queued behind a device sleep (so the engine sees the run at once); the result on CPU."""
    _C._sleep(20)
    out = fn(*args)
    return out.cpu() if isinstance(out, torch.Tensor) else [o.cpu() for o in out]


def warm(fn, *args):
    """Runs fn twice (the first call of each op signature runs inline), then waits for the kernels
    the first sight of its groups started building."""
    for _ in range(2):
        run_queued(fn, *args)
    assert _C._compiler._adaptive_wait_for_builds(300)
    torch_neuronx.reset_metrics()


def same_bits(a, b):
    return bool(((a == b) & (torch.signbit(a) == torch.signbit(b)) | (a.isnan() & b.isnan())).all())


def test_mode_api():
    before = torch_neuronx.get_execution_mode()
    try:
        torch_neuronx.set_execution_mode("adaptive")
        assert torch_neuronx.get_execution_mode() == "adaptive"
        torch_neuronx.set_execution_mode("eager")
        assert torch_neuronx.get_execution_mode() == "eager"
        with pytest.raises(RuntimeError, match="unknown mode 'fast'.*'eager' and 'adaptive'"):
            torch_neuronx.set_execution_mode("fast")
        assert torch_neuronx.get_execution_mode() == "eager"
    finally:
        torch_neuronx.set_execution_mode(before)


def test_environment_variable_sets_the_mode():
    code = "import torch, torch_neuronx; print(torch_neuronx.get_execution_mode())"
    for value, expected in (("adaptive", "adaptive"), (None, "eager")):
        env = clean_env(**({"TORCH_NEURONX_EXECUTION_MODE": value} if value else {}))
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == expected


def chain(n):
    def fn(x, b):
        y = x
        for i in range(n):
            y = (y + b) if i % 3 == 0 else (y * 0.75) if i % 3 == 1 else y.relu()
        return y
    return fn


@pytest.mark.parametrize("n", [2, 8, 40])
def test_chain_of_pointwise_ops_is_one_kernel(adaptive, n):
    x, b = torch.randn(512, 1024), torch.randn(512, 1024)
    xd, bd = x.to(DEV), b.to(DEV)
    fn = chain(n)
    warm(fn, xd, bd)
    out = run_queued(fn, xd, bd)
    c = counts()
    assert (c["groups_fused"], c["ops_fused"], c["groups_unfused"]) == (1, n, 0), c
    assert same_bits(out, fn(x, b))


def test_first_sight_runs_unfused_while_the_kernel_builds(adaptive):
    x, b = torch.randn(1000), torch.randn(1000)
    xd, bd = x.to(DEV), b.to(DEV)
    fn = lambda x, b: ((x - b) * b - 0.25).relu() / 3.0 + x  # noqa: E731 (a structure no other test has)
    torch_neuronx.reset_metrics()
    variants = counts()["variants"]
    out = run_queued(fn, xd, bd)  # first calls of each dtype signature run inline: no group then
    c = counts()
    if c["groups_unfused"] == 0:  # (unless an earlier test in this process made those calls)
        out = run_queued(fn, xd, bd)
        c = counts()
    assert c["groups_unfused"] == 1 and c["groups_fused"] == 0 and c["variants"] == variants + 1, c
    assert same_bits(out, fn(x, b))
    assert _C._compiler._adaptive_wait_for_builds(300)
    out = run_queued(fn, xd, bd)
    assert counts()["groups_fused"] == 1
    assert same_bits(out, fn(x, b))


def test_a_cache_directory_others_can_write_stops_builds_not_the_program(adaptive, tmp_path, monkeypatch):
    """Kernels are loaded from the cache directory, so one that is not private is not used: the
    build fails, and the group keeps running op by op with the same results."""
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o777)
    monkeypatch.setenv("TORCH_NEURONX_CACHE_DIR", str(cache))
    x, b = torch.randn(1000), torch.randn(1000)
    xd, bd = x.to(DEV), b.to(DEV)
    fn = lambda x, b: ((b - x) * x + 0.75).abs() * 5.0 - b  # noqa: E731 (a structure no other test has)
    for _ in range(2):
        run_queued(fn, xd, bd)
    assert _C._compiler._adaptive_wait_for_builds(300)
    failures = counts()["build_failures"]
    torch_neuronx.reset_metrics()
    out = run_queued(fn, xd, bd)
    c = counts()
    assert c["groups_fused"] == 0 and c["groups_unfused"] >= 1, c
    assert same_bits(out, fn(x, b)) and failures >= 1 and not (cache / "kernels").exists()


def test_kernel_builds_run_at_low_priority(adaptive):
    """The builder thread (and so the compiler runs it starts) is at nice 19: a build must not
    take a core from the program's host thread and engine."""
    x = torch.randn(1000, device=DEV)
    warm(lambda x: ((x * 3.0) - x).neg() * 0.5, x)
    nice = []
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/stat") as f:
            nice.append(int(f.read().rsplit(")", 1)[1].split()[16]))  # field 19: nice
    assert 19 in nice and os.getpriority(os.PRIO_PROCESS, 0) == 0, nice


def test_host_read_splits_the_group(adaptive):
    x, b = torch.randn(4096), torch.randn(4096)
    xd, bd = x.to(DEV), b.to(DEV)

    def fn(x, b):
        y = ((x + b) * 0.5).relu() + b
        mid = y.cpu()  # a host read: the device runs what is queued before returning
        _C._sleep(20)
        z = ((y - b) * 2.0).relu() - x
        return mid, z

    for _ in range(3):
        _C._sleep(20)
        mid, z = fn(xd, bd)  # (held, as below: whether z is written is part of the structure)
        assert _C._compiler._adaptive_wait_for_builds(300)
    torch.neuron.synchronize()
    torch_neuronx.reset_metrics()
    _C._sleep(20)
    mid, z = fn(xd, bd)
    z = z.cpu()
    c = counts()
    assert (c["groups_fused"], c["ops_fused"]) == (2, 8), c
    y = ((x + b) * 0.5).relu() + b
    assert same_bits(mid, y) and same_bits(z, ((y - b) * 2.0).relu() - x)


def test_live_intermediates_are_written(adaptive):
    x, b = torch.randn(3000), torch.randn(3000)
    xd, bd = x.to(DEV), b.to(DEV)

    def fn(x, b):
        t1 = x * b      # kept by the caller: written
        t2 = t1 + 1.5   # dropped below: its buffer is reused within the group
        t3 = t2.relu()
        del t2
        t4 = t3 * t1
        return t1, t3, t4

    warm(fn, xd, bd)
    outs = run_queued(fn, xd, bd)
    assert counts()["ops_fused"] == 4
    for o, r in zip(outs, fn(x, b)):
        assert same_bits(o, r)


def test_dead_intermediates_are_not_written(adaptive):
    x, b = torch.randn(5000), torch.randn(5000)
    xd, bd = x.to(DEV), b.to(DEV)

    def fn(x, b):
        t1 = x * b      # returned: written
        t2 = t1 + 1.5   # dropped before the group runs: not written
        t3 = t2.relu()  # returned: written
        del t2
        return t1, t3

    warm(fn, xd, bd)
    outs = run_queued(fn, xd, bd)
    c = counts()
    assert (c["groups_fused"], c["ops_fused"], c["dead_not_written"]) == (1, 3, 1), c
    for o, r in zip(outs, fn(x, b)):
        assert same_bits(o, r)
    # The same ops with the intermediate kept: another variant, which writes it.
    keep = []

    def fn_live(x, b):
        t1 = x * b
        t2 = t1 + 1.5
        t3 = t2.relu()
        keep.append(t2)
        return t1, t3

    warm(fn_live, xd, bd)
    outs = run_queued(fn_live, xd, bd)
    c = counts()
    assert (c["groups_fused"], c["ops_fused"], c["dead_not_written"]) == (1, 3, 0), c
    assert same_bits(keep[-1].cpu(), x * b + 1.5)


def test_dropped_output_read_by_a_later_kernel_is_written(adaptive):
    """Queued kernels do not own their operands: a tensor Python dropped after queueing a reader
    outside the group is not dead."""
    x, b = torch.randn(5000), torch.randn(5000)
    xd, bd = x.to(DEV), b.to(DEV)

    def fn(x, b):
        t1 = x * b
        t2 = (t1 * 2.0).relu()
        e = t1.exp()  # not fused: ends the group, and reads t1 after it
        del t1
        return t2, e

    warm(fn, xd, bd)
    outs = run_queued(fn, xd, bd)
    c = counts()
    assert (c["groups_fused"], c["ops_fused"], c["dead_not_written"]) == (1, 3, 0), c
    for o, r in zip(outs, fn(x, b)):
        assert same_bits(o, r)


def test_in_place_updates_fuse(adaptive):
    # An optimizer-style update: in-place ops on the same buffers, a scalar per step.
    g = torch.Generator().manual_seed(0)
    p, m, grad = (torch.randn(100_000, generator=g) for _ in range(3))
    pd, md, gd = p.to(DEV), m.to(DEV), grad.to(DEV)

    def step(p, m, grad, lr):
        m.mul_(0.9).add_(grad)
        p.sub_(m * lr)
        p.mul_(0.999)
        return p

    for lr in (0.1, 0.05):  # first calls run inline; first sight of the group
        run_queued(step, pd, md, gd, lr)
        step(p, m, grad, lr)
    assert _C._compiler._adaptive_wait_for_builds(300)
    torch_neuronx.reset_metrics()
    for lr in (0.01, 0.02, 0.03):  # scalars are arguments: one kernel for every lr
        out = run_queued(step, pd, md, gd, lr)
        step(p, m, grad, lr)
        assert same_bits(out, p) and same_bits(md.cpu(), m)
    c = counts()
    assert c["groups_fused"] == 3 and c["ops_fused"] == 15 and c["groups_unfused"] == 0, c


SPECIAL = torch.tensor([0.0, -0.0, 1.0, -1.0, float("inf"), -float("inf"), float("nan"), 1e-40, -1e-40, 3.4e38,
                        -3.4e38, 1e-7, 88.7, -88.7, 0.5, 2.0])


def exact_ops(dtype=torch.float32):
    key = "eager_exact_bf16" if dtype == torch.bfloat16 else "eager_exact"
    return [o["target"] for o in _C._compiler._op_table() if o[key]]


def call(target, y, b):
    name, _, overload = target[len("aten::"):].partition(".")
    op = getattr(torch.ops.aten, name)
    op = getattr(op, overload) if overload else op.default
    n = len(op._schema.arguments)
    if overload == "Scalar":
        return op(y, 1.25)
    if n >= 2 and op._schema.arguments[1].type.kind() == "TensorType":
        return op(y, b)
    return op(y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# One range; several threads' ranges, each with a tail; a size just under two grains (one range).
@pytest.mark.parametrize("numel", [37, 20_011, 1_000_013])
def test_every_op_the_tier_fuses_rounds_as_eager(adaptive, numel, dtype):
    """The op table's eager_exact ops, each inside a group, bitwise equal to CPU eager (random and
    special values; bfloat16: every op's result rounded as eager rounds it)."""
    ops = exact_ops(dtype)
    assert len(ops) >= 14
    g = torch.Generator().manual_seed(1)
    x = torch.randn(numel, generator=g) * 4
    x[: len(SPECIAL)] = SPECIAL[: numel]
    x, b = x.to(dtype), torch.randn(numel, generator=g).to(dtype)
    xd, bd = x.to(DEV), b.to(DEV)
    failed = []
    for target in ops:
        fn = lambda x, b, t=target: call(t, x - b, b) * b  # noqa: E731
        warm(fn, xd, bd)
        out = run_queued(fn, xd, bd)
        c = counts()
        assert c["groups_fused"] == 1 and c["ops_fused"] == 3, (target, c)
        if not same_bits(out.float(), fn(x, b).float()):
            failed.append(target)
    assert not failed


def test_profiler_shows_the_fused_group(adaptive):
    x, b = torch.randn(2048), torch.randn(2048)
    xd, bd = x.to(DEV), b.to(DEV)
    fn = lambda x, b: (F.silu(x + b) * b).neg()  # noqa: E731
    warm(fn, xd, bd)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        run_queued(fn, xd, bd)
    names = [e.name for e in prof.events()]
    assert "adaptive_fused(aten::add.Tensor, aten::silu, aten::mul.Tensor, aten::neg)" in names, sorted(set(names))


def test_launch_blocking_runs_every_op_alone():
    code = (
        "import torch, torch_neuronx\n"
        "x = torch.randn(1000, device='neuron')\n"
        "for _ in range(3):\n"
        "    y = ((x + x) * 2.0).relu().cpu()\n"
        "m = torch_neuronx.metrics()['adaptive']\n"
        "print(m['groups_fused'] + m['groups_unfused'])\n")
    env = clean_env(TORCH_NEURONX_EXECUTION_MODE="adaptive", NEURON_LAUNCH_BLOCKING=1)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0"


def mlp_step():
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.SiLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 10))
    g = torch.Generator().manual_seed(1)
    return model, lambda: (torch.randn(64, 256, generator=g), torch.randint(0, 10, (64,), generator=g)), F.cross_entropy


def example_mlp():  # examples/train.py's classifier (GELU, dropout)
    from torch_neuronx.testing.models import MLP, classification_data
    data = classification_data(n=256)
    it = iter(torch.utils.data.DataLoader(data, batch_size=64))
    return MLP(), lambda: next(it), F.cross_entropy


def example_transformer():  # examples/train.py's language model
    from torch_neuronx.testing.models import TinyTransformerLM, language_data
    it = iter(torch.utils.data.DataLoader(language_data(n=256), batch_size=32))

    def loss(out, t):
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), t.reshape(-1))
    return TinyTransformerLM(), lambda: next(it), loss


def nanogpt():  # the bench's training step, smaller
    from torch_neuronx.testing.models import NanoGPT
    g = torch.Generator().manual_seed(3)
    tokens = lambda: torch.randint(0, 1024, (2, 128), generator=g)  # noqa: E731

    def loss(out, t):
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), t.reshape(-1))
    return NanoGPT(vocab=1024, d=128, layers=2, heads=4, seq=128), lambda: (tokens(), tokens()), loss


@pytest.mark.parametrize("make,autocast", [(mlp_step, False), (example_mlp, False), (example_transformer, False),
                                          (nanogpt, False), (nanogpt, True)])
def test_training_is_bitwise_eager(adaptive, make, autocast):
    """Three training steps (AdamW) in adaptive mode: every loss, gradient and parameter bitwise
    equal to the same steps in eager mode on neuron (dropout included: the same random draws;
    also under bfloat16 autocast)."""
    def train(mode):
        torch_neuronx.set_execution_mode(mode)
        torch.manual_seed(0)
        model, batch, criterion = make()
        model = model.to(DEV)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)  # per-tensor ops: they fuse
        record = []
        for _ in range(3):
            x, t = (v.to(DEV) for v in batch())
            with torch.autocast(DEV, dtype=torch.bfloat16, enabled=autocast):
                loss = criterion(model(x), t)
            opt.zero_grad()
            loss.backward()
            record.append(loss.detach().cpu())
            record += [p.grad.cpu() for p in model.parameters()]
            opt.step()
        record += [p.detach().cpu() for p in model.parameters()]
        return record

    eager = train("eager")
    first = train("adaptive")
    assert _C._compiler._adaptive_wait_for_builds(300)
    torch_neuronx.reset_metrics()
    again = train("adaptive")  # with the kernels built
    assert counts()["ops_fused"] > 0
    assert len(eager) == len(first) == len(again)
    for a, b, c in zip(eager, first, again):
        assert same_bits(a, b) and same_bits(a, c)
