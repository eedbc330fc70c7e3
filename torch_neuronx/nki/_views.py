"""Access-pattern methods of views that the Gen-2 API adds: ``.ap()`` over a tensor's flat
storage (with run-time ``scalar_offset``/``vector_offset`` and ``dtype`` reinterpretation),
``select`` by a run-time index, ``vector_select``; and the flat-storage view that lets contiguous
dims merge in a reshape. Mixed into ``_tensor.View``; the names below from ``_tensor`` are bound
when it has loaded (``bind``), as the two modules refer to each other."""
from __future__ import annotations

import math

HBM = SBUF = NkiTensor = View = DynIndex = to_dtype = packed_name = itemsize = as_view = None  # bound by _tensor


def bind(ns):
    """Takes ``_tensor``'s names once it has defined them."""
    g = globals()
    for name in ("HBM", "SBUF", "NkiTensor", "View", "DynIndex", "to_dtype", "packed_name", "itemsize", "as_view"):
        g[name] = ns[name]


class Gen2Views:
    """Gen-2 access-pattern methods of ``_tensor.View``."""

    def _as_flat(self):
        """This access over the tensor's storage seen flat ((P, F) on chip, (N,) in HBM), where
        dims that are contiguous in memory can merge; None if the tensor is not contiguous."""
        t = self.tensor
        row = [math.prod(t.shape[k + 1:]) for k in range(len(t.shape))]
        n = len(self.sizes)
        if self.indirect is not None or t.block_locs is not None:
            return None
        if t.space == HBM:
            if list(t.strides) != row or len(t.shape) == 1:
                return None
            flat = NkiTensor(t.trace, t.bufidx, t.space, (math.prod(t.shape),), t.tdtype, (1,), t.byte_offset, None,
                             t.name)
            groups = [list(range(len(t.shape)))]
        else:
            if t.partition_axis or list(t.strides[1:]) != row[1:] or len(t.shape) == 2:
                return None
            flat = NkiTensor(t.trace, t.bufidx, t.space, (t.shape[0], math.prod(t.shape[1:])), t.tdtype,
                             (t.strides[0], 1), t.byte_offset, 0, t.name, t.tile)
            groups = [[0], list(range(1, len(t.shape)))]
        flat._base = t
        scale = [1] + row[1:] if t.space != HBM else row
        consts = [sum(self.consts[k] * scale[k] for k in g) for g in groups]
        coeffs = [tuple(sum(self.coeffs[k][d] * scale[k] for k in g) for d in range(n)) for g in groups]
        which = {k: j for j, g in enumerate(groups) for k in g}
        dynamic = [(which[k], sv, sc * scale[k]) for k, sv, sc in self.dynamic]
        return View(flat, self.sizes, consts, coeffs, None, dynamic)

    def ap(self, pattern, offset=None, scalar_offset=None, vector_offset=None, indirect_dim=0, dtype=None):
        """An access pattern over the tensor's flattened storage: ``[[step, num], ...]`` (outermost
        first; on-chip, the first pair walks partitions with step = elements per partition)."""
        if scalar_offset is not None and vector_offset is not None:
            raise ValueError(".ap(): scalar_offset and vector_offset are mutually exclusive")
        t = self.tensor
        shape = t.shape
        row = [math.prod(shape[k + 1:]) for k in range(len(shape))]
        # dtype=: the same bytes read as another dtype (pattern, offset and sizes in its elements)
        new = to_dtype(dtype) if dtype is not None else t.tdtype
        old_item, new_item = itemsize(t.tdtype), itemsize(new)
        if offset is None:
            offset = sum(self.consts[k] * row[k] for k in range(len(shape))) * old_item // new_item
        sizes = [int(n) for _, n in pattern]
        indirect_dim = int(indirect_dim)
        if t.space == HBM:
            if list(t.strides) != row:
                raise ValueError(".ap() on an HBM tensor needs its storage contiguous")
            if vector_offset is not None:
                if new != t.tdtype:
                    raise ValueError(".ap(vector_offset=) with dtype= is not supported")
                return self._ap_rows(pattern, int(offset), vector_offset, indirect_dim)
            nbytes = math.prod(shape) * old_item
            if nbytes % new_item:
                raise ValueError(f".ap(dtype={new}): {nbytes} bytes are not a whole number of elements")
            flat = NkiTensor(t.trace, t.bufidx, t.space, (nbytes // new_item,), new, (1,), t.byte_offset, None,
                             t.name)
            flat._base = t
            if dtype is not None:
                flat._packed = packed_name(dtype) or ""
            dynamic = () if scalar_offset is None else [
                (0, _scalar_index(scalar_offset), row[indirect_dim] * old_item // new_item)]
            return View(flat, sizes, [int(offset)], [tuple(int(st) for st, _ in pattern)], dynamic=dynamic)
        if vector_offset is not None:
            raise ValueError(".ap(vector_offset=) indexes the rows of an HBM tensor (indirect_dim 0)")
        if scalar_offset is not None and indirect_dim == 0:
            raise ValueError(".ap(scalar_offset=) cannot select SBUF/PSUM partitions (indirect_dim 0)")
        if (math.prod(shape[1:]) * old_item) % new_item or (t.strides[0] * old_item) % new_item:
            raise ValueError(f".ap(dtype={new}): a partition's bytes are not a whole number of elements")
        F = math.prod(shape[1:]) * old_item // new_item
        step0 = int(pattern[0][0])
        if F and step0 % F:
            raise ValueError(f".ap() partition step {step0} must be a multiple of the elements per partition ({F})")
        flat = NkiTensor(t.trace, t.bufidx, t.space, (shape[0], F), new, (t.strides[0] * old_item // new_item, 1),
                         t.byte_offset, 0, t.name, t.tile)
        flat._base = t
        if dtype is not None:
            flat._packed = packed_name(dtype) or ""
        po, fo = divmod(int(offset), F) if F else (int(offset), 0)
        dynamic = () if scalar_offset is None else [
            (1, _scalar_index(scalar_offset), row[indirect_dim] * old_item // new_item)]
        return View(flat, sizes, [po, fo], [(step0 // F if F else 0,) + (0,) * (len(sizes) - 1),
                                            (0,) + tuple(int(st) for st, _ in pattern[1:])], dynamic=dynamic)

    def _ap_rows(self, pattern, offset, vector_offset, indirect_dim):
        """``.ap(vector_offset=)``: result row i is the HBM tensor's row ``vector_offset[i]`` (its first
        pattern pair is the rows; the others walk within a row, from ``offset``)."""
        if indirect_dim != 0:
            raise ValueError(".ap(vector_offset=) supports indirect_dim 0 only")
        t = self.tensor
        R, F = t.shape[0], math.prod(t.shape[1:])
        rows = NkiTensor(t.trace, t.bufidx, t.space, (R, F), t.tdtype, (F, 1), t.byte_offset, None, t.name)
        rows._base = t
        iv = as_view(vector_offset)
        if iv.space != SBUF or math.prod(iv.sizes) != iv.sizes[0] or iv.sizes[0] != int(pattern[0][1]):
            raise IndexError(f".ap(vector_offset=) takes an SBUF tile of one row index per partition, "
                             f"{int(pattern[0][1])} rows, got shape {list(iv.sizes)}")
        sizes = [int(n) for _, n in pattern]
        within = (0,) + tuple(int(st) for st, _ in pattern[1:])
        return View(rows, sizes, [0, offset % F], [(0,) * len(sizes), within], (0, iv))

    def select(self, dim, index):
        """The slice at ``index`` of ``dim`` (removed); a (1, 1) SBUF tile index is read at run time."""
        key = [slice(None)] * len(self.sizes)
        key[dim] = DynIndex(index) if isinstance(index, (NkiTensor, View)) else int(index)
        return self[tuple(key)]

    def vector_select(self, dim, offsets):
        """Rows of an HBM tensor chosen at run time: result row ``p`` is row ``offsets[p]`` (``dim`` 0)."""
        if dim != 0 or self.tensor.space != HBM:
            raise ValueError("vector_select selects rows (dim 0) of an HBM tensor")
        t = self.tensor
        return self.ap([[math.prod(t.shape[1:]), as_view(offsets).sizes[0]]] +
                       [[math.prod(self.sizes[d + 1:]), self.sizes[d]] for d in range(1, len(self.sizes))],
                       offset=0, vector_offset=offsets)


def _scalar_index(x):
    """A run-time index: one value in an SBUF tile."""
    sv = as_view(x)
    if math.prod(sv.sizes) != 1 or sv.space != SBUF:
        raise IndexError(f"a run-time index is one value in an SBUF tile (shape (1, 1)), got a "
                         f"{sv.buffer_space} tile of shape {list(sv.sizes)}")
    return sv
