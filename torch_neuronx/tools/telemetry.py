"""Reader of the per-process counters the runtime publishes in POSIX shared memory.

Each process using neuron devices owns ``/dev/shm/torch_neuronx.<pid>`` (mode 0600; layout:
``csrc/runtime/telemetry.h``; this module mirrors it and checks its magic, version, and that the
segment belongs to the process's user). Segments of processes that died without exiting cleanly are removed
here.
"""
import dataclasses
import glob
import os
import struct
import time
from typing import List, Optional

SHM_DIR = "/dev/shm"
PREFIX = "torch_neuronx."
MAGIC = 0x314D4C4554585254
VERSION = 2
MAX_CORES = 64
_HEADER = struct.Struct("<QIIqq224s")
_CORE = struct.Struct("<qQQQQQ16xQQQ40x")  # host-written line, engine-written line
SEGMENT_SIZE = _HEADER.size + MAX_CORES * _CORE.size
assert _HEADER.size == 256 and _CORE.size == 128


@dataclasses.dataclass
class CoreSample:
    """One process's counters for one device (``index`` in the process, ``core`` physical)."""
    index: int
    core: int
    capacity: int
    reserved: int
    allocated: int
    peak_allocated: int
    queued: int
    kernels: int
    busy_ns: int


@dataclasses.dataclass
class ProcessSample:
    pid: int
    command: str
    start_unix_ns: int
    time: float  # time.monotonic() when read
    cores: List[CoreSample]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner(pid: int) -> Optional[int]:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _read(path: str, pid: int) -> Optional[ProcessSample]:
    try:
        with open(path, "rb") as f:
            # Only a segment the process's own user made speaks for it (the name is predictable).
            if os.fstat(f.fileno()).st_uid != _owner(pid):
                return None
            data = f.read(SEGMENT_SIZE)
    except OSError:
        return None
    if len(data) < SEGMENT_SIZE:
        return None  # being created
    magic, version, num_cores, pid, start_ns, command = _HEADER.unpack_from(data, 0)
    if magic != MAGIC or version != VERSION:
        return None
    cores = []
    for i in range(min(num_cores, MAX_CORES)):
        f = _CORE.unpack_from(data, _HEADER.size + i * _CORE.size)
        if f[0] < 0:
            continue
        core, capacity, reserved, allocated, peak, submitted, started, kernels, busy_ns = f
        cores.append(CoreSample(i, core, capacity, reserved, allocated, peak, max(0, submitted - started), kernels,
                                busy_ns))
    return ProcessSample(pid, command.split(b"\0", 1)[0].decode(errors="replace"), start_ns,
                         time.monotonic(), cores)


def read_processes(clean_stale: bool = True) -> List[ProcessSample]:
    """Samples of every live process publishing counters, ordered by pid."""
    out = []
    for path in glob.glob(os.path.join(SHM_DIR, PREFIX + "*")):
        suffix = path.rsplit(".", 1)[-1]
        if not suffix.isdigit():
            continue
        pid = int(suffix)
        if not _alive(pid):
            if clean_stale:
                try:
                    os.unlink(path)
                except OSError:
                    pass
            continue
        s = _read(path, pid)
        if s is not None and s.pid == pid:
            out.append(s)
    return sorted(out, key=lambda s: s.pid)


def machine_cores():
    """``(number of simulated NeuronCores, HBM bytes per core)`` as configured for this machine."""
    from .. import _C

    return _C._sim_cores(), _C._sim_hbm_bytes()


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"
