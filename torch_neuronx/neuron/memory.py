"""Device memory management: the caching allocator's statistics under CUDA's names."""
import collections
import os
import pickle
import sys
from typing import Any, Dict, Optional

import torch

from .. import _C

__all__ = ["empty_cache", "memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved",
           "max_memory_reserved", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
           "reset_max_memory_allocated", "mem_get_info", "memory_summary", "memory_snapshot",
           "set_per_process_memory_fraction", "host_memory_stats",
           "_record_memory_history", "_snapshot", "_dump_snapshot"]


def _idx(device) -> int:
    from . import _device_index

    return _device_index(device)


def _flatten(prefix: str, obj: Any, out: Dict[str, Any]) -> None:
    if isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(f"{prefix}.{k}" if prefix else k, v, out)
    else:
        out[prefix] = obj


def empty_cache() -> None:
    """Return cached, unused device memory to the host (tensors in use are untouched)."""
    _C._empty_cache()


def memory_stats(device=None) -> Dict[str, Any]:
    """Allocator statistics as an ordered dict with ``torch.cuda.memory_stats`` keys
    (``allocated_bytes.all.current``, ``reserved_bytes.large_pool.peak``, ``num_ooms`` ...)."""
    flat: Dict[str, Any] = {}
    _flatten("", _C._memory_stats(_idx(device)), flat)
    return collections.OrderedDict(sorted(flat.items()))


def memory_allocated(device=None) -> int:
    """Bytes occupied by tensors on the device (including tensors still used by queued kernels)."""
    return _C._memory_stats(_idx(device))["allocated_bytes"]["all"]["current"]


def max_memory_allocated(device=None) -> int:
    return _C._memory_stats(_idx(device))["allocated_bytes"]["all"]["peak"]


def memory_reserved(device=None) -> int:
    """Bytes held by the caching allocator (allocated plus cached)."""
    return _C._memory_stats(_idx(device))["reserved_bytes"]["all"]["current"]


def max_memory_reserved(device=None) -> int:
    return _C._memory_stats(_idx(device))["reserved_bytes"]["all"]["peak"]


def reset_peak_memory_stats(device=None) -> None:
    _C._reset_peak_memory_stats(_idx(device))


def reset_max_memory_allocated(device=None) -> None:
    _C._reset_peak_memory_stats(_idx(device))


def reset_accumulated_memory_stats(device=None) -> None:
    _C._reset_accumulated_memory_stats(_idx(device))


def mem_get_info(device=None):
    """``(free, total)`` bytes of the device's HBM as this process sees it."""
    return tuple(_C._mem_get_info(_idx(device)))


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    """Cap this process's reserved memory on a device to ``fraction`` of its capacity."""
    _C._set_memory_fraction(float(fraction), _idx(device))


def memory_snapshot(device=None):
    """Segments and blocks of the caching allocator (``torch.cuda.memory_snapshot`` layout)."""
    return _C._memory_snapshot(_idx(device))["segments"]


def _record_memory_history(enabled: Optional[str] = "all", context: Optional[str] = "all",
                           stacks: str = "all", max_entries: int = sys.maxsize, device=None,
                           clear_history: bool = False) -> None:
    """Record where device memory is allocated, as ``torch.cuda.memory._record_memory_history``.

    ``enabled``: ``None`` stops recording; ``"state"`` keeps a stack for each live
    allocation; ``"all"`` also keeps a history of alloc/free events (the newest
    ``max_entries``). ``context``: which events get stacks (``None``, ``"state"``,
    ``"alloc"``, ``"all"``). ``stacks``: ``"python"`` or ``"all"`` (adds C++ frames).
    Read the result with :func:`_snapshot` or :func:`_dump_snapshot`.
    """
    if isinstance(enabled, bool):
        enabled = "all" if enabled else None
    if max_entries < 0:
        raise ValueError(f"_record_memory_history: max_entries must be >= 0, got {max_entries}")
    _C._record_memory_history(enabled, context, stacks, min(max_entries, sys.maxsize), bool(clear_history),
                              _idx(device))


def _snapshot(device=None) -> Dict[str, Any]:
    """The allocator state and recorded history in ``torch.cuda.memory._snapshot()`` format,
    taken once the work queued so far has completed:
    ``{"segments": [...], "device_traces": [[...] per device]}``, readable by
    ``torch.cuda._memory_viz`` and https://pytorch.org/memory_viz.

    With ``device=None`` every initialized device is included (device traces
    are indexed by device, like CUDA's).
    """
    from . import device_count

    devices = range(device_count()) if device is None else [_idx(device)]
    traces = [[] for _ in range(device_count())]
    segments = []
    for d in devices:
        s = _C._memory_snapshot(d)
        segments.extend(s["segments"])
        traces[d] = s["device_traces"]
    return {"segments": segments, "device_traces": traces,
            "allocator_settings": {"TORCH_NEURONX_ALLOC_CONF": os.environ.get("TORCH_NEURONX_ALLOC_CONF", "")}}


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    """Pickle :func:`_snapshot` to ``filename`` (open it at https://pytorch.org/memory_viz, or
    render it with ``python -m torch.cuda._memory_viz trace_plot FILE -o out.html``)."""
    with open(filename, "wb") as f:
        pickle.dump(_snapshot(), f)


def host_memory_stats() -> Dict[str, int]:
    """Statistics of the pinned host memory allocator."""
    return _C._host_memory_stats()


def _fmt(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:7.2f} {unit}"
    return f"{n:7d} B  "


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A human-readable table of the allocator statistics, like ``torch.cuda.memory_summary``."""
    idx = _idx(device)
    s = _C._memory_stats(idx)
    free, total = _C._mem_get_info(idx)
    lines = ["=" * 79,
             f" PyTorch neuron memory summary, device ID {idx:<3d}  |  capacity {_fmt(total).strip()}, "
             f"free {_fmt(free).strip()}",
             "-" * 79,
             f" {'Metric':<24}| {'Cur Usage':>11} | {'Peak Usage':>11} | {'Tot Alloc':>11} | {'Tot Freed':>11}",
             "-" * 79]
    rows = [("Allocated memory", "allocated_bytes", True), ("Active memory", "active_bytes", True),
            ("Requested memory", "requested_bytes", True), ("Reserved memory", "reserved_bytes", True),
            ("Non-releasable memory", "inactive_split_bytes", True), ("Allocations", "allocation", False),
            ("Active allocs", "active", False), ("Reserved segments", "segment", False),
            ("Non-releasable allocs", "inactive_split", False)]
    for title, key, is_bytes in rows:
        pools = ["all"] if abbreviated else ["all", "large_pool", "small_pool"]
        for pool in pools:
            st = s[key][pool]
            f = _fmt if is_bytes else (lambda v: f"{v:11d}")
            name = title if pool == "all" else f"  from {pool.replace('_', ' ')}"
            lines.append(f" {name:<24}| {f(st['current']):>11} | {f(st['peak']):>11} | "
                         f"{f(st['allocated']):>11} | {f(st['freed']):>11}")
        lines.append("-" * 79)
    lines.append(f" Allocation retries: {s['num_alloc_retries']}   OOMs: {s['num_ooms']}   "
                 f"segment allocs: {s['num_device_alloc']}   segment frees: {s['num_device_free']}")
    lines.append("=" * 79)
    return "\n".join(lines) + "\n"
