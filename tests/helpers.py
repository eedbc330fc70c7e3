"""Shared by the test files: the environment a fresh process should start from."""
import os

# Settings of the device and the backend that a test's own environment must not leak into a
# subprocess it starts to check a default (or a setting it passes explicitly).
DEVICE_ENV_PREFIXES = ("TORCH_NEURONX_", "NEURON_", "TORCH_DEVICE_BACKEND_AUTOLOAD")


def clean_env(**overrides):
    """``os.environ`` without the device and backend settings, plus ``overrides`` (as strings)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(DEVICE_ENV_PREFIXES)}
    env.update({k: str(v) for k, v in overrides.items()})
    return env
