"""``torch.neuron``: the device module, with the same names and semantics as ``torch.cuda``."""
import contextlib
import os
from typing import Any, Optional, Union

import torch

from .. import _C
from .memory import (  # noqa: F401
    empty_cache,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_snapshot,
    memory_stats,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_peak_memory_stats,
    set_per_process_memory_fraction,
)
from .random import (  # noqa: F401
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from .streams import Event, Stream  # noqa: F401

_DeviceLike = Union[torch.device, str, int, None]


def _device_index(device: _DeviceLike, optional: bool = True) -> int:
    if device is None:
        return current_device()
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "neuron":
            raise ValueError(f"expected a neuron device, got {device}")
        return current_device() if device.index is None else device.index
    if isinstance(device, int):
        return device
    raise TypeError(f"expected a neuron device, an index or None, got {type(device).__name__}")


def is_available() -> bool:
    """True if at least one (simulated) NeuronCore is visible to this process."""
    return _C._device_count() > 0 and not _C._in_bad_fork()


def device_count() -> int:
    """Number of NeuronCores this process sees (``NEURON_RT_VISIBLE_CORES``); 0 if the environment is invalid."""
    return _C._device_count()


def is_initialized() -> bool:
    """True once the runtime started (lazily, at first device use)."""
    return _C._is_initialized() and not _C._in_bad_fork()


def _is_in_bad_fork() -> bool:
    return _C._in_bad_fork()


def init() -> None:
    """Initialize the runtime now; raises with the reason if the environment is invalid."""
    _C._init()


def _lazy_init() -> None:
    init()


def current_device() -> int:
    """Index of the current neuron device of this thread."""
    return _C._current_device()


def set_device(device: _DeviceLike) -> None:
    """Set the current neuron device of this thread."""
    idx = _device_index(device)
    if idx >= 0:
        _C._set_device(idx)


class device:
    """Context manager that changes the current neuron device."""

    def __init__(self, device: _DeviceLike):
        self.idx = -1 if device is None else _device_index(device)
        self.prev_idx = -1

    def __enter__(self):
        if self.idx >= 0:
            self.prev_idx = current_device()
            if self.idx != self.prev_idx:
                _C._set_device(self.idx)
        return self

    def __exit__(self, *exc: Any):
        if self.idx >= 0 and self.prev_idx != self.idx:
            _C._set_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager that makes the device of a tensor current (no-op for CPU tensors)."""

    def __init__(self, obj):
        super().__init__(obj.get_device() if obj.device.type == "neuron" else None)


def synchronize(device: _DeviceLike = None) -> None:
    """Wait for all queued work on a device; raises any error a queued kernel hit."""
    _C._synchronize(_device_index(device))


def _sleep(milliseconds: float) -> None:
    """Queue a kernel that keeps the current stream busy for ``milliseconds`` (like
    ``torch.cuda._sleep``): a known-length kernel for tests of streams, events and the profiler."""
    if not 0 <= milliseconds <= 60_000:
        raise ValueError(f"_sleep: milliseconds must be in [0, 60000], got {milliseconds}")
    _C._sleep(float(milliseconds))


def get_device_name(device: _DeviceLike = None) -> str:
    return get_device_properties(device).name


class _DeviceProperties:
    def __init__(self, d: dict):
        self.name = d["name"]
        self.total_memory = d["total_memory"]
        self.index = d["index"]
        self.physical_core = d["physical_core"]
        self.type = "neuron"

    def __repr__(self):
        return (f"_NeuronDeviceProperties(name='{self.name}', total_memory={self.total_memory // (1 << 20)}MB, "
                f"physical_core={self.physical_core})")


def get_device_properties(device: _DeviceLike = None) -> _DeviceProperties:
    """Name, total memory and physical core of a neuron device."""
    return _DeviceProperties(_C._device_properties(_device_index(device)))


def get_device_capability(device: _DeviceLike = None):
    return (2, 0)


def get_amp_supported_dtype():
    """Dtypes ``torch.autocast("neuron")`` accepts (CUDA's list: float32 autocasts lower-precision ops to float32)."""
    return [torch.bfloat16, torch.float16, torch.float32]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """NeuronCores compute in bfloat16 natively."""
    return True


def current_stream(device: _DeviceLike = None) -> Stream:
    """The current stream of a device for this thread."""
    s = torch.accelerator.current_stream(_device_index(device))
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


def default_stream(device: _DeviceLike = None) -> Stream:
    """The default stream of a device (stream id 0)."""
    s = torch.accelerator.current_stream(_device_index(device))
    return Stream(stream_id=0, device_index=s.device_index, device_type=s.device_type)


def set_stream(stream: torch.Stream) -> None:
    """Make ``stream`` the current stream of its device."""
    if stream is None:
        return
    torch.accelerator.set_stream(stream)


@contextlib.contextmanager
def stream(stream: Optional[torch.Stream]):
    """Context manager that makes ``stream`` current (``None`` does nothing)."""
    if stream is None:
        yield
        return
    prev_dev = current_device()
    prev = current_stream(stream.device_index)
    if stream.device_index != prev_dev:
        _C._set_device(stream.device_index)
    torch.accelerator.set_stream(stream)
    try:
        yield
    finally:
        torch.accelerator.set_stream(prev)
        if stream.device_index != prev_dev:
            _C._set_device(prev_dev)


_stream_cm = stream


class StreamContext:
    """Class form of :func:`stream`."""

    def __init__(self, stream: Optional[torch.Stream]):
        self._cm = _stream_cm(stream)

    def __enter__(self):
        return self._cm.__enter__()

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


def __getattr__(name):
    if name == "default_generators":
        return random.default_generators
    if name == "_initialized":
        # torch.cuda's flag, read by torch.utils.checkpoint: without it, checkpointed regions on
        # neuron neither save nor restore the device's RNG state, and recomputed random ops
        # (dropout) draw new values in the backward.
        return is_initialized()
    raise AttributeError(f"module 'torch.neuron' has no attribute '{name}'")


from . import memory  # noqa: E402,F401
from . import random  # noqa: E402,F401
