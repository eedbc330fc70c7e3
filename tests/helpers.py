"""Shared by the test files: the environment a fresh process should start from, and the setup of
the compiled tier's tests."""
import os

# Settings of the device and the backend that a test's own environment must not leak into a
# subprocess it starts to check a default (or a setting it passes explicitly).
DEVICE_ENV_PREFIXES = ("TORCH_NEURONX_", "NEURON_", "TORCH_DEVICE_BACKEND_AUTOLOAD")


def clean_env(**overrides):
    """``os.environ`` without the device and backend settings, plus ``overrides`` (as strings)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(DEVICE_ENV_PREFIXES)}
    env.update({k: str(v) for k, v in overrides.items()})
    return env


def fresh_large_size(device, at_least=32 << 20):
    """A 2 MiB multiple >= 10 MiB that no cached block of `device` can serve: a tensor of that
    many bytes gets a segment of its own, and the next request of the size gets its block back."""
    import torch

    free = [b["size"] for seg in torch.neuron.memory_snapshot(device) for b in seg["blocks"]
            if b["state"] != "active_allocated"]
    n = max(at_least, max(free, default=0) + (2 << 20))
    return (n + (2 << 20) - 1) // (2 << 20) * (2 << 20)


def compiled_tier_test(tmp_path_factory, monkeypatch, request):
    """The body of the compiled tier's autouse fixture (``yield from`` it): a private kernel
    cache, Dynamo and the compile metrics reset, and afterwards a failure if a graph fell back to
    eager, unless the test is marked ``runs_eagerly``."""
    import torch

    from torch_neuronx.compile import compile_metrics, reset_compile_metrics

    monkeypatch.setenv("TORCH_NEURONX_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "nx-cache"))
    torch._dynamo.reset()
    reset_compile_metrics()
    yield
    if request.node.get_closest_marker("runs_eagerly") is None:
        m = compile_metrics()
        assert m["eager_graphs"] == 0, f"graphs ran eagerly: {m['eager_reasons']}"
    torch._dynamo.reset()
