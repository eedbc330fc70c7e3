"""Sequencer registers and dynamic loops (Gen-2 ``nisa.register_*``, ``nl.dynamic_range``,
``nl.fori_loop``): a loop whose trip count is read from device memory when the kernel runs.

The body is traced once, between a loop-begin and a loop-end instruction; the program runs it as
many times as the registers say. A tile used both in the loop and outside it keeps its memory for
the whole loop; a tile made in the body is new each iteration."""
from __future__ import annotations

import itertools
import math

from ._emit import current, kernel_line
from ._tensor import HBM, as_view


class VirtualRegister:
    """A 32-bit register of the engine sequencers (``nisa.register_alloc``)."""

    def __init__(self, index):
        self.index = index

    def __repr__(self):
        return f"VirtualRegister({self.index})"

    def __index__(self):
        raise TypeError("a register holds a value only when the kernel runs; use it as a dynamic_range / "
                        "fori_loop bound, or store it to memory with nisa.register_store")


def _counter(tr, name):
    counters = tr.__dict__.setdefault("_register_counters", {})
    counters.setdefault(name, itertools.count())
    return next(counters[name])


def _emit(name, ints, ops=()):
    accesses = [as_view(o).access(name) for o in ops]
    kind = "register" if name.startswith("register") else name
    current().program.emit(kind, name, accesses, [], [], [int(i) for i in ints], None, None, kernel_line())


def _reg(x, what):
    if not isinstance(x, VirtualRegister):
        raise TypeError(f"{what} must be a register from nisa.register_alloc, got {type(x).__name__}")
    return x.index


def _scalar_operand(t, name, role):
    v = as_view(t)
    if math.prod(v.sizes) != 1:
        raise ValueError(f"{name} {role} must hold exactly one element (shape [1] or [1, 1]), got {tuple(v.sizes)}")
    if v.tensor.tdtype.itemsize > 4:
        raise TypeError(f"{name} {role} must be a 32-bit (or narrower) value, got {v.dtype}")
    if v.space != HBM and len(v.sizes) < 2:
        v = v.reshape((1, 1))
    return v


def register_alloc(x=None):
    """A new register, holding ``x`` (an int) when given."""
    r = VirtualRegister(_counter(current(), "register"))
    if x is not None:
        register_move(r, x)
    return r


def register_move(dst, src):
    """``dst`` = an integer constant or another register's value."""
    if isinstance(src, VirtualRegister):
        _emit("register_move", [1, _reg(dst, "register_move dst"), src.index])
    else:
        _emit("register_move", [0, _reg(dst, "register_move dst"), int(src)])


def register_load(dst, src):
    """``dst`` = the one value of tensor ``src`` (HBM or SBUF), read when the kernel runs."""
    _emit("register_load", [2, _reg(dst, "register_load dst"), 0], [_scalar_operand(src, "register_load", "src")])


def register_store(dst, src):
    """Tensor ``dst`` (one element) = register ``src``'s value."""
    _emit("register_store", [3, _reg(src, "register_store src"), 0], [_scalar_operand(dst, "register_store", "dst")])


def _bound(x):
    return (1, x.index) if isinstance(x, VirtualRegister) else (0, int(x))


def _joint(kind, payload, action):
    """Runs ``action({core: payload})`` once for all logical cores of the launch (they meet there),
    or for this instance alone."""
    tr = current()
    if tr.lockstep is None:
        action({0: payload})
        return
    from .v2.isa import _meet
    _meet((kind,), set(range(tr.grid[0] if tr.grid else 1)), payload, action)


def _not_in_no_reorder(what):
    if current().__dict__.get("_no_reorder", 0):
        raise ValueError(f"{what}: register-based dynamic loops are not supported inside an nl.no_reorder() block")


def dynamic_range(start, stop=None, step=1):
    """``range(start, stop, step)`` run on the device: ``start``/``stop`` may be registers read when
    the loop starts; ``step`` is a positive constant. Yields the loop counter (a register). The
    logical cores of a ``kernel[2]`` launch run the loop together (the same number of times)."""
    _not_in_no_reorder("dynamic_range")
    if stop is None:
        start, stop = 0, start
    if isinstance(step, VirtualRegister) or int(step) <= 0:
        raise ValueError(f"dynamic_range step must be a positive integer constant, got {step!r}")
    tr = current()
    counter = register_alloc()
    open_loops = tr.__dict__.setdefault("_open_loops", [])

    def begin(calls):
        loop = _counter(tr, "loop")
        open_loops.append(loop)
        _emit("loop_begin", [loop, int(step), len(calls)] + [x for r in sorted(calls) for x in calls[r]])

    def end(calls):
        _emit("loop_end", [open_loops.pop()])

    _joint("dynamic_range", [counter.index, *_bound(start), *_bound(stop)], begin)
    yield counter
    _joint("dynamic_range_end", None, end)


def while_loop(init, body_fun):
    """Runs ``r = body_fun(r)`` while register ``r`` is nonzero, checked before each iteration
    (``init`` zero: no iteration). ``body_fun`` returns the register holding the next condition."""
    _not_in_no_reorder("while_loop")
    _reg(init, "while_loop init")
    tr = current()
    open_loops = tr.__dict__.setdefault("_open_loops", [])

    def begin(calls):
        loop = _counter(tr, "loop")
        open_loops.append(loop)
        _emit("loop_begin", [loop, 0, len(calls)] + [x for r in sorted(calls) for x in (calls[r], 0, 0, 0, 0)])

    def end(calls):
        _emit("loop_end", [open_loops.pop()] + [calls[r] for r in sorted(calls)])

    _joint("while_loop", init.index, begin)
    nxt = body_fun(init)
    _joint("while_loop_end", _reg(nxt, "the register while_loop's body returns"), end)


def fori_loop(lower, upper, body_fun, step=1):
    """Calls ``body_fun(i)`` for ``i`` in ``dynamic_range(lower, upper, step)``."""
    for i in dynamic_range(lower, upper, step):
        body_fun(i)
