"""``torch_neuronx.nki.profile``: a kernel's modeled NeuronCore time (csrc/nki/cost_model.cpp).

The simulated device runs on host CPUs, so its wall-clock time says nothing about the hardware;
this reports what the published per-instruction costs give on the target
(``NEURON_PLATFORM_TARGET_OVERRIDE``): latency, each engine's busy time and utilization, the Tensor
Engine's achieved FLOP/s, the bytes DMAs move. Everything it reports is modeled."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")


@dataclass
class ModeledProfile:
    """The modeled cost of one launch of a kernel (every figure is modeled, not measured)."""

    latency_us: float
    busy_us: dict
    tensor_flops: float
    tensor_peak_flops: float
    dma_bytes: float
    dma_queues: int = 16
    steps: list = field(repr=False, default_factory=list)  # (instruction, engine, start_us, end_us)

    def utilization(self, engine):
        """Fraction of the modeled latency ``engine`` is busy (``"dma"``: averaged over its queues;
        its busy time is summed over them)."""
        if not self.latency_us:
            return 0.0
        return self.busy_us[engine] / self.latency_us / (self.dma_queues if engine == "dma" else 1)

    @property
    def tensor_utilization(self):
        """Achieved matmul FLOP/s over the Tensor Engine's peak (bf16)."""
        return self.tensor_flops / (self.latency_us * 1e-6) / self.tensor_peak_flops if self.latency_us else 0.0

    def __str__(self):
        rows = [f"modeled latency {self.latency_us:.2f} us"]
        rows += [f"  {e:7s} busy {self.busy_us[e]:9.2f} us  ({100 * self.utilization(e):5.1f}% modeled)" for e in ENGINES]
        rows.append(f"  matmul {self.tensor_flops / 1e9:.3f} GFLOP, {100 * self.tensor_utilization:.1f}% of the Tensor "
                    f"Engine's modeled peak; DMA {self.dma_bytes / 1e6:.3f} MB")
        return "\n".join(rows)


def _report(program):
    r = program.model_cost()
    return ModeledProfile(r["latency_ns"] / 1e3, {k: v / 1e3 for k, v in r["busy_ns"].items() if k in ENGINES},
                          r["tensor_flops"], r["tensor_peak_flops"], r["dma_bytes"], r["dma_queues"],
                          [(n, e, s / 1e3, t / 1e3) for n, e, s, t in r["steps"]])


def profile(kernel):
    """``profile(kernel)[grid](*args)`` (or ``profile(kernel)(*args)``) runs the kernel once and
    returns its :class:`ModeledProfile`; ``.result`` holds what the kernel returned."""
    from ._trace import Kernel
    base = kernel if isinstance(kernel, Kernel) else Kernel(kernel, numpy_results=True)

    class _Profiler:
        result = None

        def __getitem__(self, grid):
            k = base[grid]
            return lambda *a, **kw: self._run(k, *a, **kw)

        def __call__(self, *a, **kw):
            return self._run(base, *a, **kw)

        def _run(self, k, *a, **kw):
            out = k(*a, **kw)
            rep = _report(base.last_trace_stats.program)
            rep.result = out
            return rep

    return _Profiler()


class _Launches(list):
    """The :class:`ModeledProfile` of each NKI launch made in a ``modeled_launches()`` block."""

    @property
    def latency_us(self):
        """Modeled time of the launches run one after another."""
        return sum(p.latency_us for p in self)

    @property
    def tensor_utilization(self):
        """Achieved matmul FLOP/s over the Tensor Engine's peak across the launches."""
        if not self or not self.latency_us:
            return 0.0
        return sum(p.tensor_flops for p in self) / (self.latency_us * 1e-6) / self[0].tensor_peak_flops


@contextlib.contextmanager
def modeled_launches():
    """Collects the modeled profile of every NKI kernel launched inside the block (a library op
    may launch several): ``with modeled_launches() as ls: op(...)``; then ``ls.latency_us``."""
    from . import _trace
    out = _Launches()
    cache = {}

    def observe(program):
        if id(program) not in cache:
            cache[id(program)] = (program, _report(program))
        out.append(cache[id(program)][1])
    _trace._launch_observers.append(observe)
    try:
        yield out
    finally:
        _trace._launch_observers.remove(observe)
