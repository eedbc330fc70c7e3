"""The NKI kernel language on the simulated NeuronCore.

Kernels written for Neuron's NKI run here unchanged: ``torch_neuronx.nki`` is
the Gen-1 API (``neuronxcc.nki``; ``import neuronxcc.nki.language as nl``
resolves here when the real package is absent). A kernel's Python body runs on
the host to issue instructions — allocating SBUF/PSUM with their real
capacity and checking each instruction against the hardware's limits — and
the traced program executes in C++: on ``neuron`` tensors as one task on the
current stream, on NumPy arrays at once (inputs the kernel writes are updated
in place, as AWS's simulator does).
"""
from __future__ import annotations

import functools

from . import compiler, isa, language, typing  # noqa: F401
from ._tensor import NkiTensor as tensor  # noqa: F401
from ._profile import ModeledProfile, modeled_launches, profile  # noqa: F401
from ._profile import _report as _modeled_report
from ._trace import Kernel, benchmark_latencies


def jit(func=None, mode="auto", **kwargs):
    """Makes ``func`` a kernel: called with ``neuron``/CPU tensors or NumPy arrays, ``kernel[grid](...)`` for SPMD."""
    if func is None:
        return functools.partial(jit, mode=mode, **kwargs)
    numpy_results = True if mode in ("simulation", "baremetal") else None
    return Kernel(func, mode=mode, numpy_results=numpy_results, **kwargs)


def trace(func=None, **kwargs):
    """A kernel traced into its caller (``nki.jit(mode="trace")``); launched alone it runs like ``jit``."""
    return jit(func, mode="trace", **kwargs)


def baremetal(kernel=None, **kwargs):
    """Runs a kernel on NumPy arrays and returns NumPy results (no framework)."""
    if kernel is None:
        return functools.partial(baremetal, **kwargs)
    return Kernel(getattr(kernel, "func", kernel), mode="baremetal", numpy_results=True, **kwargs)


def simulate_kernel(kernel, *args, **kwargs):
    """Runs ``kernel`` (a function, a jit kernel or ``kernel[grid]``) on NumPy arrays; returns NumPy results."""
    from ._trace import _Launcher
    if isinstance(kernel, _Launcher):
        launcher = _Launcher(Kernel(kernel.kernel.func, numpy_results=True), kernel.grid)
        launcher.kernel._cache = kernel.kernel._cache
        return launcher(*args, **kwargs)
    k = Kernel(getattr(kernel, "func", kernel), numpy_results=True)
    if isinstance(kernel, Kernel):
        k._cache = kernel._cache
    return k(*args, **kwargs)


class _Latency:
    def __init__(self, samples):
        self._s = sorted(samples)

    def get_latency_percentile(self, p):
        """Latency in µs at percentile ``p`` (wall clock of the simulated launch)."""
        if not self._s:
            return 0.0
        i = min(len(self._s) - 1, max(0, round(p / 100 * (len(self._s) - 1))))
        return self._s[i]


class _BenchmarkResult:
    """``nc_latency``: wall clock of the simulated launches (host CPUs, not the hardware);
    ``modeled``: the kernel's modeled NeuronCore time (:class:`ModeledProfile`)."""

    def __init__(self, samples, modeled):
        self.nc_latency = _Latency(samples)
        self.modeled = modeled


def benchmark(kernel=None, warmup=10, iters=100, **kwargs):
    """Runs a kernel ``warmup`` + ``iters`` times; ``.benchmark_result.nc_latency`` holds the
    simulated launches' wall-clock latencies (µs) and ``.benchmark_result.modeled`` the kernel's
    modeled NeuronCore latency and engine utilization (see :func:`profile`)."""
    if kernel is None:
        return functools.partial(benchmark, warmup=warmup, iters=iters, **kwargs)
    base = kernel if isinstance(kernel, Kernel) else Kernel(kernel, numpy_results=True)

    class _Bench:
        benchmark_result = None

        def __getitem__(self, grid):
            return functools.partial(self._run, base[grid])

        def __call__(self, *args, **kw):
            return self._run(base, *args, **kw)

        def _run(self, k, *args, **kw):
            lat = benchmark_latencies(k, args, kw, warmup, iters)
            out = k(*args, **kw)
            self.benchmark_result = _BenchmarkResult(lat, _modeled_report(base.last_trace_stats.program))
            return out

    return _Bench()
