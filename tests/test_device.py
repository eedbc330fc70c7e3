"""Device management: availability, device selection, properties, torch.accelerator,
generated Tensor/Module methods, invalid indices and environment handling.

Environment variables are read once per process, so every environment case runs in a
fresh interpreter. All of them are started together (module fixture) to keep the file fast.
"""
import json
import os
import warnings
import subprocess
import sys
import textwrap

import pytest
import torch
from helpers import clean_env

N_DEV = torch.neuron.device_count()

# Each script prints one JSON line as its last line of output.
_PROBE = textwrap.dedent(
    """
    import json, sys
    import torch
    out = {"has_neuron": hasattr(torch, "neuron"),
           "backend_imported": "torch_neuronx" in sys.modules}
    if out["has_neuron"]:
        out["initialized_after_import"] = torch.neuron.is_initialized()
        out["count"] = torch.neuron.device_count()
        out["available"] = torch.neuron.is_available()
        out["accelerator"] = str(torch.accelerator.current_accelerator())
        try:
            props = [torch.neuron.get_device_properties(i) for i in range(out["count"])]
            out["physical"] = [p.physical_core for p in props]
            out["total_memory"] = [p.total_memory for p in props]
            out["mem_get_info"] = [list(torch.neuron.mem_get_info(i)) for i in range(out["count"])]
            x = torch.arange(10, dtype=torch.float32, device="neuron:%d" % (out["count"] - 1))
            out["sum_last_device"] = (x * 2).sum().item()
            out["initialized_after_use"] = torch.neuron.is_initialized()
            out["use_error"] = None
        except Exception as e:  # reported to the test, which decides
            out["use_error"] = [type(e).__name__, str(e)]
        try:
            torch.empty(1, device="neuron")
            out["empty_error"] = None
        except Exception as e:
            out["empty_error"] = [type(e).__name__, str(e)]
        try:
            torch.neuron.init()
            out["init_error"] = None
        except Exception as e:
            out["init_error"] = [type(e).__name__, str(e)]
    print(json.dumps(out))
    """
)

_ENV_CASES = {
    "default": {},
    # Four cores with a small HBM in one process: two independent settings checked together.
    "cores4_hbm64": {"TORCH_NEURONX_SIM_CORES": "4", "TORCH_NEURONX_SIM_HBM": "64MiB"},
    # NEURON_RT_VISIBLE_CORES selects physical cores 1 and 2 of four; they are renumbered 0 and 1.
    "visible_1_2": {"TORCH_NEURONX_SIM_CORES": "4", "NEURON_RT_VISIBLE_CORES": "1-2"},
    "visible_abc": {"NEURON_RT_VISIBLE_CORES": "abc"},
    "autoload_off": {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
}


@pytest.fixture(scope="module")
def env_results():
    procs = {
        name: subprocess.Popen([sys.executable, "-c", _PROBE], env=clean_env(**env), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        for name, env in _ENV_CASES.items()
    }
    results = {}
    try:
        for name, p in procs.items():
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, f"{name}: exit {p.returncode}\nstdout:\n{out}\nstderr:\n{err}"
            results[name] = json.loads(out.strip().splitlines()[-1])
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    return results


# --------------------------------------------------------------------------- basics


def test_is_available_and_count():
    assert torch.neuron.is_available() is True
    assert isinstance(N_DEV, int)
    # The default simulated machine has 2 NeuronCores (DESIGN: TORCH_NEURONX_SIM_CORES default 2).
    if "TORCH_NEURONX_SIM_CORES" not in os.environ and "NEURON_RT_VISIBLE_CORES" not in os.environ:
        assert N_DEV == 2
    assert N_DEV >= 1
    assert torch.accelerator.device_count() == N_DEV


def test_current_accelerator_is_neuron():
    assert torch.accelerator.is_available()
    acc = torch.accelerator.current_accelerator()
    assert acc == torch.device("neuron")
    assert acc.type == "neuron"
    assert torch._C._get_privateuse1_backend_name() == "neuron"


def test_current_and_set_device():
    assert torch.neuron.current_device() == 0
    if N_DEV < 2:
        pytest.fail("these tests need at least 2 neuron devices")
    try:
        torch.neuron.set_device(1)
        assert torch.neuron.current_device() == 1
        assert torch.accelerator.current_device_index() == 1
        # New tensors without an index go to the current device.
        t = torch.ones(3, device="neuron")
        assert t.device == torch.device("neuron", 1)
        assert t.get_device() == 1
        assert torch.equal(t.cpu(), torch.ones(3))
        torch.neuron.set_device("neuron:0")
        assert torch.neuron.current_device() == 0
        torch.neuron.set_device(torch.device("neuron", 1))
        assert torch.neuron.current_device() == 1
    finally:
        torch.neuron.set_device(0)
    assert torch.neuron.current_device() == 0


def test_device_context_manager_restores():
    assert torch.neuron.current_device() == 0
    with torch.neuron.device(1):
        assert torch.neuron.current_device() == 1
        assert torch.empty(2, device="neuron").device.index == 1
        with torch.neuron.device("neuron:0"):
            assert torch.neuron.current_device() == 0
        assert torch.neuron.current_device() == 1
    assert torch.neuron.current_device() == 0
    # The device is restored when the body raises.
    with pytest.raises(ValueError, match="boom"):
        with torch.neuron.device(1):
            raise ValueError("boom")
    assert torch.neuron.current_device() == 0
    # None is a no-op, as in torch.cuda.device.
    with torch.neuron.device(None):
        assert torch.neuron.current_device() == 0


def test_device_of():
    t = torch.zeros(1, device="neuron:1")
    with torch.neuron.device_of(t):
        assert torch.neuron.current_device() == 1
    assert torch.neuron.current_device() == 0
    with torch.neuron.device_of(torch.zeros(1)):  # CPU tensor: no change
        assert torch.neuron.current_device() == 0


def test_current_device_is_per_thread():
    import threading

    seen = {}

    def worker():
        seen["initial"] = torch.neuron.current_device()
        torch.neuron.set_device(1)
        seen["after"] = torch.neuron.current_device()

    th = threading.Thread(target=worker)
    th.start()
    th.join(timeout=30)
    assert not th.is_alive()
    assert seen == {"initial": 0, "after": 1}
    assert torch.neuron.current_device() == 0


def test_get_device_properties():
    for i in range(N_DEV):
        p = torch.neuron.get_device_properties(i)
        assert isinstance(p.name, str) and p.name
        assert "Neuron" in p.name
        assert isinstance(p.total_memory, int) and p.total_memory > 0
        assert p.total_memory == torch.neuron.mem_get_info(i)[1]
        assert p.total_memory == torch.accelerator.get_memory_info(i)[1]
        if "NEURON_RT_VISIBLE_CORES" not in os.environ:
            assert p.physical_core == i  # identity mapping
        assert torch.neuron.get_device_name(i) == p.name
        assert "total_memory" in repr(p)
    # Device given as string, torch.device, or omitted (current device).
    assert torch.neuron.get_device_properties("neuron:1").physical_core == 1
    assert torch.neuron.get_device_properties(torch.device("neuron", 1)).physical_core == 1
    assert torch.neuron.get_device_properties().physical_core == 0
    with torch.neuron.device(1):
        assert torch.neuron.get_device_properties().physical_core == 1
    with pytest.raises(ValueError, match="neuron"):
        torch.neuron.get_device_properties("cpu")


def test_default_capacity_is_16gib_or_host_bound():
    assert "TORCH_NEURONX_SIM_HBM" not in os.environ, "run this test without TORCH_NEURONX_SIM_HBM"
    host = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert torch.neuron.get_device_properties(0).total_memory == min(16 << 30, host)


def test_misc_capabilities():
    assert torch.neuron.is_bf16_supported() is True
    assert torch.bfloat16 in torch.neuron.get_amp_supported_dtype()
    assert torch.neuron.is_initialized() is True  # initialized by the tests above


def test_accelerator_device_index_api():
    assert torch.accelerator.current_device_index() == 0
    try:
        torch.accelerator.set_device_index(1)
        assert torch.neuron.current_device() == 1
        assert torch.empty(1, device="neuron").device.index == 1
    finally:
        torch.accelerator.set_device_index(0)
    assert torch.neuron.current_device() == 0
    with torch.accelerator.device_index(1):
        assert torch.neuron.current_device() == 1
        assert torch.accelerator.current_device_index() == 1
    assert torch.neuron.current_device() == 0


def test_accelerator_stream_and_synchronize():
    s = torch.accelerator.current_stream()
    assert s.device.type == "neuron"
    assert s.device_index == 0
    assert s == torch.neuron.current_stream()
    x = torch.arange(1000, dtype=torch.float32, device="neuron")
    y = (x * 3).cumsum(0)
    torch.accelerator.synchronize()
    torch.accelerator.synchronize(1)
    assert torch.equal(y.cpu(), (torch.arange(1000, dtype=torch.float32) * 3).cumsum(0))


def test_accelerator_get_device_capability():
    cap = torch.accelerator.get_device_capability()
    dtypes = cap["supported_dtypes"]
    for dt in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool):
        assert dt in dtypes


def test_default_device_context():
    with torch.device("neuron"):
        t = torch.arange(4)
    assert t.device == torch.device("neuron", 0)
    assert torch.equal(t.cpu(), torch.arange(4))


# --------------------------------------------------------------------------- generated methods


def test_tensor_is_neuron_and_neuron_method():
    cpu = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert cpu.is_neuron is False
    n = cpu.neuron()
    assert n.is_neuron is True
    assert n.device == torch.device("neuron", 0)
    assert n.shape == cpu.shape and n.dtype == cpu.dtype
    assert torch.equal(n.cpu(), cpu)
    n1 = cpu.neuron(1)
    assert n1.device == torch.device("neuron", 1)
    assert torch.equal(n1.cpu(), cpu)
    assert cpu.neuron("neuron:1").device.index == 1
    with torch.neuron.device(1):
        assert cpu.neuron().device.index == 1
    # A tensor already on the requested device is returned as is.
    assert n.neuron() is n
    # The result is a copy: changing it does not change the source.
    n.add_(1)
    assert torch.equal(cpu, torch.arange(6, dtype=torch.float32).reshape(2, 3))
    assert torch.equal(n.cpu(), cpu + 1)


def test_module_neuron_method():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    m.load_state_dict(ref.state_dict())
    out = m.neuron()
    assert out is m  # in place, returns self like Module.cuda()
    for p in m.parameters():
        assert p.is_neuron and p.device.index == 0
    x = torch.randn(5, 4)
    torch.testing.assert_close(m(x.neuron()).cpu(), ref(x), rtol=0, atol=0)
    m1 = torch.nn.Linear(4, 3).neuron(1)
    assert all(p.device == torch.device("neuron", 1) for p in m1.parameters())


def test_untyped_storage_neuron_method():
    cpu = torch.arange(4, dtype=torch.int32)
    st = cpu.untyped_storage().neuron()
    assert st.device.type == "neuron"
    assert st.is_neuron
    assert torch.equal(torch.empty(0, dtype=torch.int32, device="neuron").set_(st).cpu(), cpu)


# --------------------------------------------------------------------------- invalid indices


@pytest.mark.parametrize(
    "fn",
    [
        lambda: torch.neuron.set_device(7),
        lambda: torch.neuron.get_device_properties(7),
        lambda: torch.neuron.synchronize(7),
        lambda: torch.empty(1, device="neuron:7"),
        lambda: torch.ones(2).to("neuron:7"),
        lambda: torch.ones(2).neuron(7),
        lambda: torch.accelerator.set_device_index(7),
        lambda: torch.neuron.device(7).__enter__(),
        lambda: torch.neuron.memory_allocated(7),
    ],
    ids=["set_device", "get_device_properties", "synchronize", "empty", "to", "tensor.neuron",
         "accelerator.set_device_index", "device_ctx", "memory_allocated"],
)
def test_invalid_device_index(fn):
    with pytest.raises(RuntimeError) as ei:
        fn()
    msg = str(ei.value)
    assert "7" in msg
    assert "device" in msg.lower()
    assert f"{N_DEV} NeuronCore" in msg  # says how many devices there are
    # The process keeps working and the current device did not change.
    assert torch.neuron.current_device() == 0
    assert torch.equal((torch.ones(3, device="neuron") * 2).cpu(), torch.full((3,), 2.0))


# --------------------------------------------------------------------------- environment (subprocesses)


def test_env_default(env_results):
    r = env_results["default"]
    assert r["has_neuron"] and r["count"] == 2 and r["available"]
    assert r["physical"] == [0, 1]
    assert r["sum_last_device"] == 90.0
    assert r["use_error"] is None and r["empty_error"] is None


def test_env_sim_cores_4(env_results):
    r = env_results["cores4_hbm64"]
    assert r["count"] == 4
    assert r["available"] is True
    assert r["physical"] == [0, 1, 2, 3]
    assert r["use_error"] is None
    assert r["sum_last_device"] == 90.0  # neuron:3 works


def test_env_visible_cores_range(env_results):
    r = env_results["visible_1_2"]
    assert r["count"] == 2
    assert r["available"] is True
    assert r["physical"] == [1, 2]  # renumbered from 0
    assert r["use_error"] is None
    assert r["sum_last_device"] == 90.0


def test_env_visible_cores_invalid(env_results):
    r = env_results["visible_abc"]
    assert r["has_neuron"] is True
    assert r["count"] == 0  # device_count() never raises
    assert r["available"] is False
    # Each attempt to use the device raises an error that names the variable and the value.
    for key in ("empty_error", "init_error"):
        name, msg = r[key]
        assert name == "RuntimeError"
        assert "NEURON_RT_VISIBLE_CORES" in msg
        assert "abc" in msg


def test_env_hbm_capacity(env_results):
    r = env_results["cores4_hbm64"]
    assert r["total_memory"] == [64 << 20] * 4
    # Nothing was allocated before mem_get_info: free == total on every core.
    assert r["mem_get_info"] == [[64 << 20, 64 << 20]] * 4
    assert r["use_error"] is None


def test_import_torch_alone_registers_neuron(env_results):
    r = env_results["default"]
    assert r["has_neuron"] is True
    assert r["backend_imported"] is True  # loaded by the torch.backends entry point
    assert r["accelerator"] == "neuron"
    # Lazy initialization: importing does not start the runtime.
    assert r["initialized_after_import"] is False
    assert r["initialized_after_use"] is True


def test_autoload_disabled(env_results):
    r = env_results["autoload_off"]
    assert r["has_neuron"] is False
    assert r["backend_imported"] is False


# --------------------------------------------------------------------------- fork


def test_forked_child_gets_clear_error_not_a_hang():
    import signal
    import time

    torch.ones(1, device="neuron").cpu()  # the runtime is initialized in the parent
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report and leave without running any Python cleanup
        os.close(r)
        try:
            try:
                torch.empty(1, device="neuron")
                msg = "no error"
            except RuntimeError as e:
                msg = "RuntimeError: " + str(e)
            msg += f"|bad_fork={torch.neuron._is_in_bad_fork()}|initialized={torch.neuron.is_initialized()}"
            # The error says why; the device guard restoring the device says nothing more.
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                try:
                    torch.ones(2, device="neuron") + 1
                except RuntimeError:
                    pass
            msg += f"|warnings={[str(x.message)[:200] for x in seen]}"
            os.write(w, msg.encode())
        finally:
            os._exit(0)
    os.close(w)
    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("forked child hung using the device")
        time.sleep(0.05)
    with os.fdopen(r) as f:
        msg = f.read()
    assert msg.startswith("RuntimeError: "), msg
    assert "forked subprocess" in msg and "spawn" in msg
    assert "|bad_fork=True|initialized=False" in msg and "|warnings=[]" in msg, msg
    # The parent is unaffected.
    assert torch.equal((torch.arange(3, device="neuron") + 1).cpu(), torch.arange(1, 4))


def test_module_to_keeps_parameter_objects():
    # An optimizer built before model.to("neuron") must still hold the model's parameters,
    # as with CUDA (shallow-copy compatible host and device tensors).
    model = torch.nn.Linear(3, 2)
    params = list(model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.to("neuron")
    assert all(p is q for p, q in zip(params, model.parameters()))
    assert model.weight.device.type == "neuron"
    before = model.weight.detach().cpu().clone()
    model(torch.ones(4, 3, device="neuron")).sum().backward()
    opt.step()
    assert not torch.equal(model.weight.detach().cpu(), before)
    p = torch.nn.Parameter(torch.zeros(2))
    p.data = torch.ones(3, device="neuron")
    assert p.device.type == "neuron" and p.shape == (3,)


@pytest.mark.parametrize("cls,shape", [(torch.nn.LazyLinear, (2, 5)), (torch.nn.LazyConv1d, (2, 3, 8))])
def test_lazy_modules_initialize_on_neuron(cls, shape):
    torch.manual_seed(0)
    ref = cls(4) if cls is torch.nn.LazyLinear else cls(4, 3)
    torch.manual_seed(0)
    m = (cls(4) if cls is torch.nn.LazyLinear else cls(4, 3)).to("neuron")
    x = torch.randn(shape)
    torch.manual_seed(1)
    expected = ref(x)
    torch.manual_seed(1)
    actual = m(x.to("neuron"))
    assert m.weight.device.type == "neuron" and m.weight.shape == ref.weight.shape
    torch.testing.assert_close(actual.cpu(), expected)


def test_import_torch_neuronx_before_torch():
    code = "import torch_neuronx, torch; print(torch.ones(2, device='neuron').sum().item())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "2.0"
