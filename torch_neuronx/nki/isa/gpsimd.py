"""GpSimd-engine selection and data-movement instructions of ``nki.isa`` (Gen-1 forms; Gen-2
wraps them with ``dst=``): replacement of the top-8 matches, the 32-partition stream shuffle,
segment bounds and the 16-partition local gather."""
from __future__ import annotations

import math

from .. import language as nl
from .._emit import issue, require_space
from .._tensor import PSUM, SBUF, NkiTensor, as_view


def _result(v, dtype, shape, dst):
    from . import _out  # noqa: PLC0415 - the package's result helper (defined before this module loads)
    return _out(v, dtype, dst=dst, shape=shape)


def nc_match_replace8(*, data, vals, imm, dst_idx=None, mask=None, dtype=None, _dst=None, **kwargs):
    """``data`` with the first occurrence of each of the 8 ``vals`` (per partition, in order; a value
    already replaced is not matched again) replaced by ``imm``; their indices into ``dst_idx``."""
    v = require_space(data, (SBUF, PSUM), "nc_match_replace8", "data")
    w = require_space(vals, (SBUF, PSUM), "nc_match_replace8", "vals")
    t, d = _result(v, dtype, v.sizes, _dst)
    srcs, roles = [v, w], ["dst", "data", "vals"]
    if dst_idx is not None:
        srcs.append(require_space(dst_idx, (SBUF,), "nc_match_replace8", "dst_idx"))
        roles.append("dst_idx")
    issue("match_replace8", "nc_match_replace8", d, srcs, scalars=[float(imm)], ints=[int(dst_idx is not None)],
          mask=mask, same_shape=False, roles=roles)
    return t


def nc_stream_shuffle(src, dst, shuffle_mask, *, dtype=None, mask=None, **kwargs):
    """Within each 32-partition quadrant, dst partition ``i`` takes src partition ``shuffle_mask[i]``
    (255 leaves it as is); src may have fewer partitions than dst (a broadcast)."""
    s = require_space(src, (SBUF, PSUM), "nc_stream_shuffle", "src")
    d = require_space(dst, (SBUF, PSUM), "nc_stream_shuffle", "dst")
    m = [int(x) for x in shuffle_mask]
    issue("shuffle", "nc_stream_shuffle", d, [s], ints=m, mask=mask, same_shape=False, roles=["dst", "src"])
    return dst


def sequence_bounds(*, segment_ids, dtype=None, _dst=None, **kwargs):
    """(P, 2, n): per element of each row of segment ids, the start and (exclusive) end of its
    segment; padding (id 0) gets start n and end -1."""
    v = require_space(segment_ids, (SBUF,), "sequence_bounds", "segment_ids")
    P, n = v.sizes[0], math.prod(v.sizes[1:])
    t, d = _result(v, dtype, (P, 2, n), _dst)
    issue("sequence_bounds", "sequence_bounds", d, [v.reshape((P, n))], same_shape=False,
          roles=["dst", "segment_ids"])
    return t


def local_gather(src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, *, mask=None, _dst=None, **kwargs):
    """Each GpSimd core (16 partitions) gathers, at each of its indices (its 16 index partitions
    flattened partition-first; element offsets), ``num_elem_per_idx`` consecutive elements of every
    one of its partitions of ``src_buffer``."""
    s = require_space(src_buffer, (SBUF,), "local_gather", "src_buffer")
    i = require_space(index, (SBUF,), "local_gather", "index")
    per_core = 16 * math.prod(i.sizes[1:])
    nv = per_core if num_valid_indices is None else int(num_valid_indices)
    ne = int(num_elem_per_idx)
    # all of a core's indices: (P, index free dims..., 16, ne), the layout of the flattened indices
    shape = (s.sizes[0],) + tuple(i.sizes[1:]) + (16, ne) if nv == per_core else (s.sizes[0], nv, ne)
    t, d = _result(s, None, shape, _dst)
    issue("local_gather", "local_gather", _rows(t, s.sizes[0], nv * ne), [s, i], ints=[ne, nv], mask=mask,
          same_shape=False, roles=["dst", "src_buffer", "index"])
    return t


def _rows(x, P, F):
    """x as (P, F): a contiguous tile aliased in that shape (merging dims is not a per-dim view)."""
    if isinstance(x, NkiTensor):
        return x.reshape((P, F)).view_all()
    v = as_view(x)
    if tuple(v.sizes) == (P, F):
        return v
    t = v.tensor
    if (v.consts == [0] * len(t.shape) and tuple(v.sizes) == tuple(t.shape)
            and all(tuple(c) == tuple(int(d == k) for d in range(len(v.sizes))) for k, c in enumerate(v.coeffs))):
        return t.reshape((P, F)).view_all()  # the whole tensor, as it is laid out
    return v.reshape((P, F))


def tensor_copy_dynamic_src(src, *, mask=None, dtype=None, engine=None, _dst=None, **kwargs):
    """A copy whose source is indexed at run time (``src[i_p, offsets[0, j] + i_f]``)."""
    v = require_space(src, (SBUF, PSUM), "tensor_copy_dynamic_src", "src")
    t, d = _result(v, dtype, v.sizes, _dst)
    issue("copy", "tensor_copy_dynamic_src", d, [v], mask=mask, roles=["dst", "src"])
    return t


def tensor_copy_dynamic_dst(*, dst, src, mask=None, dtype=None, engine=None, **kwargs):
    """A copy into a destination indexed at run time."""
    d = require_space(dst, (SBUF, PSUM), "tensor_copy_dynamic_dst", "dst")
    v = require_space(src, (SBUF, PSUM), "tensor_copy_dynamic_dst", "src")
    issue("copy", "tensor_copy_dynamic_dst", d, [nl._broadcast(v, d.sizes)], mask=mask, roles=["dst", "src"])
    return dst
