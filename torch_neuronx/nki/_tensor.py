"""Tensors a kernel sees (HBM arguments and allocations, SBUF/PSUM tiles) and
the access patterns that indexing them makes.

A :class:`View` is an affine map from its own index space (``sizes``) onto
its tensor's dimensions: ``index_k = consts[k] + sum_d coeffs[k][d] * i_d``.
It becomes an access pattern of the core (buffer, byte offset, sizes,
element strides) when an instruction uses it.
"""
from __future__ import annotations

import math
import sys

import numpy as np

from . import _index
from ._index import DynSlice, IndexExpr
from . import _views
from ._views import Gen2Views, _scalar_index

# Spaces as the C++ core numbers them, and its buffer numbering.
HBM, SBUF, PSUM = 0, 1, 2
SBUF_BUFFER, PSUM_BUFFER, FIRST_HBM_BUFFER = 0, 1, 2


_SPACES = {}  # the language's memory spaces by name (what NkiTensor.buffer returns)


class MemorySpace:
    """``nl.sbuf``, ``nl.psum``, ``nl.hbm``, ``nl.shared_hbm``, ``nl.private_hbm``."""

    def __init__(self, name, space):
        self.name, self.space = name, space
        _SPACES.setdefault(name, self)

    def __repr__(self):
        return f"nl.{self.name}"

    def mod_alloc(self, base_addr=0, *, base_bank=0, base_partition=0, num_bank_tiles=(), num_par_tiles=(),
                  num_free_tiles=()):
        """Manual modulo allocation (``ncc.sbuf.mod_alloc`` / ``ncc.psum.mod_alloc``): block ``idx`` of the
        tensor goes to partition ``base_partition + lin(idx % num_par_tiles) * P`` and byte
        ``base_addr + lin(idx % num_free_tiles) * tile_bytes`` (PSUM: in bank
        ``base_bank + lin(idx % num_bank_tiles)``); blocks that map to the same place share memory."""
        if self.space not in (SBUF, PSUM):
            raise ValueError(f"mod_alloc places SBUF or PSUM tensors, not {self.name}")

        def place(idx, pdim_size, fdim_size):
            part = _modulo(base_partition, num_par_tiles, pdim_size, idx)
            addr = _modulo(base_addr, num_free_tiles, fdim_size, idx)
            if self.space == PSUM:
                return (_modulo(base_bank, num_bank_tiles, 1, idx), part, addr)
            return (part, addr)
        return self.alloc(place)

    def alloc(self, func):
        """Manual allocation by a function ``func(block_idx, pdim_size, fdim_size)`` returning
        ``(partition, byte address)`` (SBUF) or ``(bank, partition, byte address)`` (PSUM)."""
        return ManualPlacement(self, func)

    def auto_alloc(self):
        return self


def _modulo(base, tiles, scale, idx):
    """``base + linearize(idx % tiles) * scale``; no ``tiles`` means every block at ``base``."""
    tiles = tuple(tiles) or (1,) * len(idx)
    off, mul = 0, 1
    for i, n in reversed(list(zip(idx, tiles))):
        off += (int(i) % int(n)) * mul
        mul *= int(n)
    return int(base) + off * int(scale)


class ManualPlacement:
    """A buffer with addresses chosen by the kernel (Gen-1 ``mod_alloc``/``alloc``, Gen-2
    ``nl.ndarray(address=)``): the tensor is placed there, not by the allocator."""

    def __init__(self, space, func):
        self.space, self.name, self.func = space.space, space.name, func

    def locations(self, blocks, partitions, block_bytes, bank_bytes):
        """(partition, byte within a partition) of each block, in row-major block order."""
        out = []
        for idx in np.ndindex(*blocks) if blocks else [()]:
            loc = tuple(int(v) for v in self.func(idx=tuple(int(i) for i in idx), pdim_size=partitions,
                                                    fdim_size=block_bytes))
            if self.space == PSUM:
                if len(loc) != 3:
                    raise ValueError(f"a PSUM allocation function returns (bank, partition, address), got {loc}")
                loc = (loc[1], loc[0] * bank_bytes + loc[2])
            elif len(loc) != 2:
                raise ValueError(f"an SBUF allocation function returns (partition, address), got {loc}")
            out.append(loc)
        return out


class par_dim:
    """Marks the partition dimension of an on-chip shape: ``(4, nl.par_dim(128), 512)``."""

    def __init__(self, size):
        self.size = int(size)

    def __index__(self):
        return self.size

    def __int__(self):
        return self.size

    def __repr__(self):
        return f"par_dim({self.size})"


from ._dtypes import PACKED, itemsize, nki_dtype, packed_dtype, packed_name, to_dtype  # noqa: E402,F401 - re-exported


class TileMath:
    """Operators on tiles: ``a + b``, ``a * 2.0``, ``-a``, comparisons, ``a += b``."""

    def _lang(self):
        from . import language
        return language

    def __add__(self, o):
        return DynIndex(self, o) if isinstance(o, IndexExpr) else self._lang().add(self, o)

    def __radd__(self, o):
        return DynIndex(self, o) if isinstance(o, IndexExpr) else self._lang().add(o, self)

    def __sub__(self, o): return self._lang().subtract(self, o)
    def __rsub__(self, o): return self._lang().subtract(o, self)
    def __mul__(self, o): return self._lang().multiply(self, o)
    def __rmul__(self, o): return self._lang().multiply(o, self)
    def __truediv__(self, o): return self._lang().divide(self, o)
    def __rtruediv__(self, o): return self._lang().divide(o, self)
    def __pow__(self, o): return self._lang().power(self, o)
    def __neg__(self): return self._lang().negative(self)
    def __abs__(self): return self._lang().abs(self)
    def __lt__(self, o): return self._lang().less(self, o)
    def __le__(self, o): return self._lang().less_equal(self, o)
    def __gt__(self, o): return self._lang().greater(self, o)
    def __ge__(self, o): return self._lang().greater_equal(self, o)
    def __and__(self, o): return self._lang().bitwise_and(self, o)
    def __or__(self, o): return self._lang().bitwise_or(self, o)
    def __xor__(self, o): return self._lang().bitwise_xor(self, o)
    def __invert__(self): return self._lang().invert(self)
    def __matmul__(self, o): return self._lang().matmul(self, o)

    def _inplace(self, op, o, sole=False):
        self._lang()._update(self.view_all(), op, o, sole=sole)
        return self

    def __iadd__(self, o):
        sole = sys.getrefcount(o) <= 3  # the statement's, this frame's, getrefcount's: nothing else holds o
        return self._inplace("add", o, sole)

    def __isub__(self, o): return self._inplace("subtract", o)
    def __imul__(self, o): return self._inplace("multiply", o)
    def __itruediv__(self, o): return self._inplace("divide", o)

    __hash__ = object.__hash__

    # tensor methods of Gen-1's nki.tensor
    def broadcast_to(self, shape):
        return self.view_all().broadcast_to(shape)

    def expand_dims(self, axis):
        return self._lang().expand_dims(self, axis)

    def astype(self, dtype):
        return self._lang().copy(self, dtype=dtype)

    def assert_shape(self, shape):
        if tuple(self.shape) != tuple(shape):
            raise AssertionError(f"shape {list(self.shape)} does not match the expected shape {list(shape)}")
        return self

    @property
    def itemsize(self):
        return itemsize(self.tdtype)


class DynIndex:
    """An index read when the instruction runs, from a (1, 1) SBUF tile (``t[i_p, off[0, j] + i_f]``),
    plus a static part: an int, an index expression or a slice."""

    __slots__ = ("value", "base")

    def __init__(self, value, base=0):
        self.value, self.base = value, base

    def __add__(self, o):
        if isinstance(o, (int, np.integer, IndexExpr)) and not isinstance(self.base, slice):
            return DynIndex(self.value, self.base + o)
        return NotImplemented

    __radd__ = __add__


class NkiTensor(TileMath):
    """A tensor in HBM (a kernel argument or an allocation) or a tile in SBUF/PSUM."""

    def __init__(self, trace, buffer, space, shape, dtype, strides, byte_offset=0, partition_axis=0, name="",
                 tile=-1):
        self.trace, self.bufidx, self.space = trace, buffer, space
        self.shape, self.tdtype = tuple(int(s) for s in shape), dtype
        self.strides, self.byte_offset = tuple(strides), byte_offset
        self.partition_axis, self.name = partition_axis, name
        self.tile = tile  # on-chip: the program's tile (placed when the kernel is traced)

    @property
    def ndim(self):
        return len(self.shape)

    declared = None  # the dtype a kernel asked for when stored wider (NKI_PRECISE_FP=0)
    block_locs = None  # manual placement with unevenly spaced blocks: block index -> arena byte offset
    serial = -1        # creation order in the trace (kernel arguments: -1)
    memory_name = None  # the memory space it was allocated in ("shared_hbm", ...); None: by its space
    # The packed MX type stored as raw words ("float8_e4m3fn_x4" ...): None inherits it from the
    # tensor this one aliases, "" is none.
    _packed = None

    @property
    def packed(self):
        t = self
        while t._packed is None:
            base = getattr(t, "_base", None)
            if base is None or base.tdtype != t.tdtype:
                return None
            t = base
        return t._packed or None

    @property
    def buffer(self):
        """The memory space the tensor lives in (``t.buffer == nl.sbuf``), as NKI reports it."""
        base = self
        while getattr(base, "_base", None) is not None:
            base = base._base
        name = base.memory_name or {HBM: "hbm", SBUF: "sbuf", PSUM: "psum"}[self.space]
        return _SPACES.get(name, name)

    @property
    def dtype(self):
        """The NKI dtype (NumPy's; ``nl.float32`` compares equal)."""
        packed = self.packed
        return packed_dtype(packed) if packed else nki_dtype(self.declared or self.tdtype)

    @property
    def buffer_space(self):
        return {HBM: "hbm", SBUF: "sbuf", PSUM: "psum"}[self.space]

    def view_all(self):
        n = len(self.shape)
        return View(self, self.shape, [0] * n, [tuple(int(d == k) for d in range(n)) for k in range(n)])

    def __getitem__(self, key):
        return self.view_all()[key]

    def __setitem__(self, key, value):
        sole = sys.getrefcount(value) <= 3  # the statement's, this frame's, getrefcount's: nothing else holds it
        self._lang()._into(self.view_all()[key], value, sole=sole)

    def reshape(self, shape):
        """The same memory in another shape (a contiguous tensor; on-chip the partition dim stays)."""
        shape = [int(s) for s in shape]
        if shape.count(-1) == 1:
            known = math.prod(s for s in shape if s != -1)
            shape[shape.index(-1)] = math.prod(self.shape) // known if known else 0
        shape = tuple(shape)
        if math.prod(shape) != math.prod(self.shape):
            raise ValueError(f"cannot reshape {self.shape} into {shape}")
        row = lambda sh: [math.prod(sh[k + 1:]) for k in range(len(sh))]  # noqa: E731
        if self.space == HBM and list(self.strides) == row(self.shape):
            alias = NkiTensor(self.trace, self.bufidx, self.space, shape, self.tdtype, row(shape), self.byte_offset,
                              None, self.name)
        elif (self.space != HBM and self.partition_axis == 0 and shape and shape[0] == self.shape[0]
              and list(self.strides[1:]) == row(self.shape)[1:]):
            alias = NkiTensor(self.trace, self.bufidx, self.space, shape, self.tdtype,
                              [self.strides[0]] + row(shape)[1:], self.byte_offset, 0, self.name, self.tile)
        else:
            return self.view_all().reshape(shape)
        alias._base = self  # keeps the allocation alive
        return alias

    def view(self, dtype):
        """The same bytes as another dtype (a contiguous tensor; the last dim rescaled)."""
        new = to_dtype(dtype)
        if new == self.tdtype and packed_name(dtype) == self.packed:
            return self
        old_item, new_item = itemsize(self.tdtype), itemsize(new)
        shape = list(self.shape)
        if (shape[-1] * old_item) % new_item:
            raise ValueError(f"view({new}): the last dimension's {shape[-1] * old_item} bytes are not a whole "
                             f"number of {new_item}-byte elements")
        shape[-1] = shape[-1] * old_item // new_item
        row = lambda sh: [math.prod(sh[k + 1:]) for k in range(len(sh))]  # noqa: E731
        first = 0 if self.space == HBM else 1
        if list(self.strides[first:]) != row(self.shape)[first:] or (self.space != HBM and self.partition_axis):
            raise ValueError("view(dtype) needs a contiguous tensor")
        strides = row(shape)
        if self.space != HBM:
            if (self.strides[0] * old_item) % new_item:
                raise ValueError(f"view({new}): a partition's bytes are not a whole number of elements")
            strides[0] = self.strides[0] * old_item // new_item
        alias = NkiTensor(self.trace, self.bufidx, self.space, shape, new, strides, self.byte_offset,
                          None if self.space == HBM else 0, self.name, self.tile)
        alias._base, alias._packed = self, packed_name(dtype) or ""
        return alias

    def __getattr__(self, name):
        # Gen-2 view methods (ap, slice, select, permute, ...) of the whole tensor
        if name in ("ap", "slice", "select", "vector_select", "permute", "broadcast", "expand_dim", "squeeze_dim"):
            return getattr(self.view_all(), name)
        raise AttributeError(f"'NkiTensor' object has no attribute '{name}'")

    def __repr__(self):
        return f"NkiTensor({self.name or '?'}, {self.buffer_space}, shape={self.shape}, dtype={self.dtype})"


class View(TileMath, Gen2Views):
    """An access pattern: ``sizes`` mapped affinely onto ``tensor``'s dimensions."""

    __slots__ = ("tensor", "sizes", "consts", "coeffs", "indirect", "dynamic")

    def __init__(self, tensor, sizes, consts, coeffs, indirect=None, dynamic=()):
        self.tensor, self.sizes = tensor, tuple(int(s) for s in sizes)
        self.consts, self.coeffs = list(consts), [tuple(c) for c in coeffs]
        # (tensor dim, index view): that dim is indexed per row (result dim 0) by values in an SBUF tile
        self.indirect = indirect
        # (tensor dim, (1, 1) tile view, scale): index of that dim += scale * the tile's value at run time
        self.dynamic = tuple(dynamic)

    # the attributes kernels read
    shape = property(lambda self: self.sizes)
    dtype = property(lambda self: self.tensor.dtype)
    tdtype = property(lambda self: self.tensor.tdtype)
    ndim = property(lambda self: len(self.sizes))
    space = property(lambda self: self.tensor.space)
    buffer_space = property(lambda self: self.tensor.buffer_space)
    buffer = property(lambda self: self.tensor.buffer)

    def view_all(self):
        return self

    # -- indexing -------------------------------------------------------
    def __getitem__(self, key):
        if not isinstance(key, tuple):
            key = (key,)
        n = len(self.sizes)
        if any(k is Ellipsis for k in key):
            i = next(i for i, k in enumerate(key) if k is Ellipsis)
            key = key[:i] + (slice(None),) * (n - len(key) + 1) + key[i + 1:]
        if len(key) > n:
            raise IndexError(f"too many indices: {len(key)} for a tensor of {n} dimensions {self.sizes}")
        key = tuple(k.as_slice() if isinstance(k, DynSlice) else k for k in key) + (slice(None),) * (n - len(key))
        if self.tensor.space != HBM:  # a (1, 1) tile as an on-chip index: its value, read at run time
            key = tuple(DynIndex(k) if isinstance(k, (NkiTensor, View)) else k for k in key)
            key = self._on_chip_key(key)
        dyn_keys = [(j, k.value) for j, k in enumerate(key) if isinstance(k, DynIndex)]
        key = tuple(k.base if isinstance(k, DynIndex) else k for k in key)
        # an SBUF tile of indices (dynamic indexing of an HBM tensor's leading dim)
        dyn = [j for j, k in enumerate(key) if isinstance(k, (NkiTensor, View))]
        indirect_index = None
        if dyn:
            j = dyn[0]
            if len(dyn) > 1 or self.tensor.space != HBM or self.indirect is not None:
                raise IndexError("dynamic indexing takes one SBUF tile of indices, on an HBM tensor's dimension")
            iv = as_view(key[j])
            if iv.space == HBM:
                raise IndexError("indices for dynamic indexing must be in SBUF (load them first)")
            rows = iv.sizes[0]
            if math.prod(iv.sizes) != rows:
                raise IndexError(f"an index tile has one index per partition, got shape {list(iv.sizes)}")
            indirect_index = iv
            key = key[:j] + (IndexExpr(0, {}, (rows, 1)),) + key[j + 1:]  # one row per index
        exprs = [k for k in key if isinstance(k, IndexExpr)]
        bshape = _index.broadcast_shapes(*[e.shape for e in exprs]) if exprs else ()
        nb = len(bshape)
        slice_dims = [j for j, k in enumerate(key) if isinstance(k, slice)]
        sizes = list(bshape)
        per_dim = []  # for each of our dims: (const, coeffs over the new dims)
        for j, k in enumerate(key):
            if isinstance(k, IndexExpr):
                co = [0] * (nb + len(slice_dims))
                for a, c in k.terms.items():
                    if k.shape[a] != 1:
                        co[nb + a] += c
                per_dim.append((k.const, co))
            elif isinstance(k, slice):
                start = 0 if k.start is None else int(k.start)
                stop = self.sizes[j] if k.stop is None else int(k.stop)
                step = 1 if k.step is None else int(k.step)
                if step <= 0:
                    raise IndexError("NKI slices need a positive step")
                co = [0] * (nb + len(slice_dims))
                co[len(sizes)] = step
                sizes.append(max(0, len(range(start, stop, step))))
                per_dim.append((start, co))
            elif isinstance(k, (int, np.integer)) or hasattr(k, "__index__"):
                i = int(k)
                if i < 0:
                    i += self.sizes[j]
                if not 0 <= i < self.sizes[j]:
                    raise IndexError(f"index {int(k)} is out of bounds for dimension {j} with size {self.sizes[j]}")
                per_dim.append((i, [0] * (nb + len(slice_dims))))
            else:
                raise IndexError(f"unsupported index {k!r}: use ints, slices, nl.ds, nl.arange/nl.mgrid expressions")
        # compose with our own map onto the tensor
        consts, coeffs = [], []
        for k in range(len(self.consts)):
            c = self.consts[k] + sum(self.coeffs[k][j] * per_dim[j][0] for j in range(n))
            co = tuple(sum(self.coeffs[k][j] * per_dim[j][1][d] for j in range(n)) for d in range(len(sizes)))
            consts.append(c)
            coeffs.append(co)
        indirect = self.indirect
        if indirect_index is not None:
            if not (exprs and sizes and sizes[0] == indirect_index.sizes[0]):
                raise IndexError("the index tile must give the access's first (partition) dimension")
            k = next(k for k in range(len(self.consts)) if self.coeffs[k][dyn[0]])
            indirect = (k, indirect_index)
        dynamic = list(self.dynamic)
        for j, value in dyn_keys:
            sv = _scalar_index(value)
            for k in range(len(self.consts)):
                if self.coeffs[k][j]:
                    if self.tensor.space != HBM and k == (self.tensor.partition_axis or 0):
                        raise IndexError("a run-time index cannot select SBUF/PSUM partitions (dimension 0)")
                    dynamic.append((k, sv, self.coeffs[k][j]))
        return View(self.tensor, sizes, consts, coeffs, indirect, dynamic)

    def __setitem__(self, key, value):
        sole = sys.getrefcount(value) <= 3  # as NkiTensor.__setitem__
        self._lang()._into(self[key], value, sole=sole)

    def reshape(self, shape):
        """A reshape of a contiguous range (row-major), as NKI's tensor reshape."""
        shape = [int(s) for s in shape]
        if shape.count(-1) == 1:
            known = math.prod(s for s in shape if s != -1)
            shape[shape.index(-1)] = math.prod(self.sizes) // known if known else 0
        shape = tuple(shape)
        if math.prod(shape) != math.prod(self.sizes):
            raise ValueError(f"cannot reshape {self.sizes} into {shape}")
        flat = [0] * len(self.sizes)
        # strides of our dims in row-major element order must be consistent
        s = 1
        for d in range(len(self.sizes) - 1, -1, -1):
            flat[d] = s
            s *= self.sizes[d]
        # new dim e spans a contiguous row-major range: express via our dims
        new_coeffs = []
        for k in range(len(self.consts)):
            new_coeffs.append([0] * len(shape))
        acc = 1
        for e in range(len(shape) - 1, -1, -1):
            # the row-major step of new dim e, decomposed onto our dims
            rem = acc
            step_coeffs = [0] * len(self.sizes)
            for d in range(len(self.sizes)):
                q, rem = divmod(rem, flat[d])
                step_coeffs[d] = q
            for k in range(len(self.consts)):
                new_coeffs[k][e] = sum(self.coeffs[k][d] * step_coeffs[d] for d in range(len(self.sizes)))
            acc *= shape[e]
        indirect = self.indirect
        if indirect is not None and (not shape or shape[0] != self.sizes[0]):
            raise ValueError(f"reshape of {self.sizes} into {shape}: an indirect access keeps its rows (dim 0)")
        v = View(self.tensor, shape, self.consts, new_coeffs, indirect, self.dynamic)
        # valid only if every element maps as the row-major reshape would
        if not _reshape_is_affine(self, v):
            flat = self._as_flat()  # dims may still merge in memory (a contiguous tensor)
            if flat is not None and flat is not self:
                return flat.reshape(shape)
            raise ValueError(f"reshape of {self.sizes} into {shape} does not keep a regular access pattern")
        return v

    def broadcast_to(self, shape):  # noqa: F811 - the view's own
        """Stride-0 expansion of size-1 dims (and new leading dims)."""
        shape = tuple(int(s) for s in shape)
        lead = len(shape) - len(self.sizes)
        if lead < 0:
            raise ValueError(f"cannot broadcast {self.sizes} to {shape}")
        coeffs = []
        for k in range(len(self.consts)):
            co = [0] * lead + list(self.coeffs[k])
            for d, s in enumerate(self.sizes):
                if s != shape[lead + d]:
                    if s != 1:
                        raise ValueError(f"cannot broadcast {self.sizes} to {shape}")
                    co[lead + d] = 0
            coeffs.append(co)
        return View(self.tensor, shape, self.consts, coeffs, dynamic=self.dynamic)

    def _on_chip_key(self, key):
        """On-chip indexing keeps a tile 2-D: an int on a block dim drops it, an int on the partition
        dim keeps it (size 1), ints on free dims drop them unless fewer than two dims would remain
        (the last is then kept, size 1), as NKI's tiles behave."""
        dyn = {j: k.value for j, k in enumerate(key) if isinstance(k, DynIndex)}
        key = [k.base if isinstance(k, DynIndex) else k for k in key]
        pa = self.tensor.partition_axis or 0
        kinds = []
        for d in range(len(self.sizes)):
            if any(self.coeffs[k][d] for k in range(pa)):
                kinds.append("block")
            elif self.coeffs[pa][d]:
                kinds.append("partition")
            else:
                kinds.append("free")
        for d, k in enumerate(key):
            if kinds[d] == "partition" and _is_int(k):
                key[d] = slice(int(k), int(k) + 1)
        # index expressions give the dims of their broadcast shape; slices one each
        exprs = [k.shape for k in key if isinstance(k, IndexExpr)]
        kept = (len(_index.broadcast_shapes(*exprs)) if exprs else 0) + sum(
            1 for d, k in enumerate(key) if kinds[d] != "block" and isinstance(k, slice))
        for d in range(len(key) - 1, -1, -1):
            if kept >= 2:
                break
            if kinds[d] == "free" and _is_int(key[d]):
                key[d] = slice(int(key[d]), int(key[d]) + 1)
                kept += 1
        return tuple(DynIndex(dyn[j], k) if j in dyn else k for j, k in enumerate(key))

    # -- Gen-2 view methods (ap, select, vector_select: _views.Gen2Views) ---
    def slice(self, dim, start, end, step=1):
        key = [slice(None)] * len(self.sizes)
        key[dim] = slice(start, end, step)
        return self[tuple(key)]

    def permute(self, dims):
        dims = list(dims)
        return View(self.tensor, [self.sizes[d] for d in dims], self.consts,
                    [tuple(c[d] for d in dims) for c in self.coeffs], dynamic=self.dynamic)

    def broadcast(self, dim, size):
        shape = list(self.sizes)
        shape[dim] = size
        return self.broadcast_to(shape)

    def expand_dim(self, dim):
        return self.reshape(self.sizes[:dim] + (1,) + self.sizes[dim:])

    def squeeze_dim(self, dim):
        return self.reshape(self.sizes[:dim] + self.sizes[dim + 1:])

    def narrow(self, dim, start, length):
        consts = [self.consts[k] + self.coeffs[k][dim] * start for k in range(len(self.consts))]
        sizes = list(self.sizes)
        sizes[dim] = length
        indirect = self.indirect
        if indirect is not None and dim == 0:
            indirect = (indirect[0], indirect[1].narrow(0, start, length))
        return View(self.tensor, sizes, consts, self.coeffs, indirect, self.dynamic)

    def transposed(self):
        """The 2-D transpose of this access (dims swapped, no data moved)."""
        if len(self.sizes) != 2:
            raise ValueError(f"transpose takes a 2-D tile, got shape {self.sizes}")
        return View(self.tensor, self.sizes[::-1], self.consts, [c[::-1] for c in self.coeffs],
                    dynamic=self.dynamic)

    # -- the core's access pattern ---------------------------------------
    def bounds_error(self):
        """None if every index stays inside the tensor, else a message."""
        t = self.tensor
        dyn_dims = {k for k, _, _ in self.dynamic}
        for k, n in enumerate(t.shape):
            if (self.indirect is not None and k == self.indirect[0]) or k in dyn_dims:
                continue  # checked per index when the kernel runs
            lo = hi = self.consts[k]
            for d, s in enumerate(self.sizes):
                span = self.coeffs[k][d] * (s - 1)
                if span < 0:
                    lo += span
                else:
                    hi += span
            if min(self.sizes, default=1) == 0:
                return None
            if lo < 0 or hi >= n:
                bad = lo if lo < 0 else hi
                return (f"out-of-bounds access: index {bad} of dimension {k} of {t.name or 'tensor'} "
                        f"(shape {t.shape}); indices must stay in [0, {n}) or be masked with mask=")
        return None

    def access(self, role, dyn_srcs=None, oob_skip=False):
        """The core's access tuple; run-time indices add their (1, 1) source tiles to ``dyn_srcs``
        (``oob_skip``: an index outside the tensor skips the instruction instead of raising)."""
        t = self.tensor
        item = itemsize(t.tdtype)
        off = t.byte_offset + item * sum(self.consts[k] * t.strides[k] for k in range(len(t.shape)))
        strides = [sum(self.coeffs[k][d] * t.strides[k] for k in range(len(t.shape))) for d in range(len(self.sizes))]
        if t.block_locs is not None:
            off += self._block_offsets(strides, item)
        if not self.dynamic:
            return (t.bufidx, t.tdtype, off, list(self.sizes), strides, role, t.tile)
        if dyn_srcs is None:
            raise ValueError(f"{role}: a run-time index is not supported on this operand")
        if t.block_locs is not None:
            raise ValueError(f"{role}: a run-time index into a tensor with unevenly placed blocks")
        entries = []
        for k, sv, scale in self.dynamic:
            n = t.shape[k]
            lo = hi = self.consts[k]
            for d, s in enumerate(self.sizes):
                span = self.coeffs[k][d] * (s - 1)
                lo, hi = (lo + span, hi) if span < 0 else (lo, hi + span)
            # the values v with lo + scale * v >= 0 and hi + scale * v <= n - 1
            if scale > 0:
                vlo, vhi = -(lo // scale), (n - 1 - hi) // scale
            else:
                vlo, vhi = -((hi - n + 1) // scale), (-lo) // scale
            dyn_srcs.append(sv.access(role + "_offset"))
            entries.append((len(dyn_srcs) - 1, scale * t.strides[k], vlo, vhi,
                            f"dimension {k} of {t.name or 'the tensor'} (size {n})", bool(oob_skip)))
        return (t.bufidx, t.tdtype, off, list(self.sizes), strides, role, t.tile, entries)

    def _block_offsets(self, strides, item):
        """The arena offset of the first block this access touches; adds the byte step between
        blocks to ``strides`` of the dims that walk blocks (which must be evenly spaced)."""
        t = self.tensor
        nb = t.partition_axis
        block = lambda i: tuple(self.consts[k] + sum(c * v for c, v in zip(self.coeffs[k], i))  # noqa: E731
                                for k in range(nb))
        zero = [0] * len(self.sizes)
        base = t.block_locs[block(zero)]
        walk = [d for d in range(len(self.sizes)) if self.sizes[d] > 1 and any(self.coeffs[k][d] for k in range(nb))]
        steps = {}
        for d in walk:
            unit = list(zero)
            unit[d] = 1
            steps[d] = t.block_locs[block(unit)] - base
        spaced = all(v % item == 0 for v in steps.values()) and all(
            t.block_locs[block(i)] == base + sum(i[d] * steps[d] for d in walk)
            for i in np.ndindex(*[self.sizes[d] if d in steps else 1 for d in range(len(self.sizes))]))
        if not spaced:
            raise ValueError(f"an access across blocks of {t.name or 'a tensor'} whose manual placement puts them at "
                             f"unevenly spaced addresses: index one block at a time")
        for d in walk:
            strides[d] += steps[d] // item
        return base

    def __repr__(self):
        return f"View({self.tensor!r}, sizes={self.sizes})"


def _is_int(k):
    return not isinstance(k, (slice, IndexExpr)) and hasattr(k, "__index__")


def _reshape_is_affine(src, dst):
    """Checks a reshape on a sample of positions (cheap; shapes are small)."""
    n = math.prod(src.sizes)
    for flat in {0, 1, n // 2, n - 1} if n else ():
        if flat < 0 or flat >= n:
            continue
        a = np.unravel_index(flat, src.sizes)
        b = np.unravel_index(flat, dst.sizes)
        for k in range(len(src.consts)):
            va = src.consts[k] + sum(src.coeffs[k][d] * int(a[d]) for d in range(len(a)))
            vb = dst.consts[k] + sum(dst.coeffs[k][d] * int(b[d]) for d in range(len(b)))
            if va != vb:
                return False
    return True


def as_view(x):
    if isinstance(x, NkiTensor):
        return x.view_all()
    if isinstance(x, View):
        return x
    raise TypeError(f"expected an NKI tensor or tile, got {type(x).__name__}")


def is_tile(x):
    return isinstance(x, (NkiTensor, View))


_views.bind(globals())
