"""Random number generation on neuron.

Neuron generators are mt19937 generators like CPU's, and kernels are ATen's CPU
kernels: with the same seed, ``torch.randn(..., device="neuron")`` and the other
random ops give the same values as on CPU. Reading or changing a generator's
state first waits for the random kernels already queued on its device.

A state is CUDA's layout, 16 bytes holding (seed, offset) as int64: the offset is
the mt19937 stream position in 32-bit draws, and setting it places the stream
there (DTensor's random-number tracker relies on this). See docs/device.md.
"""
from typing import Iterable, List

import torch

from .. import _C

__all__ = ["default_generators", "get_rng_state", "get_rng_state_all", "set_rng_state", "set_rng_state_all",
           "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed"]


def _generators() -> List[torch.Generator]:
    return [_C._default_generator(i) for i in range(_C._device_count())]


def _gen(device=None) -> torch.Generator:
    from . import _device_index

    return _C._default_generator(_device_index(device))


def __getattr__(name):
    if name == "default_generators":
        return tuple(_generators())
    raise AttributeError(name)


def get_rng_state(device="neuron") -> torch.Tensor:
    """The RNG state of a device's default generator: a 16-byte ByteTensor, (seed, offset) as int64."""
    return _gen(device).get_state()


def get_rng_state_all() -> List[torch.Tensor]:
    return [g.get_state() for g in _generators()]


def set_rng_state(new_state: torch.Tensor, device="neuron") -> None:
    """Restore a device's default generator from :func:`get_rng_state`."""
    _gen(device).set_state(new_state.clone(memory_format=torch.contiguous_format))


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    for i, s in enumerate(new_states):
        set_rng_state(s, i)


def manual_seed(seed: int) -> None:
    """Seed the current device's default generator."""
    _gen().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seed every device's default generator (``torch.manual_seed`` calls this)."""
    for g in _generators():
        g.manual_seed(int(seed))


def seed() -> None:
    """Seed the current device's generator with a non-deterministic number."""
    _gen().seed()


def seed_all() -> None:
    s = _gen().seed()
    for g in _generators():
        g.manual_seed(s)


def initial_seed() -> int:
    """The seed of the current device's default generator."""
    return _gen().initial_seed()
