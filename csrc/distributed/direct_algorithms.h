#pragma once
// The backend's own collective algorithms over the transport's point-to-point
// transfers (the direct algorithms), and what they share with the peer-access
// ones (peer_algorithms.h).
//
// Direct algorithms (any world size): every rank sends its data straight to
// every other rank with point-to-point transfers, which the transport runs
// on the connection's I/O thread from and into the tensors themselves. The
// transport's own allgather copies through a fresh flat buffer and its
// allreduce hands each operation to a worker thread; here both were
// slower than these (see bench/collectives.py and docs/distributed.md).
#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace neuronx::distributed {

class PeerLink;

// Receive buffers of the backend's own algorithms, reused: a fresh buffer
// would be paged in by every receive.
class BufferPool {
 public:
  at::Tensor take(int64_t bytes);
  void give(at::Tensor t);

 private:
  std::mutex mu_;
  std::vector<at::Tensor> pool_;
};

// Algorithms of our own move data with point-to-point transfers on the
// control transport: its tag space is not the user's send/recv one, and
// every rank derives the same tags from the collective's sequence number.
struct DirectContext {
  c10d::Backend* control;
  std::shared_ptr<BufferPool> buffers;  // shared: a work may outlive its group
  uint64_t seq;
  int rank, size;
  std::chrono::milliseconds timeout;
  std::shared_ptr<PeerLink> peers;  // null: no peer access
  int tag(int64_t step) const { return static_cast<int>((seq % (1u << 21)) * 512 + step % 512); }
};

// A collective of the backend's own algorithms (no future of its own: the
// completer thread waits for it).
class DirectWork : public c10d::Work {};

bool direct_allgather_applies(const at::Tensor& out, const at::Tensor& in);
c10::intrusive_ptr<c10d::Work> direct_allgather(const DirectContext& ctx, const at::Tensor& out, const at::Tensor& in);

bool direct_alltoall_applies(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs);
c10::intrusive_ptr<c10d::Work> direct_alltoall(const DirectContext& ctx, const std::vector<at::Tensor>& outputs,
                                               const std::vector<at::Tensor>& inputs);

// Allreduce of small contiguous tensors: an exchange between two ranks, a
// reduce-scatter and an allgather between more.
bool direct_allreduce_applies(const at::Tensor& t, const c10d::ReduceOp& op);
c10::intrusive_ptr<c10d::Work> direct_allreduce(const DirectContext& ctx, const at::Tensor& t, const c10d::ReduceOp& op);

}  // namespace neuronx::distributed
