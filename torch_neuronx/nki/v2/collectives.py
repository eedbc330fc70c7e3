"""``nki.collectives``: collective communication between ranks (NeuronCores of several devices).

A kernel launched here runs as one rank, rank 0 of its own world: a collective over a replica
group whose sub-group holding rank 0 is that rank alone has its single-rank meaning (a gather or
reduction of one contribution is a copy; a ring of one sends to itself). A group of several ranks
raises ``NotImplementedError``: running the other ranks' kernels is not modelled (AWS's simulator
implements none of this module)."""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import isa as _g1
from .._registers import register_alloc
from .._tensor import SBUF, as_view
from . import language as _nl
from .isa import dma_copy, tensor_tensor

_RANK = 0


@dataclass
class ReplicaGroup(_nl.NKIObject):
    """Groups of ranks that take part in a collective (sub-groups do not overlap)."""

    replica_groups: list = field(default_factory=list)


def _group_of_this_rank(replica_group, what):
    groups = getattr(replica_group, "replica_groups", replica_group) or [[_RANK]]
    if groups and not isinstance(groups[0], (list, tuple)):
        groups = [groups]
    mine = next((list(g) for g in groups if _RANK in list(g)), None)
    if mine is None:
        raise ValueError(f"nki.collectives.{what}: rank {_RANK} is in none of the replica groups {groups}")
    if len(mine) > 1:
        raise NotImplementedError(
            f"nki.collectives.{what}: the replica group {mine} spans {len(mine)} ranks; this simulator runs one "
            "rank per kernel launch, so collectives across ranks are not modelled (AWS's simulator implements "
            "no nki.collectives either)")
    return mine


def _pairs(srcs, dsts, what):
    srcs, dsts = list(srcs), list(dsts)
    if len(srcs) != len(dsts) or not srcs:
        raise ValueError(f"nki.collectives.{what}: srcs and dsts must be lists of the same non-zero length, "
                         f"got {len(srcs)} and {len(dsts)}")
    return zip(srcs, dsts)


def _copy(srcs, dsts, what):
    for s, d in _pairs(srcs, dsts, what):
        dma_copy(dst=d, src=s)


def _reduce(dst, a, b, op):
    if as_view(dst).space == SBUF:
        tensor_tensor(dst=dst, data1=a, data2=b, op=op)
    else:
        _g1.dma_copy(dst=dst, src=a)
        _g1.dma_copy(dst=dst, src=b, dst_rmw_op=op)


def all_reduce(srcs, dsts, replica_group, op, priority=None, name=None):
    """Each dst = the reduction (``op``) of its src over the group's ranks."""
    _group_of_this_rank(replica_group, "all_reduce")
    _copy(srcs, dsts, "all_reduce")


def all_gather(srcs, dsts, replica_group, collective_dim, priority=None, name=None):
    """Each dst = the group's srcs concatenated along ``collective_dim``."""
    _group_of_this_rank(replica_group, "all_gather")
    _copy(srcs, dsts, "all_gather")


def reduce_scatter(srcs, dsts, replica_group, collective_dim, op, priority=None, name=None):
    """Each dst = this rank's slice (along ``collective_dim``) of the reduction of the group's srcs."""
    _group_of_this_rank(replica_group, "reduce_scatter")
    _copy(srcs, dsts, "reduce_scatter")


def all_to_all(srcs, dsts, replica_group, collective_dim, priority=None, name=None):
    """Each rank sends slice r (along ``collective_dim``) of its src to rank r."""
    _group_of_this_rank(replica_group, "all_to_all")
    _copy(srcs, dsts, "all_to_all")


def collective_permute(srcs, dsts, source_target_pairs, priority=None, name=None):
    """dst of each target = src of its source."""
    for s, t in source_target_pairs:
        if (int(s), int(t)) != (_RANK, _RANK):
            _group_of_this_rank([[int(s), int(t)]], "collective_permute")
    _copy(srcs, dsts, "collective_permute")


def collective_permute_implicit(srcs_by_channel, dsts_by_channel, replica_group, channel_ids=(0,), priority=None,
                                name=None):
    """Each rank sends to its successor in the ring and receives from its predecessor."""
    _group_of_this_rank(replica_group, "collective_permute_implicit")
    for s, d in _pairs(srcs_by_channel, dsts_by_channel, "collective_permute_implicit"):
        _copy(s, d, "collective_permute_implicit")


def collective_permute_implicit_reduce(srcs0_by_channel, srcs1_by_channel, dsts_by_channel, replica_group, op,
                                       channel_ids=(0,), priority=None, name=None):
    """Each rank sends ``op(src0, src1)`` to its successor; dst receives its predecessor's."""
    _group_of_this_rank(replica_group, "collective_permute_implicit_reduce")
    for (a, d), b in zip(_pairs(srcs0_by_channel, dsts_by_channel, "collective_permute_implicit_reduce"),
                         srcs1_by_channel):
        for x, y, z in zip(a, b, d):
            _reduce(z, x, y, op)


def collective_permute_implicit_current_processing_rank_id(iteration_id, replica_group, channel_id=0, name=None):
    """A register holding the rank whose data a ring step processes (this rank's, in a ring of one)."""
    _group_of_this_rank(replica_group, "collective_permute_implicit_current_processing_rank_id")
    return register_alloc(_RANK)


def rank_id(name=None):
    """A register holding this rank's id."""
    return register_alloc(_RANK)
