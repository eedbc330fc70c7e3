"""Launching a kernel: trace its Python body into a program of the core (once
per argument signature and grid), then run the program over the arguments —
as one task on the current stream for ``neuron`` tensors, at once for NumPy
arrays and CPU tensors."""
from __future__ import annotations

import collections
import functools
import math
import threading
import time

import numpy as np
import torch

from .. import _C
from . import _emit
from ._lockstep import Lockstep
from ._dtypes import E4M3
from ._tensor import FIRST_HBM_BUFFER, HBM, PSUM, SBUF, NkiTensor, itemsize, packed_name, to_dtype

_nki = _C._nki


class Trace:
    """One traced launch: the program, the HBM tensors, SPMD coordinates."""

    def __init__(self, num_args, grid, gen=1):
        _reload_target()
        self.gen = gen
        self.program = _nki.Program(num_args)
        self.grid = grid
        self._inst = threading.local()  # per SPMD instance (each may run in its own thread: _lockstep)
        self.start_instance(())
        self.synced = False     # instances exchanged data (sendrecv / core_barrier): one memory per core
        self.hbm = []          # (shape, dtype) of kernel-allocated HBM tensors, buffer 2 + num_args + i
        self.num_args = num_args
        self._shared = []      # shared_hbm tensors, in allocation order (shared by all instances)
        self._names = 0
        self.counts = collections.Counter()
        self.masks = {}         # instruction masks by content (shared: _emit._shared_mask)
        self.serial = 0         # tensors made so far (a loop's writes to older tensors are checked)
        t = _nki.target()
        self._pbytes = {SBUF: t["sbuf_partition_bytes"], PSUM: t["psum_partition_bytes"]}
        self.psum_bank_bytes = t["psum_bank_bytes"]

    def partition_bytes(self, space):
        return self._pbytes[space]

    def auto_name(self):
        self._names += 1
        return f"t{self._names}"

    def count(self, name):
        self.counts[name] += 1

    def start_instance(self, pid, lockstep=None, index=0):
        i = self._inst
        i.program_id, i.shared_seen, i.lockstep, i.index = pid, 0, lockstep, index
        i.loops = []         # affine/sequential loops being run (_loops.SymbolicRange), outermost first
        i.manual_sites = {}  # manual placements made in the current outermost loop, by call site
        i.meetings = collections.Counter()  # sendrecv / core_barrier calls so far, by kind

    program_id = property(lambda self: self._inst.program_id)
    loops = property(lambda self: self._inst.loops)
    lockstep = property(lambda self: self._inst.lockstep)
    instance_index = property(lambda self: self._inst.index)
    meetings = property(lambda self: self._inst.meetings)

    @property
    def manual_sites(self):
        return self._inst.manual_sites

    @manual_sites.setter
    def manual_sites(self, v):
        self._inst.manual_sites = v

    @property
    def rank(self):
        """The logical core of this instance: its index on the grid's first axis."""
        return self.program_id[0] if self.program_id else 0

    def hbm_tensor(self, shape, dtype, name, shared):
        if shared and self._inst.shared_seen < len(self._shared):
            t = self._shared[self._inst.shared_seen]
            self._inst.shared_seen += 1
            if t.shape != shape or t.tdtype != dtype:
                raise ValueError(f"SPMD instances allocate different shared_hbm tensors: {t.shape} {t.tdtype} "
                                 f"vs {shape} {dtype}")
            return t
        buf = self.program.add_hbm(dtype, list(shape))
        self.hbm.append((shape, dtype))
        strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
        t = NkiTensor(self, buf, HBM, shape, dtype, strides, 0, None, name)
        t.serial, self.serial = self.serial, self.serial + 1
        if shared:
            self._shared.append(t)
            self._inst.shared_seen += 1
        fill = float("nan") if dtype.is_floating_point else 4.0
        _emit.issue("fill", "<allocate>", t.view_all(), scalars=[fill])
        return t


_target_env = [None]


def _reload_target():
    """Kernel files set NEURON_PLATFORM_TARGET_OVERRIDE at import: read it at each trace."""
    import os
    env = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE")
    if env != _target_env[0]:
        _target_env[0] = env
        _nki.reload_target()


def _grid_dims(grid):
    if grid is None:
        return ()
    if not isinstance(grid, tuple):
        grid = (grid,)
    return tuple(int(g) for g in grid)


def _np_to_torch(a):
    if a.dtype.name in ("bfloat16", "float8_e4m3", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"):
        raw = torch.from_numpy(a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint8)).view(to_dtype(a.dtype.name))
        if raw.dtype == E4M3:
            raw._nki_e4m3 = True  # e4m3 bits from NumPy, not a torch fnuz tensor
        return raw
    if a.dtype.names:  # a packed MX type (nl.float8_e4m3fn_x4 ...): its raw words
        return torch.from_numpy(a.view(a.dtype[0]))
    return torch.from_numpy(a)


def _torch_to_np(t):
    if t.dtype in (torch.bfloat16, torch.float8_e4m3fn, E4M3, torch.float8_e5m2, torch.float8_e8m0fnu):
        try:
            import ml_dtypes  # noqa: F401
            name = {torch.bfloat16: "bfloat16", torch.float8_e4m3fn: "float8_e4m3fn", E4M3: "float8_e4m3",
                    torch.float8_e5m2: "float8_e5m2", torch.float8_e8m0fnu: "float8_e8m0fnu"}[t.dtype]
            raw = t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.uint8).numpy()
            return raw.view(np.dtype(name))
        except ImportError:
            return _e4m3_as_torch(t).float().numpy() if t.dtype == E4M3 else t.float().numpy()
    return t.numpy()


def _e4m3_as_torch(t):
    """An nl.float8_e4m3 result (e4m3 bits) as torch's float8_e4m3fn: the same values up to 240;
    infinities (which e4m3fn lacks) become NaN."""
    bits = t.view(torch.uint8)
    v = bits.view(torch.float8_e4m3fn).float()
    top = (bits & 0x78) == 0x78
    return torch.where(top, torch.full_like(v, float("nan")), v).to(torch.float8_e4m3fn)


class _Cached:
    __slots__ = ("program", "result", "launch_id", "counts", "hbm")

    def __init__(self, trace, result):
        self.program, self.result, self.counts, self.hbm = trace.program, result, trace.counts, trace.hbm
        self.launch_id = None


# Callbacks told the program of each launch (torch_neuronx.nki.modeled_launches).
_launch_observers = []


class Kernel:
    """A kernel function made launchable: ``kernel(*args)`` or ``kernel[grid](*args)``."""

    def __init__(self, func, mode="auto", numpy_results=None, gen=1, **options):
        self.func, self.mode, self.options, self.gen = func, mode, options, gen
        self.numpy_results = numpy_results
        self._cache = {}
        self.last_trace_stats = None
        functools.update_wrapper(self, func)

    def __getitem__(self, grid):
        return _Launcher(self, _grid_dims(grid))

    def __call__(self, *args, **kwargs):
        return _Launcher(self, ())(*args, **kwargs)


class _Launcher:
    def __init__(self, kernel, grid):
        self.kernel, self.grid = kernel, grid

    def __call__(self, *args, **kwargs):
        k = self.kernel
        if getattr(_emit._local, "trace", None) is not None:
            # a kernel called from another kernel's body: inline it
            return k.func(*args, **kwargs)
        params = list(args) + list(kwargs.values())
        numpy_in = any(isinstance(a, np.ndarray) for a in params)
        tensors, key, device = [], [self.grid], None
        conv_args, copies = [], []
        for a in args:
            conv_args.append(self._tensor_arg(a, tensors, key, copies=copies))
        conv_kwargs = {n: self._tensor_arg(v, tensors, key, n, copies) for n, v in kwargs.items()}
        for t in tensors:
            if t.device.type not in ("cpu", "meta"):
                if device is not None and t.device != device:
                    raise ValueError(f"NKI kernel arguments are on different devices: {device} and {t.device}")
                device = t.device
        if device is not None and any(t.device.type == "cpu" for t in tensors):
            raise ValueError("NKI kernel arguments mix CPU and neuron tensors; move them all to one device")
        import os
        key.append((os.environ.get("NKI_PRECISE_FP"), os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE")))
        try:
            key = tuple(key)
            hash(key)
        except TypeError:
            key = None
        cached = k._cache.get(key) if key is not None else None
        if cached is None:
            cached = self._trace(conv_args, conv_kwargs, tensors)
            if key is not None:
                k._cache[key] = cached
        k.last_trace_stats = cached
        if _launch_observers:
            for obs in _launch_observers:
                obs(cached.program)
        if any(_is_fake(t) for t in tensors):
            # shape propagation (torch.compile, meta): the declared outputs, nothing run
            outs = [torch.empty(shape, dtype=dtype, device=tensors[0].device) for shape, dtype in cached.hbm]
            return self._results(cached.result, tensors, outs, False)
        outs = self._run(cached, tensors, device)
        for orig, dense in copies:
            orig[...] = dense
        as_numpy = numpy_in if k.numpy_results is None else k.numpy_results
        return self._results(cached.result, tensors, outs, as_numpy)

    def _tensor_arg(self, a, tensors, key, name=None, copies=None):
        if isinstance(a, np.ndarray):
            if not a.flags.c_contiguous:  # HBM tensors are dense row-major: a copy, written back after the run
                dense = np.ascontiguousarray(a)
                if copies is not None:
                    copies.append((a, dense))
                a = dense
            packed = packed_name(a.dtype)
            a = _np_to_torch(a)
            if packed:
                a._nki_packed = packed  # the kernel sees the packed type, not the words
        if isinstance(a, torch.Tensor):
            if a.dtype == E4M3 and not hasattr(a, "_nki_e4m3"):
                raise TypeError("NKI kernels take torch.float8_e4m3fn tensors (nl.float8_e4m3fn); "
                                "torch.float8_e4m3fnuz has no NKI dtype (nl.float8_e4m3 arrays come from NumPy "
                                "with ml_dtypes.float8_e4m3)")
            idx = len(tensors)
            tensors.append(a)
            key.append(("T", name, tuple(a.shape), a.dtype, tuple(a.stride()), a.device.type,
                        getattr(a, "_nki_packed", None)))
            return ("__nki_arg__", idx, name)
        key.append((name, a if _hashable(a) else id(a)))
        return a

    def _trace(self, args, kwargs, tensors):
        k = self.kernel
        grid = self.grid or ()
        tr = Trace(len(tensors), grid, k.gen)
        params = list(k.func.__code__.co_varnames[:k.func.__code__.co_argcount])
        hbm_args = []
        for i, t in enumerate(tensors):
            strides = list(t.stride())
            hbm_args.append(NkiTensor(tr, FIRST_HBM_BUFFER + i, HBM, tuple(t.shape), t.dtype, strides, 0, None,
                                      params[i] if i < len(params) else f"arg{i}"))
            hbm_args[-1]._packed = getattr(t, "_nki_packed", "")

        def sub(a):
            return hbm_args[a[1]] if isinstance(a, tuple) and len(a) == 3 and a[0] == "__nki_arg__" else a

        call_args = [sub(a) for a in args]
        call_kwargs = {n: sub(v) for n, v in kwargs.items()}
        for i, a in enumerate(call_args):
            if isinstance(a, NkiTensor) and i < len(params):
                a.name = params[i]
        # Gen-2 kernel[lnc]: the instances are logical cores (own memories, running side by side)
        lnc = k.gen == 2 and len(grid) == 1 and grid[0] > 1
        prev = _emit.set_current(tr)
        result = None
        try:
            pids = [tuple(int(p) for p in pid) for pid in (np.ndindex(*grid) if grid else [()])]
            if len(pids) == 1:
                tr.start_instance(pids[0])
                result = _to_hbm(k.func(*call_args, **call_kwargs), tr)
            else:
                # instances that differ only in the first (core) coordinate run together
                groups = {}
                for pid in pids:
                    groups.setdefault(pid[1:], []).append(pid)
                for group in groups.values():
                    rs = Lockstep(tr, group, lambda pid: k.func(*call_args, **call_kwargs), interleave=lnc).run()
                    if result is None:
                        result = _to_hbm(rs[0], tr)
        finally:
            _emit.set_current(prev)
        if tr.synced or lnc:
            tr.program.set_cores(grid[0])
        tr.program.finalize()  # places the tiles: MemoryError when they do not fit
        spec = _result_spec(result, tr)
        return _Cached(tr, spec)

    def _run(self, cached, tensors, device):
        extra = []
        if device is not None:
            for shape, dtype in cached.hbm:
                extra.append(torch.empty(shape, dtype=dtype, device=device))
            if cached.launch_id is None:
                cached.launch_id = cached.program.register()
            torch.ops.nki.launch([t.detach() for t in tensors] + extra, cached.launch_id)
        else:
            for shape, dtype in cached.hbm:
                extra.append(torch.empty(shape, dtype=dtype))
            cached.program.run([t.detach() for t in tensors] + extra)
        return extra

    def _results(self, spec, tensors, outs, as_numpy):
        def build(s):
            if s is None:
                return None
            if isinstance(s, tuple) and s and s[0] == "__buf__":
                i = s[1]
                t = tensors[i] if i < len(tensors) else outs[i - len(tensors)]
                if tuple(t.shape) != s[2]:
                    t = t.view(s[2])
                if as_numpy:
                    return _torch_to_np(t)
                return _e4m3_as_torch(t) if t.dtype == E4M3 else t
            if isinstance(s, list):
                return [build(x) for x in s]
            if isinstance(s, tuple):
                return tuple(build(x) for x in s)
            return s
        return build(spec)


def _is_fake(t):
    from torch._subclasses.fake_tensor import is_fake
    return t.device.type == "meta" or is_fake(t)


def _hashable(a):
    try:
        hash(a)
        return True
    except TypeError:
        return False


def _to_hbm(r, tr):
    """A returned SBUF/PSUM tile is copied to a new HBM tensor (AWS's simulator returns tiles as arrays)."""
    from ._tensor import View
    if isinstance(r, (NkiTensor, View)) and r.space != HBM:
        from . import language as nl
        out = tr.hbm_tensor(tuple(r.shape), r.tdtype, "result", shared=False)
        nl.store(out, value=r)
        return out
    if isinstance(r, (list, tuple)):
        items = [_to_hbm(x, tr) for x in r]
        return items if isinstance(r, list) else tuple(items)
    return r


def _result_spec(r, tr):
    if r is None:
        return None
    if isinstance(r, NkiTensor):
        return ("__buf__", r.bufidx - FIRST_HBM_BUFFER, r.shape)
    if isinstance(r, (list, tuple)):
        items = [_result_spec(x, tr) for x in r]
        return items if isinstance(r, list) else tuple(items)
    if isinstance(r, dict):
        raise TypeError("kernels return HBM tensors or tuples of them, not dicts")
    return r


def benchmark_latencies(kernel, args, kwargs, warmup, iters):
    """Wall-clock latency (µs) of each of ``iters`` runs after ``warmup``."""
    for _ in range(warmup):
        kernel(*args, **kwargs)
    lat = []
    for _ in range(iters):
        t0 = time.perf_counter()
        r = kernel(*args, **kwargs)
        if isinstance(r, torch.Tensor) and r.device.type != "cpu":
            torch.neuron.synchronize(r.device)
        lat.append((time.perf_counter() - t0) * 1e6)
    return lat
