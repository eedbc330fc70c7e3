#include "distributed/direct_algorithms.h"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <atomic>

#include "distributed/reduce_ops.h"

namespace neuronx::distributed {

at::Tensor BufferPool::take(int64_t bytes) {
  std::lock_guard<std::mutex> g(mu_);
  for (size_t i = 0; i < pool_.size(); ++i) {
    if (pool_[i].numel() >= bytes) {
      at::Tensor t = std::move(pool_[i]);
      pool_.erase(pool_.begin() + static_cast<std::ptrdiff_t>(i));
      return t;
    }
  }
  return at::empty({bytes}, at::kByte);
}

void BufferPool::give(at::Tensor t) {
  std::lock_guard<std::mutex> g(mu_);
  if (pool_.size() < 4) pool_.push_back(std::move(t));
}

namespace {

// Several transport operations that make up one collective.
class JoinedWork final : public DirectWork {
 public:
  explicit JoinedWork(std::vector<c10::intrusive_ptr<c10d::Work>> parts) : parts_(std::move(parts)) {}
  bool isCompleted() override {
    return std::all_of(parts_.begin(), parts_.end(), [](auto& w) { return w->isCompleted(); });
  }
  bool wait(std::chrono::milliseconds timeout) override {
    for (auto& w : parts_) w->wait(timeout);
    return true;
  }

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> parts_;
};

c10::intrusive_ptr<c10d::Work> send(const DirectContext& ctx, const at::Tensor& t, int peer, int tag) {
  std::vector<at::Tensor> v{t};
  return ctx.control->send(v, peer, tag);
}
c10::intrusive_ptr<c10d::Work> recv(const DirectContext& ctx, const at::Tensor& t, int peer, int tag) {
  std::vector<at::Tensor> v{t};
  return ctx.control->recv(v, peer, tag);
}

// Between two ranks, up to kDirectAllreduceBytes: one step instead of a
// ring's two. Each rank sends its tensor to the other (the same bytes as the
// two halves of a ring) and both reduce the two copies, so both end with the
// same bits: ops that are exactly commutative (IEEE sum and product, bitwise)
// reduce the peer's copy into their own; min and max compute f(x0, x1) on
// both ranks. The transfers are posted at once; wait() (on the completer's
// thread) reduces, so the collective queue goes on issuing meanwhile.
class ExchangeAllreduce final : public DirectWork {
 public:
  ExchangeAllreduce(const DirectContext& ctx, at::Tensor flat, c10d::ReduceOp op)
      : buffers_(ctx.buffers), flat_(std::move(flat)), op_(std::move(op)), rank_(ctx.rank), timeout_(ctx.timeout) {
    if (flat_.numel() == 0) return;
    buffer_ = buffers_->take(flat_.numel() * flat_.element_size());
    theirs_ = buffer_.narrow(0, 0, flat_.numel() * flat_.element_size()).view(flat_.scalar_type());
    recv_ = recv(ctx, theirs_, 1 - rank_, ctx.tag(0));
    send_ = send(ctx, flat_, 1 - rank_, ctx.tag(0));
  }
  ~ExchangeAllreduce() override {
    recv_.reset();  // the transfers hold views of the buffer
    send_.reset();
    theirs_ = at::Tensor();
    if (buffer_.defined()) buffers_->give(std::move(buffer_));
  }

  bool isCompleted() override { return done_; }
  bool wait(std::chrono::milliseconds timeout) override {
    if (done_ || flat_.numel() == 0) return done_ = true;
    recv_->wait(timeout_);
    send_->wait(timeout_);  // our copy was sent: it may now be overwritten
    const bool commutative = op_ == c10d::ReduceOp::SUM || op_ == c10d::ReduceOp::BAND ||
                             op_ == c10d::ReduceOp::BOR || op_ == c10d::ReduceOp::BXOR ||
                             (op_ == c10d::ReduceOp::PRODUCT && !flat_.is_complex());
    if (commutative || rank_ == 0) {
      reduce_into(flat_, theirs_, op_);  // rank 0: f(x0, x1)
    } else {
      reduce_into(theirs_, flat_, op_);  // f(x0, x1), then ours
      flat_.copy_(theirs_);
    }
    done_ = true;
    return true;
  }

 private:
  std::shared_ptr<BufferPool> buffers_;  // gets the buffer back in the destructor, maybe after the group died
  at::Tensor flat_, buffer_, theirs_;
  c10d::ReduceOp op_;
  int rank_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Work> recv_, send_;
  std::atomic<bool> done_{false};
};

// Any world size: runs the reduce-scatter on the calling thread (it waits for the receives
// it reduces) and returns the allgather, still moving.
c10::intrusive_ptr<c10d::Work> ring_allreduce(const DirectContext& ctx, const at::Tensor& t, const c10d::ReduceOp& op) {
  const auto parts = t.view(-1).tensor_split(ctx.size);
  const at::Tensor& mine = parts[ctx.rank];
  const int64_t bytes = mine.numel() * mine.element_size();
  at::Tensor buffer = ctx.buffers->take((ctx.size - 1) * bytes);
  std::vector<at::Tensor> theirs(ctx.size);
  std::vector<c10::intrusive_ptr<c10d::Work>> recvs(ctx.size), sends;
  for (int peer = 0, slot = 0; peer < ctx.size; ++peer) {
    if (peer == ctx.rank) continue;
    if (bytes > 0) {
      theirs[peer] = buffer.narrow(0, bytes * slot++, bytes).view(mine.scalar_type());
      recvs[peer] = recv(ctx, theirs[peer], peer, ctx.tag(0));
    }
    if (parts[peer].numel() > 0) sends.push_back(send(ctx, parts[peer], peer, ctx.tag(0)));
  }
  at::Tensor acc = mine;
  for (int peer = 0; peer < ctx.size; ++peer) {
    if (!recvs[peer]) continue;
    recvs[peer]->wait(ctx.timeout);
    reduce_into(acc, theirs[peer], op);
  }
  // The parts sent above are overwritten by the allgather's receives.
  for (auto& w : sends) w->wait(ctx.timeout);
  recvs.clear();  // they hold views of the buffer
  theirs.clear();
  ctx.buffers->give(std::move(buffer));
  std::vector<c10::intrusive_ptr<c10d::Work>> gathers;
  for (int peer = 0; peer < ctx.size; ++peer) {
    if (peer == ctx.rank) continue;
    if (parts[peer].numel() > 0) gathers.push_back(recv(ctx, parts[peer], peer, ctx.tag(1)));
    if (bytes > 0) gathers.push_back(send(ctx, mine, peer, ctx.tag(1)));
  }
  return c10::make_intrusive<JoinedWork>(std::move(gathers));
}

}  // namespace

// all_gather_into_tensor of contiguous tensors.
bool direct_allgather_applies(const at::Tensor& out, const at::Tensor& in) {
  return out.is_contiguous() && in.is_contiguous();
}

c10::intrusive_ptr<c10d::Work> direct_allgather(const DirectContext& ctx, const at::Tensor& out, const at::Tensor& in) {
  const int64_t n = in.numel();
  at::Tensor flat_in = in.view(-1), flat_out = out.view(-1);
  std::vector<c10::intrusive_ptr<c10d::Work>> parts;
  if (n > 0) {
    for (int peer = 0; peer < ctx.size; ++peer) {
      if (peer == ctx.rank) continue;
      parts.push_back(recv(ctx, flat_out.narrow(0, peer * n, n), peer, ctx.tag(0)));
      parts.push_back(send(ctx, flat_in, peer, ctx.tag(0)));
    }
    at::Tensor own = flat_out.narrow(0, ctx.rank * n, n);
    if (own.data_ptr() != flat_in.data_ptr()) own.copy_(flat_in);
  }
  return c10::make_intrusive<JoinedWork>(std::move(parts));
}

// all_to_all of contiguous tensors, as NCCL runs it: a send and a receive
// with every peer, so the tensors may differ in size (uneven splits), each
// moving straight from the input into the output.
bool direct_alltoall_applies(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs) {
  auto contiguous = [](const at::Tensor& t) { return t.is_contiguous(); };
  return std::all_of(outputs.begin(), outputs.end(), contiguous) && std::all_of(inputs.begin(), inputs.end(), contiguous);
}

c10::intrusive_ptr<c10d::Work> direct_alltoall(const DirectContext& ctx, const std::vector<at::Tensor>& outputs,
                                               const std::vector<at::Tensor>& inputs) {
  std::vector<c10::intrusive_ptr<c10d::Work>> parts;
  for (int peer = 0; peer < ctx.size; ++peer) {
    if (peer == ctx.rank) continue;
    if (outputs[peer].numel() > 0) parts.push_back(recv(ctx, outputs[peer].view(-1), peer, ctx.tag(0)));
    if (inputs[peer].numel() > 0) parts.push_back(send(ctx, inputs[peer].view(-1), peer, ctx.tag(0)));
  }
  at::Tensor own = outputs[ctx.rank];
  if (own.numel() > 0 && own.data_ptr() != inputs[ctx.rank].data_ptr()) own.copy_(inputs[ctx.rank]);
  return c10::make_intrusive<JoinedWork>(std::move(parts));
}

// Allreduce of up to kDirectAllreduceBytes: each rank owns 1/size of the
// tensor; it receives the other ranks' copies of its part, reduces them into
// its own in rank order, and sends the result to everyone (a reduce-scatter
// and an allgather: the bytes of a ring, in two steps). Only the owner
// reduces a part, so every rank ends with the same bits. Above that size
// the transport's pipelined ring allreduce is as fast (measured), and is used.
constexpr int64_t kDirectAllreduceBytes = 1 << 20;

bool direct_allreduce_applies(const at::Tensor& t, const c10d::ReduceOp& op) {
  return t.is_contiguous() && t.numel() * t.element_size() <= kDirectAllreduceBytes && reducible(t, op);
}

c10::intrusive_ptr<c10d::Work> direct_allreduce(const DirectContext& ctx, const at::Tensor& t, const c10d::ReduceOp& op) {
  if (ctx.size == 2) return c10::make_intrusive<ExchangeAllreduce>(ctx, t.view(-1), op);
  return ring_allreduce(ctx, t, op);
}

}  // namespace neuronx::distributed
