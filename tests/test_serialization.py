"""torch.save / torch.load and safetensors with neuron tensors and modules."""
import io
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn

DEV = torch.device("neuron")
TWO_DEVICES = torch.neuron.device_count() >= 2


def sample_tensors():
    g = torch.Generator().manual_seed(0)
    return {
        "f32": torch.randn(4, 5, generator=g),
        "f64": torch.randn(3, dtype=torch.float64, generator=g),
        "bf16": torch.randn(2, 3, generator=g).bfloat16(),
        "f16": torch.randn(6, generator=g).half(),
        "i64": torch.randint(-1000, 1000, (7,), generator=g),
        "u8": torch.randint(0, 255, (3, 3), generator=g, dtype=torch.uint8),
        "bool": torch.randint(0, 2, (5,), generator=g).bool(),
        "c64": torch.randn(2, 2, dtype=torch.complex64, generator=g),
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 4),
    }


def assert_same(actual, expected, device_type):
    assert actual.device.type == device_type, actual.device
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert torch.equal(actual.cpu(), expected.cpu())


def roundtrip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


def make_module():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2))


@pytest.mark.parametrize("map_location", [None, "neuron", "neuron:0", "cpu", torch.device("cpu")], ids=str)
def test_save_load_tensors(map_location):
    cpu = sample_tensors()
    dev = {k: v.to(DEV) for k, v in cpu.items()}
    kwargs = {} if map_location is None else {"map_location": map_location}
    loaded = roundtrip(dev, **kwargs)
    expected_type = "cpu" if str(map_location).startswith("cpu") else "neuron"
    assert loaded.keys() == cpu.keys()
    for k in cpu:
        assert_same(loaded[k], cpu[k], expected_type)
        if expected_type == "neuron":
            assert loaded[k].device == torch.device("neuron:0")


def test_load_cpu_checkpoint_to_neuron():
    cpu = sample_tensors()
    loaded = roundtrip(cpu, map_location="neuron")
    for k in cpu:
        assert_same(loaded[k], cpu[k], "neuron")
    # map_location as a function and as a dict
    loaded = roundtrip(cpu, map_location=lambda storage, loc: storage.neuron())
    for k in cpu:
        assert_same(loaded[k], cpu[k], "neuron")
    loaded = roundtrip(cpu, map_location={"cpu": "neuron:0"})
    for k in cpu:
        assert_same(loaded[k], cpu[k], "neuron")


@pytest.mark.parametrize("map_location", [None, "cpu", "neuron"], ids=str)
def test_weights_only(map_location):
    cpu = sample_tensors()
    dev = {k: v.to(DEV) for k, v in cpu.items()}
    obj = {"tensors": dev, "step": 7, "name": "ckpt", "nested": [dev["f32"], (dev["i64"], 1.5)]}
    kwargs = {"weights_only": True}
    if map_location is not None:
        kwargs["map_location"] = map_location
    loaded = roundtrip(obj, **kwargs)
    t = "cpu" if map_location == "cpu" else "neuron"
    for k in cpu:
        assert_same(loaded["tensors"][k], cpu[k], t)
    assert loaded["step"] == 7 and loaded["name"] == "ckpt"
    assert_same(loaded["nested"][0], cpu["f32"], t)
    assert_same(loaded["nested"][1][0], cpu["i64"], t)
    assert loaded["nested"][1][1] == 1.5


def test_storage_sharing_between_views_preserved():
    base = torch.arange(24.0).to(DEV)
    obj = {"base": base, "view": base[4:16].view(3, 4), "t": base.view(4, 6).t(), "other": torch.ones(3, device=DEV)}
    for kw in ({}, {"map_location": "neuron"}, {"weights_only": True}):
        loaded = roundtrip(obj, **kw)
        b, v, t = loaded["base"], loaded["view"], loaded["t"]
        assert b.device.type == "neuron"
        assert v.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        assert t.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        assert loaded["other"].untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
        assert v.storage_offset() == 4 and t.stride() == (1, 6)
        assert torch.equal(v.cpu(), torch.arange(4.0, 16.0).view(3, 4))
        assert torch.equal(t.cpu(), torch.arange(24.0).view(4, 6).t())
        v.fill_(-1)  # writing through the loaded view reaches the loaded base
        expected = torch.arange(24.0)
        expected[4:16] = -1
        assert torch.equal(b.cpu(), expected)
        assert torch.equal(t.cpu(), expected.view(4, 6).t())


def test_save_only_a_view_saves_whole_storage_semantics():
    base = torch.arange(10, dtype=torch.int64).to(DEV)
    v = base[2:5]
    loaded = roundtrip(v)
    assert loaded.device.type == "neuron"
    assert torch.equal(loaded.cpu(), torch.tensor([2, 3, 4]))
    assert loaded.untyped_storage().nbytes() == 10 * 8  # torch.save keeps the whole storage, as on CPU
    assert loaded.storage_offset() == 2


def test_save_load_file(tmp_path):
    cpu = sample_tensors()
    dev = {k: v.to(DEV) for k, v in cpu.items()}
    path = tmp_path / "ckpt.pt"
    torch.save(dev, path)
    for kw, t in (({}, "neuron"), ({"map_location": "cpu"}, "cpu"), ({"map_location": "neuron", "mmap": True}, "neuron"),
                  ({"map_location": "cpu", "mmap": True, "weights_only": True}, "cpu")):
        loaded = torch.load(path, **kw)
        for k in cpu:
            assert_same(loaded[k], cpu[k], t)


def test_saved_file_loads_identically_to_cpu_saved_file(tmp_path):
    # a checkpoint saved from neuron, loaded on CPU, equals one saved from CPU
    cpu = sample_tensors()
    torch.save({k: v.to(DEV) for k, v in cpu.items()}, tmp_path / "dev.pt")
    torch.save(cpu, tmp_path / "cpu.pt")
    a = torch.load(tmp_path / "dev.pt", map_location="cpu")
    b = torch.load(tmp_path / "cpu.pt")
    for k in cpu:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k])


@pytest.mark.skipif(not TWO_DEVICES, reason="needs two neuron devices")
def test_device_index_preserved_and_remapped():
    x = torch.arange(5.0, device="neuron:1")
    loaded = roundtrip(x)
    assert loaded.device == torch.device("neuron:1")
    assert torch.equal(loaded.cpu(), torch.arange(5.0))
    loaded = roundtrip(x, map_location={"neuron:1": "neuron:0"})
    assert loaded.device == torch.device("neuron:0")
    assert torch.equal(loaded.cpu(), torch.arange(5.0))
    loaded = roundtrip(x, map_location="neuron:0")
    assert loaded.device == torch.device("neuron:0")


def test_state_dict_roundtrip():
    m = make_module()
    m(torch.randn(8, 4))  # update BatchNorm running stats
    md = make_module().to(DEV)
    md.load_state_dict(m.state_dict())
    for (k, v), (kd, vd) in zip(m.state_dict().items(), md.state_dict().items()):
        assert k == kd
        assert_same(vd, v, "neuron")
    sd = roundtrip(md.state_dict())
    for k, v in m.state_dict().items():
        assert_same(sd[k], v, "neuron")
    sd_cpu = roundtrip(md.state_dict(), map_location="cpu", weights_only=True)
    fresh = make_module()
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    fresh.load_state_dict(sd_cpu)
    for k, v in m.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v)
    # a neuron module loading a neuron state dict keeps its parameters on neuron and in place
    md2 = make_module().to(DEV)
    ptr = md2[0].weight.data_ptr()
    md2.load_state_dict(sd)
    assert md2[0].weight.device.type == "neuron" and md2[0].weight.data_ptr() == ptr
    x = torch.randn(5, 4)
    m.eval()
    md2.eval()
    torch.testing.assert_close(md2(x.to(DEV)).cpu(), m(x), atol=1e-6, rtol=1e-5)


def test_module_to_and_back():
    m = make_module()
    ref = {k: v.clone() for k, v in m.state_dict().items()}
    r = m.to("neuron")
    assert r is m
    assert all(p.device.type == "neuron" for p in m.parameters())
    assert all(b.device.type == "neuron" for b in m.buffers())
    m.neuron()
    assert all(p.device.type == "neuron" for p in m.parameters())
    m.cpu()
    for k, v in m.state_dict().items():
        assert v.device.type == "cpu" and torch.equal(v, ref[k])
    m.to(DEV, dtype=torch.float64)
    assert m[0].weight.dtype == torch.float64 and m[0].weight.device.type == "neuron"
    assert torch.equal(m[0].weight.cpu(), ref["0.weight"].double())


def test_whole_module_pickle():
    m = make_module().to(DEV).eval()
    loaded = roundtrip(m, weights_only=False)
    assert isinstance(loaded, nn.Sequential)
    assert all(p.device.type == "neuron" for p in loaded.parameters())
    x = torch.randn(3, 4)
    torch.testing.assert_close(loaded(x.to(DEV)).cpu(), m(x.to(DEV)).cpu(), atol=0, rtol=0)
    loaded_cpu = roundtrip(m, weights_only=False, map_location="cpu")
    assert all(p.device.type == "cpu" for p in loaded_cpu.parameters())
    torch.testing.assert_close(loaded_cpu(x), m(x.to(DEV)).cpu(), atol=1e-6, rtol=1e-5)


def test_optimizer_state_dict_save_load():
    m = make_module().to(DEV)
    opt = torch.optim.Adam(m.parameters(), lr=0.01)
    m(torch.randn(8, 4, device=DEV)).sum().backward()
    opt.step()
    sd = roundtrip(opt.state_dict(), weights_only=True)
    for k, st in opt.state_dict()["state"].items():
        for name, v in st.items():
            assert sd["state"][k][name].device == v.device
            assert torch.equal(sd["state"][k][name].cpu(), v.cpu())
    assert sd["param_groups"] == opt.state_dict()["param_groups"]


def test_untyped_storage_roundtrip():
    x = torch.arange(6, dtype=torch.int32).to(DEV)
    s = x.untyped_storage()
    loaded = roundtrip(s).untyped()  # torch.load gives a (byte) TypedStorage back, on CPU too
    assert isinstance(loaded, torch.UntypedStorage)
    assert loaded.device.type == "neuron" and loaded.nbytes() == 24
    t = torch.empty(0, dtype=torch.int32, device=DEV).set_(loaded)
    assert torch.equal(t.cpu(), torch.arange(6, dtype=torch.int32))
    cpu_storage = s.cpu()
    assert cpu_storage.device.type == "cpu"
    assert torch.equal(torch.empty(0, dtype=torch.int32).set_(cpu_storage), torch.arange(6, dtype=torch.int32))


def test_safetensors_from_neuron(tmp_path):
    import safetensors.torch as safetensors_torch  # a test dependency of the project (pyproject [test])

    cpu = {k: v for k, v in sample_tensors().items() if k not in ("c64",)}  # safetensors has no complex dtype in all versions
    dev = {k: v.to(DEV) for k, v in cpu.items()}
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file(dev, str(path))  # safetensors moves each tensor to CPU itself
    loaded = safetensors_torch.load_file(str(path))
    assert loaded.keys() == cpu.keys()
    for k in cpu:
        assert_same(loaded[k], cpu[k], "cpu")
    # the documented way onto neuron: load on CPU, then move
    moved = {k: v.to(DEV) for k, v in safetensors_torch.load_file(str(path), device="cpu").items()}
    for k in cpu:
        assert_same(moved[k], cpu[k], "neuron")
    # bytes API
    blob = safetensors_torch.save({k: v.cpu() for k, v in dev.items()})
    for k, v in safetensors_torch.load(blob).items():
        assert_same(v, cpu[k], "cpu")


def test_safetensors_module_state_dict(tmp_path):
    import safetensors.torch as safetensors_torch

    m = make_module()
    m(torch.randn(8, 4))
    md = make_module().to(DEV)
    md.load_state_dict(m.state_dict())
    path = tmp_path / "m.safetensors"
    safetensors_torch.save_file({k: v.detach().cpu().contiguous() for k, v in md.state_dict().items()}, str(path))
    fresh = make_module().to(DEV)
    missing, unexpected = fresh.load_state_dict(safetensors_torch.load_file(str(path)), strict=True)
    assert not missing and not unexpected
    for k, v in m.state_dict().items():
        assert_same(fresh.state_dict()[k], v, "neuron")


def test_save_while_queue_is_busy_does_not_deadlock():
    # torch.save copies storages to the host with the GIL held, while queued kernels release tensors
    # that Python dropped. Run in a child process so that a deadlock fails this test instead of hanging.
    code = textwrap.dedent("""
        import faulthandler, io, torch
        faulthandler.dump_traceback_later(20, exit=True)  # passes in ~1 s
        big = torch.randn(300, 300, device="neuron")
        x = torch.zeros(10, device="neuron")
        expected = torch.zeros(10)
        for i in range(30):
            big = (big @ big).tanh()  # keeps the queue busy
            x = x * 0.5 + 1           # the old x is dropped while its kernel is queued
            expected = expected * 0.5 + 1
            buf = io.BytesIO()
            torch.save(x, buf)
            buf.seek(0)
            assert torch.equal(torch.load(buf, map_location="cpu"), expected)
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, f"exit code {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"


def test_legacy_format_save_load():
    cpu = {k: v for k, v in sample_tensors().items()}
    dev = {k: v.to(DEV) for k, v in cpu.items()}
    buf = io.BytesIO()
    torch.save(dev, buf, _use_new_zipfile_serialization=False)
    for kw, t in (({}, "neuron"), ({"map_location": "cpu"}, "cpu"), ({"map_location": "neuron", "weights_only": True}, "neuron")):
        buf.seek(0)
        loaded = torch.load(buf, **kw)
        for k in cpu:
            assert_same(loaded[k], cpu[k], t)


def test_truncated_checkpoint_raises_like_a_cpu_one(tmp_path):
    # A checkpoint cut short (a full disk, a killed writer) fails to load with PyTorch's error, as
    # the same checkpoint saved from CPU does; nothing half-loaded reaches the device.
    for device in ("cpu", "neuron"):
        path = tmp_path / f"{device}.pt"
        torch.save({"w": torch.randn(256, 256, device=device), "step": 3}, path)
        whole = path.read_bytes()
        assert torch.equal(torch.load(path, weights_only=True)["w"].cpu(),
                           torch.load(path, weights_only=True, map_location="cpu")["w"])
        errors = []
        for cut in (len(whole) // 2, 10):
            path.write_bytes(whole[:cut])
            with pytest.raises(RuntimeError) as e:
                torch.load(path, weights_only=True)
            errors.append(str(e.value).split("\n")[0])
        if device == "cpu":
            cpu_errors = errors
    assert errors == cpu_errors, (errors, cpu_errors)
