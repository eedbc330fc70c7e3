#pragma once
// Collectives over peer access (ranks on one host, peer_access.h): each rank moves data
// straight between its memory and its peers' with one kernel copy, instead
// of a TCP send and receive (two copies and the protocol's work per byte,
// and a message's wake-ups). Every rank decides the same way: the choice
// depends only on what the fingerprint check compared (op, dtype, sizes).
// The work runs on the completer's thread, one collective at a time, in
// order; pieces of kPeerPieceBytes stay in cache between a read, its
// reduction and the writes.
#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "distributed/direct_algorithms.h"

namespace neuronx::distributed {

// Whether the group has peer access and `t` has bytes to move.
bool peer_access_applies(const DirectContext& ctx, const at::Tensor& t);

// Each returns a work the completer's thread runs (wait() moves the data).
c10::intrusive_ptr<c10d::Work> peer_allreduce(const DirectContext& ctx, const at::Tensor& t, const c10d::ReduceOp& op);
c10::intrusive_ptr<c10d::Work> peer_reduce_scatter(const DirectContext& ctx, const at::Tensor& out, const at::Tensor& in,
                                                   const c10d::ReduceOp& op);
c10::intrusive_ptr<c10d::Work> peer_broadcast(const DirectContext& ctx, const at::Tensor& t, int root);
c10::intrusive_ptr<c10d::Work> peer_allgather(const DirectContext& ctx, const at::Tensor& out, const at::Tensor& in);

}  // namespace neuronx::distributed
