"""Random numbers on neuron: with the same seed every random op gives bitwise the values CPU
PyTorch gives (neuron generators are mt19937 like CPU's), state save/restore replays, and
explicit torch.Generator(device="neuron") objects work.
"""
import pytest
import torch
import torch.nn.functional as F

SEED = 1234

CASES = {
    "randn": lambda d: torch.randn(1000, device=d),
    "randn_2d_f64": lambda d: torch.randn(17, 33, device=d, dtype=torch.float64),
    "randn_large": lambda d: torch.randn(100_003, device=d),
    "rand": lambda d: torch.rand(1000, device=d),
    "rand_bf16": lambda d: torch.rand(257, device=d, dtype=torch.bfloat16),
    "rand_large": lambda d: torch.rand(70_001, device=d),
    "randint": lambda d: torch.randint(-50, 100, (1000,), device=d),
    "randint_like": lambda d: torch.randint_like(torch.zeros(64, 3, device=d, dtype=torch.int32), 7),
    "randn_like": lambda d: torch.randn_like(torch.zeros(9, 9, device=d)),
    "randperm": lambda d: torch.randperm(1000, device=d),
    "randperm_small": lambda d: torch.randperm(7, device=d),
    "normal_": lambda d: torch.empty(1000, device=d).normal_(2.0, 3.0),
    "uniform_": lambda d: torch.empty(1000, device=d).uniform_(-2.0, 5.0),
    "normal_tensor": lambda d: torch.normal(torch.arange(100.0, device=d), torch.full((100,), 0.5, device=d)),
    "normal_float_std": lambda d: torch.normal(1.0, torch.linspace(0.1, 2.0, 50, device=d)),
    "bernoulli": lambda d: torch.bernoulli(torch.linspace(0, 1, 1000, device=d)),
    "bernoulli_p": lambda d: torch.empty(1000, device=d).bernoulli_(0.3),
    "dropout": lambda d: F.dropout(torch.ones(40, 50, device=d), 0.5, training=True),
    "dropout_module": lambda d: torch.nn.Dropout(0.2)(torch.arange(600.0, device=d).reshape(20, 30)),
    "multinomial": lambda d: torch.multinomial(torch.linspace(0.1, 1.0, 10, device=d), 5),
    "multinomial_replacement": lambda d: torch.multinomial(torch.ones(3, 10, device=d), 25, replacement=True),
    "exponential_": lambda d: torch.empty(500, device=d).exponential_(2.0),
    "geometric_": lambda d: torch.empty(500, device=d).geometric_(0.3),
    "random_": lambda d: torch.empty(500, device=d, dtype=torch.int64).random_(0, 1000),
    "sequence": lambda d: torch.cat([torch.randn(7, device=d), torch.rand(5, device=d),
                                     torch.randint(0, 9, (11,), device=d).float(), torch.randn(3, device=d)]),
}


def _both(fn, seed=SEED):
    torch.manual_seed(seed)
    c = fn("cpu")
    torch.manual_seed(seed)
    n = fn("neuron")
    assert n.device.type == "neuron"
    return c, n.cpu()


def _assert_bitwise(c, n):
    assert c.dtype == n.dtype and c.shape == n.shape
    if c.is_floating_point():
        assert torch.equal(c.view(torch.int16 if c.element_size() == 2 else
                                  torch.int32 if c.element_size() == 4 else torch.int64),
                           n.view(torch.int16 if n.element_size() == 2 else
                                  torch.int32 if n.element_size() == 4 else torch.int64))
    else:
        assert torch.equal(c, n)


@pytest.mark.parametrize("name", list(CASES))
def test_same_seed_matches_cpu_bitwise(name):
    c, n = _both(CASES[name])
    _assert_bitwise(c, n)


def test_different_seeds_differ():
    torch.manual_seed(1)
    a = torch.randn(100, device="neuron").cpu()
    torch.manual_seed(2)
    b = torch.randn(100, device="neuron").cpu()
    assert not torch.equal(a, b)


def test_neuron_generator_independent_of_cpu_generator():
    torch.manual_seed(SEED)
    first_cpu = torch.randn(10)
    torch.manual_seed(SEED)
    torch.randn(1000, device="neuron")  # draws from the neuron generator only
    assert torch.equal(torch.randn(10), first_cpu)
    torch.manual_seed(SEED)
    first_neuron = torch.randn(10, device="neuron").cpu()
    torch.manual_seed(SEED)
    torch.randn(1000)  # draws from the CPU generator only
    assert torch.equal(torch.randn(10, device="neuron").cpu(), first_neuron)


def test_manual_seed_seeds_all_devices():
    torch.manual_seed(SEED)
    a = torch.rand(100, device="neuron:0").cpu()
    b = torch.rand(100, device="neuron:1").cpu()
    torch.manual_seed(SEED)
    c = torch.rand(100)
    assert torch.equal(a, c) and torch.equal(b, c)
    assert torch.neuron.initial_seed() == SEED


def test_neuron_manual_seed_current_device_only():
    torch.neuron.manual_seed_all(5)
    with torch.neuron.device(1):
        torch.neuron.manual_seed(7)
        assert torch.neuron.initial_seed() == 7
    assert torch.neuron.initial_seed() == 5
    a1 = torch.rand(50, device="neuron:1").cpu()
    a0 = torch.rand(50, device="neuron:0").cpu()
    assert torch.equal(a1, torch.rand(50, generator=torch.Generator().manual_seed(7)))
    assert torch.equal(a0, torch.rand(50, generator=torch.Generator().manual_seed(5)))


def test_get_set_rng_state_replays():
    torch.manual_seed(SEED)
    torch.randn(37, device="neuron")
    state = torch.neuron.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    a = torch.randn(1000, device="neuron").cpu()
    b = torch.empty(100, device="neuron").uniform_().cpu()
    torch.neuron.set_rng_state(state)
    a2 = torch.randn(1000, device="neuron").cpu()
    b2 = torch.empty(100, device="neuron").uniform_().cpu()
    assert torch.equal(a, a2) and torch.equal(b, b2)


def test_rng_state_reflects_queued_draws():
    # The state read after queued (asynchronous) random kernels reflects all of them: restored in a
    # fresh stream (another generator), it continues where CPU's generator continues.
    torch.manual_seed(SEED)
    for n in (5, 1000, 33):
        torch.randn(n, device="neuron")
    state = torch.neuron.get_rng_state()
    g = torch.Generator().manual_seed(SEED)
    for n in (5, 1000, 33):
        torch.randn(n, generator=g)
    other = torch.Generator(device="neuron")
    other.set_state(state)
    assert torch.equal(torch.rand(100, device="neuron", generator=other).cpu(), torch.rand(100, generator=g))


def test_set_rng_state_from_cpu_state():
    g = torch.Generator().manual_seed(99)
    torch.randn(11, generator=g)
    torch.neuron.set_rng_state(g.get_state())
    assert torch.equal(torch.randn(64, device="neuron").cpu(), torch.randn(64, generator=g))


def test_get_set_rng_state_all():
    states = torch.neuron.get_rng_state_all()
    assert len(states) == torch.neuron.device_count()
    a = [torch.rand(20, device=f"neuron:{i}").cpu() for i in range(len(states))]
    torch.neuron.set_rng_state_all(states)
    b = [torch.rand(20, device=f"neuron:{i}").cpu() for i in range(len(states))]
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_rng_state_per_device():
    torch.manual_seed(SEED)
    s1 = torch.neuron.get_rng_state(1)
    torch.rand(100, device="neuron:0")
    assert torch.equal(torch.neuron.get_rng_state(1), s1)
    assert not torch.equal(torch.neuron.get_rng_state(0), s1)


def test_torch_generator_on_neuron():
    g = torch.Generator(device="neuron")
    assert g.device.type == "neuron"
    g.manual_seed(7)
    assert g.initial_seed() == 7
    gc = torch.Generator().manual_seed(7)
    assert torch.equal(torch.randn(50, device="neuron", generator=g).cpu(), torch.randn(50, generator=gc))
    assert torch.equal(torch.rand(50, device="neuron", generator=g).cpu(), torch.rand(50, generator=gc))
    assert torch.equal(torch.randperm(30, device="neuron", generator=g).cpu(), torch.randperm(30, generator=gc))
    assert torch.equal(torch.empty(40, device="neuron").normal_(generator=g).cpu(),
                       torch.empty(40).normal_(generator=gc))
    assert torch.equal(torch.multinomial(torch.ones(10, device="neuron"), 4, generator=g).cpu(),
                       torch.multinomial(torch.ones(10), 4, generator=gc))


def test_explicit_generator_does_not_touch_default():
    torch.manual_seed(SEED)
    s = torch.neuron.get_rng_state()
    g = torch.Generator(device="neuron").manual_seed(3)
    torch.randn(100, device="neuron", generator=g)
    assert torch.equal(torch.neuron.get_rng_state(), s)


def test_generator_state_roundtrip():
    g = torch.Generator(device="neuron").manual_seed(11)
    st = g.get_state()
    a = torch.randn(30, device="neuron", generator=g).cpu()
    g.set_state(st)
    b = torch.randn(30, device="neuron", generator=g).cpu()
    assert torch.equal(a, b)


def test_generator_for_other_device():
    g = torch.Generator(device="neuron:1").manual_seed(4)
    assert g.device == torch.device("neuron", 1)
    x = torch.rand(25, device="neuron:1", generator=g)
    assert torch.equal(x.cpu(), torch.rand(25, generator=torch.Generator().manual_seed(4)))


def test_default_generators_tuple():
    gens = torch.neuron.default_generators
    assert len(gens) == torch.neuron.device_count()
    gens[0].manual_seed(21)
    assert torch.equal(torch.rand(10, device="neuron:0").cpu(), torch.rand(10, generator=torch.Generator().manual_seed(21)))


def test_seed_is_nondeterministic_but_replayable():
    torch.neuron.seed()
    s = torch.neuron.initial_seed()
    a = torch.rand(20, device="neuron").cpu()
    torch.neuron.manual_seed(s)
    assert torch.equal(torch.rand(20, device="neuron").cpu(), a)


def test_random_values_on_side_stream_match_cpu():
    torch.manual_seed(SEED)
    with torch.neuron.stream(torch.neuron.Stream()):
        n = torch.randn(500, device="neuron")
        n2 = torch.rand(500, device="neuron")
    torch.neuron.synchronize()
    torch.manual_seed(SEED)
    assert torch.equal(n.cpu(), torch.randn(500))
    assert torch.equal(n2.cpu(), torch.rand(500))


_SEEDING_THREADS = r"""
import threading, time, torch, torch_neuronx
stop = time.monotonic() + 3.0
rounds, errors = [0] * 8, []
def work(t):
    dev = torch.device("neuron", t % torch.neuron.device_count())
    try:
        with torch.neuron.device(dev), torch.neuron.stream(torch.neuron.Stream(dev)):
            while time.monotonic() < stop:
                torch.manual_seed(t)                 # every device's generator, from every thread
                x = torch.rand(256, 256, device=dev)  # random kernels queued behind other threads' work
                y = (x @ x).relu().sum()
                torch.neuron.get_rng_state(dev)
                y.item()
                rounds[t] += 1
    except BaseException as e:
        errors.append(repr(e))
ts = [threading.Thread(target=work, args=(t,), daemon=True) for t in range(8)]
[t.start() for t in ts]
[t.join(60) for t in ts]
print(sum(t.is_alive() for t in ts), min(rounds), errors)
"""


def test_threads_seeding_while_others_queue_work_do_not_deadlock():
    # Seeding used to wait for the queues while holding the generator's mutex (taken by Python's
    # generator methods with the GIL held) and dropping the GIL: two threads deadlocked in seconds.
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", _SEEDING_THREADS], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    alive, fewest, errors = r.stdout.strip().splitlines()[-1].split(" ", 2)
    assert alive == "0" and int(fewest) >= 1 and errors == "[]", r.stdout


def test_seeding_with_random_kernels_queued_keeps_program_order():
    # Kernels queued before manual_seed draw from the old state, kernels after it from the new.
    torch.manual_seed(5)
    cpu_a = torch.rand(1000)
    torch.manual_seed(6)
    cpu_b = torch.rand(1000)
    big = torch.randn(512, 512, device="neuron")
    for _ in range(20):
        big = big @ big / 512  # keeps the queue busy
    torch.manual_seed(5)
    a = torch.rand(1000, device="neuron")
    torch.manual_seed(6)  # a is still queued
    b = torch.rand(1000, device="neuron")
    assert torch.equal(a.cpu(), cpu_a) and torch.equal(b.cpu(), cpu_b)


def _seed_offset(state):
    assert state.dtype == torch.uint8 and state.numel() == 16
    seed, offset = state.view(torch.int64).tolist()
    return seed, offset


def test_state_is_seed_and_offset_in_32_bit_draws():
    # CUDA's layout (seed, offset), so that code moving a device generator's offset works (DTensor's
    # random-number tracker); the offset is the mt19937 stream position.
    torch.manual_seed(SEED)
    assert _seed_offset(torch.neuron.get_rng_state()) == (SEED, 0)
    torch.rand(1000, device="neuron")                       # one draw per float32 element
    assert _seed_offset(torch.neuron.get_rng_state()) == (SEED, 1000)
    torch.rand(10, device="neuron", dtype=torch.float64)    # two per float64 element
    assert _seed_offset(torch.neuron.get_rng_state()) == (SEED, 1020)
    torch.rand(700_001, device="neuron")                    # many mt19937 blocks, counted exactly
    assert _seed_offset(torch.neuron.get_rng_state()) == (SEED, 701_021)
    g = torch.Generator(device="neuron").manual_seed(3)
    torch.rand(77, device="neuron", generator=g)
    assert g.get_offset() == 77 and g.initial_seed() == 3


def test_offset_positions_the_stream():
    full = torch.rand(5000, generator=torch.Generator().manual_seed(SEED))
    for offset in (0, 1, 623, 624, 625, 4000, 1248):  # around block edges, forwards and back
        torch.neuron.set_rng_state(torch.tensor([SEED, offset]).view(torch.uint8))
        assert torch.equal(torch.rand(1000, device="neuron").cpu()[: 5000 - offset], full[offset:offset + 1000]), offset
    g = torch.Generator(device="neuron").manual_seed(SEED)
    g.set_offset(2500)
    assert torch.equal(torch.rand(100, device="neuron", generator=g).cpu(), full[2500:2600])
    assert g.get_offset() == 2600
    # A new seed in the state restarts the stream there.
    torch.neuron.set_rng_state(torch.tensor([SEED + 1, 10]).view(torch.uint8))
    assert torch.equal(torch.rand(5, device="neuron").cpu(), torch.rand(15, generator=torch.Generator().manual_seed(SEED + 1))[10:])


def test_state_round_trip_keeps_a_cached_normal_sample():
    # Small normal ops draw in pairs and cache the second value (as on CPU): a state read and set back
    # restores it, so fork_rng and checkpoint recomputation replay exactly what CPU would.
    torch.manual_seed(SEED)
    g = torch.Generator().manual_seed(SEED)
    torch.randn(3, device="neuron")
    torch.randn(3, generator=g)
    s = torch.neuron.get_rng_state()
    a = torch.randn(5, device="neuron").cpu()
    torch.neuron.set_rng_state(s)
    b = torch.randn(5, device="neuron").cpu()
    assert torch.equal(a, b) and torch.equal(a, torch.randn(5, generator=g))


def test_a_cpu_generator_state_is_accepted():
    g = torch.Generator().manual_seed(99)
    torch.randn(11, generator=g)
    torch.neuron.set_rng_state(g.get_state())
    _, offset = _seed_offset(torch.neuron.get_rng_state())
    assert offset == 0  # the stream continues from that state, counted from there
    torch.rand(64, device="neuron")
    assert _seed_offset(torch.neuron.get_rng_state())[1] == 64
    with pytest.raises(RuntimeError, match="uint8"):
        torch.neuron.set_rng_state(torch.zeros(2, dtype=torch.int64))


@pytest.mark.parametrize("mode", ["non_reentrant", "reentrant", "selective"])
def test_activation_checkpointing_replays_dropout(mode):
    """torch.utils.checkpoint saves and restores the neuron RNG state (it reads the device
    module's `_initialized`), so the recomputed dropout masks are the forward's: gradients equal
    the run without checkpointing, and CPU's with the same seed."""
    import functools

    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op == torch.ops.aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE

    kwargs = {"use_reentrant": mode == "reentrant"}
    if mode == "selective":
        kwargs["context_fn"] = functools.partial(create_selective_checkpoint_contexts, policy)
    grads = {}
    for device in ("cpu", "neuron"):
        torch.manual_seed(0)
        layers = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)]).to(device)
        x = torch.randn(64, 256).to(device).requires_grad_()

        def block(h):
            for layer in layers:
                h = F.dropout(layer(h).relu(), 0.3, training=True)
            return h

        for ckpt in (True, False):
            torch.manual_seed(SEED)
            y = checkpoint(block, x, **kwargs) if ckpt else block(x)
            y.square().sum().backward()
            grads[device, ckpt] = [x.grad.cpu()] + [p.grad.cpu() for p in layers.parameters()]
            x.grad = None
            layers.zero_grad(set_to_none=True)
    assert torch.neuron._initialized
    for a, b in zip(grads["neuron", True], grads["neuron", False]):
        assert torch.equal(a, b)
    for a, b in zip(grads["neuron", True], grads["cpu", True]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def _device_kernel_calls(op):
    import torch_neuronx

    torch.neuron.synchronize()  # (counted when the kernel ran)
    return torch_neuronx.metrics()["ops"].get(op, {}).get("device_kernel", 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, torch.bfloat16, torch.float64, torch.int64])
def test_bernoulli_device_kernel_draws_cpus_stream_at_user_sizes(dtype):
    """bernoulli_(p) runs the device kernel (random_kernels.cpp: mt19937 generated in blocks), with
    CPU's values bit for bit and the stream left where CPU leaves it, across twist boundaries and
    at a GPT-2 attention dropout's size; a layout it does not take runs CPU's kernel, same values."""
    before = _device_kernel_calls("aten::bernoulli_.float")
    for n in (1, 311, 624, 1249, 8 * 6 * 256 * 256):
        for p in (0.0, 0.1, 0.5, 1 - 2 ** -40, 1.0):
            c, d = _both(lambda dev: torch.cat([torch.empty(n, device=dev, dtype=dtype).bernoulli_(p),
                                                torch.rand(3, device=dev).to(dtype)]))  # (and what follows)
            _assert_bitwise(c, d)
    assert _device_kernel_calls("aten::bernoulli_.float") - before == 25
    before = _device_kernel_calls("aten::bernoulli_.float")
    c, d = _both(lambda dev: torch.empty(300, 200, device=dev, dtype=dtype).t().bernoulli_(0.3))
    _assert_bitwise(c, d)
    assert _device_kernel_calls("aten::bernoulli_.float") == before  # (transposed: CPU's kernel)


def test_compiled_dropout_runs_the_device_kernel_with_cpus_masks():
    import torch_neuronx  # noqa: F401

    def fn(x):
        return F.dropout(x * 2, 0.1, training=True) + 1

    x = torch.randn(64, 1024)
    torch.manual_seed(SEED)
    ref = fn(x)
    before = _device_kernel_calls("aten::bernoulli.p")
    f = torch.compile(fn, backend="neuron")
    torch.manual_seed(SEED)
    out = f(x.to("neuron")).cpu()
    assert _device_kernel_calls("aten::bernoulli.p") > before
    assert torch.equal(out == 1, ref == 1)  # the same elements dropped (x * 2 + 1 is never exactly 1 here)
    torch.testing.assert_close(out, ref)  # (the kept ones rounded as the fused loop rounds)
