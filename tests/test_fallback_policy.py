"""The eager fallback's policy table (csrc/backend/fallback_policy.cpp): every entry names an
operator this torch registers, says why it is there, and has the effect its flags promise."""
import pytest
import torch
import torch_neuronx

_POLICIES = torch_neuronx._C._fallback_policies()


def test_table_is_not_empty_and_every_entry_has_a_reason():
    assert len(_POLICIES) >= 20
    for op, flags, why in _POLICIES:
        assert flags, op
        assert len(why) > 20, op


@pytest.mark.parametrize("op,flags,why", _POLICIES, ids=[p[0] for p in _POLICIES])
def test_entry_names_a_registered_operator(op, flags, why):
    name, _, overload = op.partition(".")
    registered = torch._C._dispatch_get_all_op_names()
    if overload:
        assert op in registered, f"{op} is not a registered operator: update the policy table"
    else:
        assert name in registered or any(n.startswith(name + ".") for n in registered), (
            f"{op} is not a registered operator: update the policy table")
    if "route_direct" in flags.split(","):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "PrivateUse1")


def test_host_indices_flag_accepts_a_cpu_index_like_cuda():
    x = torch.arange(6.0, device="neuron")
    idx = torch.tensor([4, 1])  # on the host
    assert torch.equal(x[idx].cpu(), torch.tensor([4.0, 1.0]))
    assert torch.equal(x.clone().index_fill_(0, idx, -1).cpu(), torch.arange(6.0).index_fill_(0, idx, -1))
    with pytest.raises(RuntimeError, match="same device"):
        torch.index_select(x, 0, torch.tensor([4, 1]).view(2))  # not in the table: CUDA refuses too


def test_float_values_shape_flag_keys_the_cache_on_values():
    # Same argument types, different lengths: a cache keyed on types alone would reuse a shape.
    for end in (3.5, 7.5, 2.25):
        assert torch.equal(torch.arange(0.0, end, device="neuron").cpu(), torch.arange(0.0, end))


def test_sync_only_flag_runs_synchronously():
    torch_neuronx.reset_metrics()
    x = torch.randn(1, 2, 4, 4, device="neuron")
    out, idx = torch.nn.functional.max_pool2d(x, 2, return_indices=True)
    torch.nn.functional.max_unpool2d(out, idx, 2)
    ops = torch_neuronx.metrics()["ops"]
    assert ops["aten::max_unpool2d"].get("sync", 0) == 1 and "async" not in ops["aten::max_unpool2d"]


def test_eval_stats_empty_flag_matches_cpu_shapes():
    x = torch.randn(4, 3, 5)
    rm, rv = torch.zeros(3), torch.ones(3)
    cpu = torch.ops.aten.native_batch_norm(x, None, None, rm, rv, False, 0.1, 1e-5)
    dev = torch.ops.aten.native_batch_norm(x.to("neuron"), None, None, rm.to("neuron"), rv.to("neuron"), False, 0.1,
                                           1e-5)
    assert [t.shape for t in dev] == [t.shape for t in cpu]
    assert cpu[1].shape == (0,)
    torch.testing.assert_close(dev[0].cpu(), cpu[0])


_BAD_RANDOM_ARGS = {
    "uniform_": lambda t: t.uniform_(3, -1),
    "normal_": lambda t: t.normal_(0, -1),
    "random_": lambda t: t.random_(5, 2),
    "exponential_": lambda t: t.exponential_(-1),
    "geometric_": lambda t: t.geometric_(2),
    "bernoulli_": lambda t: t.bernoulli_(2.0),
    "cauchy_": lambda t: t.cauchy_(0, -1),
    "log_normal_": lambda t: t.log_normal_(0, -1),
}


@pytest.mark.parametrize("name", list(_BAD_RANDOM_ARGS))
def test_probe_scalars_flag_raises_bad_random_arguments_at_the_op(name):
    # The meta kernels accept these arguments; CPU's kernel refuses them. Every call, not only
    # the first of its signature (the arguments are values, not part of the signature).
    with pytest.raises(RuntimeError) as cpu:
        _BAD_RANDOM_ARGS[name](torch.empty(4))
    t = torch.empty(4, device="neuron")
    t.uniform_() if name != "random_" else t.random_(0, 5)  # the signature is known (validated)
    for _ in range(2):
        with pytest.raises(RuntimeError) as dev:
            _BAD_RANDOM_ARGS[name](t)
        assert str(dev.value) == str(cpu.value)
    torch.neuron.synchronize()  # nothing deferred


def test_probe_scalars_flag_leaves_random_streams_alone():
    torch.manual_seed(0)
    want_cpu = torch.rand(3)
    g = torch.Generator("neuron").manual_seed(1)
    want_dev = torch.empty(5, device="neuron").uniform_(generator=g).cpu()
    torch.manual_seed(0)
    g.manual_seed(1)
    got_dev = torch.empty(5, device="neuron").uniform_(generator=g).cpu()
    assert torch.equal(torch.rand(3), want_cpu)  # the probe drew nothing from CPU's generator
    assert torch.equal(got_dev, want_dev)


def test_mask_to_self_flag_raises_at_the_op():
    s = torch.zeros(5, device="neuron")
    mask, src = torch.ones(5, 5, dtype=torch.bool), torch.randn(5, 5)
    with pytest.raises(RuntimeError) as cpu:
        torch.zeros(5).masked_scatter_(mask, src)
    for _ in range(2):
        with pytest.raises(RuntimeError) as dev:
            s.masked_scatter_(mask.to("neuron"), src.to("neuron"))
        assert str(dev.value) == str(cpu.value)
    torch.neuron.synchronize()  # nothing deferred
    m = torch.tensor([True, False, True, False, True], device="neuron")
    assert torch.equal(s.masked_scatter_(m, torch.arange(5.0, device="neuron")).cpu(),
                       torch.zeros(5).masked_scatter_(m.cpu(), torch.arange(5.0)))


def test_probe_scalars_flag_warns_at_the_op_like_cpu():
    import warnings

    def messages(t):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            t.random_(-(2**40), 2**40)  # out of float32's exact range: the kernel warns
        return [str(x.message) for x in w]

    cpu = messages(torch.empty(4))
    t = torch.empty(4, device="neuron")
    t.random_(-(2**40), 2**40)  # first call of the signature (runs inline)
    for _ in range(2):  # queued calls warn at the op too, once, as CPU does
        assert messages(t) == cpu and len(cpu) >= 1


def test_host_copy_flags_copy_quantized_tensors_both_ways():
    q = torch.quantize_per_tensor(torch.linspace(-2, 2, 12), 0.05, 3, torch.qint8)
    on_device = q.to("neuron")  # _copy_from: the host copy on the aliases
    assert on_device.device.type == "neuron" and on_device.is_quantized
    back = on_device.cpu()
    assert torch.equal(back.int_repr(), q.int_repr()) and back.q_scale() == q.q_scale()
    flags = dict((op, f) for op, f, _ in _POLICIES)
    assert flags["aten::_copy_from"] == "host_copy"
    assert flags["aten::_copy_from_and_resize"] == "host_copy,host_copy_resize"
