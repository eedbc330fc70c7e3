"""Index expressions of NKI kernels: ``nl.arange``/``nl.mgrid`` values, affine
combinations of them with loop indices, and the masks built by comparing them.

An expression is affine over the axes of its (NumPy-style, right-aligned)
shape: ``const + sum(coeff[a] * i_a)``. Indexing a tensor with expressions
gives an access pattern with the broadcast shape of the expressions.
"""
from __future__ import annotations

import numpy as np
import torch


def broadcast_shapes(*shapes):
    """NumPy broadcasting of shapes, with NKI's wording on failure."""
    try:
        return tuple(torch.broadcast_shapes(*[torch.Size(s) for s in shapes]))
    except RuntimeError:
        raise ValueError(f"index shapes {', '.join(str(tuple(s)) for s in shapes)} do not broadcast") from None


class IndexExpr:
    """An affine index: ``const + sum(terms[a] * iota_a)``; axes ``a`` are negative (right-aligned)."""

    __slots__ = ("const", "terms", "shape")

    def __init__(self, const, terms, shape):
        self.const = int(const)
        self.terms = {a: c for a, c in terms.items() if c != 0}
        self.shape = tuple(shape)

    # -- construction -------------------------------------------------
    def __getitem__(self, key):
        """``[:, None]``-style reshaping that places the axes of an arange."""
        if not isinstance(key, tuple):
            key = (key,)
        old = list(range(-len(self.shape), 0))
        new_shape, mapping, it = [], {}, iter(old)
        for k in key:
            if k is None:
                new_shape.append(1)
            elif isinstance(k, slice) and k == slice(None):
                a = next(it, None)
                if a is None:
                    raise IndexError("too many indices for an index expression")
                mapping[a] = len(new_shape)
                new_shape.append(self.shape[a])
            else:
                raise IndexError("an index expression can only be reshaped with ':' and None, e.g. nl.arange(128)[:, None]")
        for a in it:
            mapping[a] = len(new_shape)
            new_shape.append(self.shape[a])
        n = len(new_shape)
        return IndexExpr(self.const, {mapping[a] - n: c for a, c in self.terms.items()}, new_shape)

    def _combine(self, other, sign):
        if isinstance(other, IndexExpr):
            shape = broadcast_shapes(self.shape, other.shape)
            terms = dict(self.terms)
            for a, c in other.terms.items():
                terms[a] = terms.get(a, 0) + sign * c
            return IndexExpr(self.const + sign * other.const, terms, shape)
        if isinstance(other, int):
            return IndexExpr(self.const + sign * other, self.terms, self.shape)
        return NotImplemented

    def __add__(self, other):
        return self._combine(other, 1)

    __radd__ = __add__

    def __sub__(self, other):
        return self._combine(other, -1)

    def __rsub__(self, other):
        return (-self)._combine(other, 1)

    def __neg__(self):
        return IndexExpr(-self.const, {a: -c for a, c in self.terms.items()}, self.shape)

    def __mul__(self, other):
        if not isinstance(other, int):
            if isinstance(other, IndexExpr):
                raise ValueError("index expressions must be affine: the product of two index expressions is not")
            return NotImplemented
        return IndexExpr(self.const * other, {a: c * other for a, c in self.terms.items()}, self.shape)

    __rmul__ = __mul__

    def __floordiv__(self, other):
        raise ValueError("index expressions must be affine: use a multiple of the arange instead of //")

    # -- masks ----------------------------------------------------------
    def _cond(self, other, op):
        return Mask([(self - other, op)])

    def __lt__(self, other):
        return self._cond(other, "lt")

    def __le__(self, other):
        return self._cond(other, "le")

    def __gt__(self, other):
        return self._cond(other, "gt")

    def __ge__(self, other):
        return self._cond(other, "ge")

    def __eq__(self, other):  # noqa: D105 - a mask, as in NKI
        return self._cond(other, "eq")

    def __ne__(self, other):
        return self._cond(other, "ne")

    __hash__ = None

    # -- evaluation -----------------------------------------------------
    @property
    def ndim(self):
        return len(self.shape)

    def evaluate(self, shape):
        """The values over ``shape`` (to which this broadcasts), as an int64 tensor."""
        shape = tuple(shape)
        v = torch.full(shape, self.const, dtype=torch.int64)
        for a, c in self.terms.items():
            n = shape[a]
            view = [1] * len(shape)
            view[a] = n
            v = v + c * torch.arange(n, dtype=torch.int64).view(view)
        return v

    def __repr__(self):
        t = " + ".join(f"{c}*i{a}" for a, c in sorted(self.terms.items()))
        return f"IndexExpr({self.const}{' + ' + t if t else ''}, shape={self.shape})"


class Mask:
    """A conjunction of affine comparisons (``(i_p < n) & (i_f >= k)``)."""

    __slots__ = ("conds",)

    def __init__(self, conds):
        self.conds = list(conds)

    def __and__(self, other):
        if isinstance(other, (bool, np.bool_)):  # a comparison of plain loop indices
            return self if other else Mask(self.conds + [(IndexExpr(1, {}, ()), "lt")])  # 1 < 0: never
        if not isinstance(other, Mask):
            raise TypeError("masks combine with & only with other index comparisons")
        return Mask(self.conds + other.conds)

    __rand__ = __and__

    def __or__(self, other):
        raise ValueError("NKI masks are conjunctions of affine comparisons: '|' is not supported")

    def __bool__(self):
        # True, as NKI's mask objects are: public kernels write `mask=(a < n and b < m)`, which
        # Python evaluates to the second comparison alone, and results depend on it
        return True

    def evaluate(self, shape):
        ops = {"lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge, "eq": torch.eq, "ne": torch.ne}
        m = torch.ones(tuple(shape), dtype=torch.bool)
        for expr, op in self.conds:
            if len(expr.shape) > len(shape):
                raise ValueError(f"mask of shape {expr.shape} has more dimensions than the tile {tuple(shape)}")
            m &= ops[op](expr.evaluate(shape), 0)
        return m


def arange(start, stop=None, step=1):
    """``nl.arange``: a 1-D index expression."""
    if stop is None:
        start, stop = 0, start
    n = len(range(int(start), int(stop), int(step)))
    return IndexExpr(start, {-1: step}, (n,))


class MGrid(tuple):
    """The index expressions of ``nl.mgrid[...]``, also as ``.p`` and ``.x``."""

    @property
    def p(self):
        return self[0]

    @property
    def x(self):
        return self[1] if len(self) > 1 else self[-1]

    @property
    def y(self):
        return self[2]

    @property
    def z(self):
        return self[3]


class _MGridMaker:
    def __getitem__(self, key):
        if not isinstance(key, tuple):
            key = (key,)
        n = len(key)
        out = []
        for i, s in enumerate(key):
            if not isinstance(s, slice):
                raise IndexError("nl.mgrid takes slices, e.g. nl.mgrid[0:128, 0:512]")
            e = arange(s.start or 0, s.stop, s.step or 1)
            shape = [1] * n
            shape[i] = e.shape[0]
            out.append(IndexExpr(e.const, {i - n: e.terms.get(-1, 0)}, shape))
        return MGrid(out)


mgrid = _MGridMaker()


class DynSlice:
    """``nl.ds(start, size)``: ``size`` elements from ``start`` (``step`` apart)."""

    __slots__ = ("start", "size", "step")

    def __init__(self, start, size, step=1):
        self.start, self.size, self.step = start, int(size), int(step)

    def as_slice(self):
        return slice(self.start, self.start + self.size * self.step, self.step)


def ds(start, size, step=1):
    return DynSlice(start, size, step)
