#include "distributed/peer_algorithms.h"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <atomic>
#include <mutex>

#include "distributed/peer_access.h"
#include "distributed/reduce_ops.h"

namespace neuronx::distributed {

namespace {

constexpr int64_t kPeerPieceBytes = 512 << 10;

// Buffers that peers may still write into after a failure on this side (a
// timeout, a peer that died between its writes): never freed, so a late
// write cannot land in memory the allocator has handed to someone else.
void quarantine(at::Tensor t) {
  static std::mutex mu;
  static auto* kept = new std::vector<at::Tensor>();  // leaked on purpose
  std::lock_guard<std::mutex> g(mu);
  kept->push_back(std::move(t));
}

// Whether peers can reach `t`'s bytes as they are: contiguous, without a
// conj/neg bit (peers see raw bytes).
bool peer_reachable(const at::Tensor& t) { return t.is_contiguous() && !t.is_conj() && !t.is_neg(); }

// The contiguous tensor peers reach: `t` itself, or a resolved copy.
at::Tensor peer_buffer(const at::Tensor& t) {
  if (peer_reachable(t)) return t.view(-1);
  return t.resolve_conj().resolve_neg().contiguous().view(-1);
}

std::string error_text(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

class PeerWork : public DirectWork {
 public:
  // `exposed`: the contiguous buffer of ours that peers read or write.
  PeerWork(const DirectContext& ctx, at::Tensor exposed)
      : ctx_(ctx), exposed_(std::move(exposed)), number_(ctx.peers->take_number()) {}
  ~PeerWork() override {
    if (scratch_.defined()) ctx_.buffers->give(std::move(scratch_));
    // A numbered collective that never ran (its issue failed after this was
    // made): the peers wait for it, so they must learn that it will not come.
    if (!waited_) ctx_.peers->mark_broken("a collective was dropped on this rank before it ran");
  }

  bool isCompleted() override { return done_; }
  bool wait(std::chrono::milliseconds) override {
    if (done_) return true;
    waited_ = true;
    PeerLink& link = *ctx_.peers;
    TORCH_CHECK(!link.broken(), "peer access: an earlier collective of this group failed (", link.broken_reason(),
                "); the group cannot be used any more: create a new one");
    const auto now = std::chrono::steady_clock::now();
    const auto deadline = ctx_.timeout >= std::chrono::hours(24 * 365)
                              ? std::chrono::steady_clock::time_point::max()  // no overflow
                              : now + ctx_.timeout;
    const int64_t bytes = exposed_.numel() * exposed_.element_size();
    bool announced = false;
    try {
      link.announce(number_, {reinterpret_cast<uintptr_t>(exposed_.data_ptr()), bytes, ctx_.seq});
      announced = true;
      std::vector<uintptr_t> bases(ctx_.size);
      for (int peer = 0; peer < ctx_.size; ++peer) {
        if (peer == ctx_.rank) continue;
        const auto b = link.announced(peer, number_, deadline);
        TORCH_CHECK(b.check == ctx_.seq && b.bytes == bytes, "peer access: rank ", peer, " announced ", b.bytes,
                    " bytes for its collective ", b.check, "; this rank has ", bytes, " bytes for its collective ",
                    ctx_.seq);
        bases[peer] = b.address;
      }
      move(bases);
      link.finish(number_);
      for (int peer = 0; peer < ctx_.size; ++peer)
        if (peer != ctx_.rank) link.await_finished(peer, number_, deadline);
    } catch (const std::exception& e) {
      link.mark_broken(error_text(e));
      if (announced) quarantine(exposed_);
      throw;
    }
    // The result into the caller's tensor, where it was computed in a copy.
    if (target_.defined() && target_.data_ptr() != result_.data_ptr()) target_.copy_(result_.view(target_.sizes()));
    return done_ = true;
  }

 protected:
  // Moves the data, given each peer's buffer address.
  virtual void move(const std::vector<uintptr_t>& bases) = 0;
  // Where the result lands (`result`, contiguous) and the caller's tensor it belongs in.
  void set_result(at::Tensor target, at::Tensor result) {
    target_ = std::move(target);
    result_ = std::move(result);
  }

  // Reduces into `acc` (contiguous) the bytes at `offset` in every peer's
  // buffer, piece by piece; with `write_back`, writes each reduced piece
  // back there.
  void reduce_from_peers(const at::Tensor& acc, const std::vector<uintptr_t>& bases, uintptr_t offset,
                         const c10d::ReduceOp& op, bool write_back) {
    const PeerLink& link = *ctx_.peers;
    const int64_t es = acc.element_size(), n = acc.numel(), piece = kPeerPieceBytes / es;
    if (n == 0) return;
    if (!scratch_.defined()) scratch_ = ctx_.buffers->take(std::min(n, piece) * es);
    for (int64_t at = 0; at < n; at += piece) {
      const int64_t k = std::min(piece, n - at);
      at::Tensor part = acc.narrow(0, at, k);
      at::Tensor theirs = scratch_.narrow(0, 0, k * es).view(acc.scalar_type());
      const uintptr_t where = offset + static_cast<uintptr_t>(at * es);
      for (int peer = 0; peer < ctx_.size; ++peer) {
        if (peer == ctx_.rank) continue;
        link.read(peer, theirs.data_ptr(), bases[peer] + where, k * es);
        reduce_into(part, theirs, op);
      }
      if (write_back)
        for (int peer = 0; peer < ctx_.size; ++peer)
          if (peer != ctx_.rank) link.write(peer, part.data_ptr(), bases[peer] + where, k * es);
    }
  }

  DirectContext ctx_;
  at::Tensor exposed_;

 private:
  at::Tensor scratch_, target_, result_;
  const uint64_t number_;
  std::atomic<bool> done_{false};
  bool waited_ = false;
};

// Allreduce: each rank owns 1/size of the tensor (as in direct_allreduce).
// It reads its part of every peer's tensor, reduces it into its own, and
// writes the result into every peer's tensor: the bytes of a ring, each
// moved once. Only the owner reduces a part, so every rank ends with the
// same bits. No rank touches another's part of a peer's tensor, so the
// reads and writes of different owners never meet.
class PeerAllreduce final : public PeerWork {
 public:
  PeerAllreduce(const DirectContext& ctx, const at::Tensor& t, c10d::ReduceOp op) : PeerWork(ctx, peer_buffer(t)), op_(std::move(op)) {
    set_result(t, exposed_);
  }

 private:
  void move(const std::vector<uintptr_t>& bases) override {
    const at::Tensor mine = exposed_.tensor_split(ctx_.size)[ctx_.rank];
    const auto offset = static_cast<uintptr_t>((mine.storage_offset() - exposed_.storage_offset()) * mine.element_size());
    reduce_from_peers(mine, bases, offset, op_, /*write_back=*/true);
  }

  c10d::ReduceOp op_;
};

// reduce_scatter_tensor: each rank reads its part of every peer's input and
// reduces it into its output; nobody writes into a peer.
class PeerReduceScatter final : public PeerWork {
 public:
  PeerReduceScatter(const DirectContext& ctx, const at::Tensor& out, const at::Tensor& in, c10d::ReduceOp op)
      : PeerWork(ctx, peer_buffer(in)),
        acc_(peer_reachable(out) ? out.view(-1)
                                 : at::empty({out.numel()}, out.options().memory_format(c10::MemoryFormat::Contiguous))),
        op_(std::move(op)) {
    set_result(out, acc_);
  }

 private:
  void move(const std::vector<uintptr_t>& bases) override {
    const int64_t n = acc_.numel();
    acc_.copy_(exposed_.narrow(0, ctx_.rank * n, n));
    reduce_from_peers(acc_, bases, static_cast<uintptr_t>(ctx_.rank * n * acc_.element_size()), op_, false);
  }

  at::Tensor acc_;
  c10d::ReduceOp op_;
};

// broadcast: every other rank reads the root's tensor.
class PeerBroadcast final : public PeerWork {
 public:
  PeerBroadcast(const DirectContext& ctx, const at::Tensor& t, int root) : PeerWork(ctx, peer_buffer(t)), root_(root) {
    if (ctx.rank != root) set_result(t, exposed_);
  }

 private:
  void move(const std::vector<uintptr_t>& bases) override {
    if (ctx_.rank == root_) return;
    ctx_.peers->read(root_, exposed_.data_ptr(), bases[root_], exposed_.numel() * exposed_.element_size());
  }

  int root_;
};

// all_gather_into_tensor: each rank writes its input into its slot of every
// peer's output.
class PeerAllgather final : public PeerWork {
 public:
  PeerAllgather(const DirectContext& ctx, const at::Tensor& out, const at::Tensor& in)
      : PeerWork(ctx, peer_buffer(out)), in_(peer_buffer(in)) {
    set_result(out, exposed_);
    at::Tensor own = exposed_.narrow(0, ctx.rank * in_.numel(), in_.numel());
    if (own.data_ptr() != in_.data_ptr()) own.copy_(in_);
  }

 private:
  void move(const std::vector<uintptr_t>& bases) override {
    const int64_t bytes = in_.numel() * in_.element_size();
    for (int peer = 0; peer < ctx_.size; ++peer)
      if (peer != ctx_.rank)
        ctx_.peers->write(peer, in_.data_ptr(), bases[peer] + static_cast<uintptr_t>(ctx_.rank * bytes), bytes);
  }

  at::Tensor in_;
};

}  // namespace

bool peer_access_applies(const DirectContext& ctx, const at::Tensor& t) { return ctx.peers && t.numel() > 0; }

c10::intrusive_ptr<c10d::Work> peer_allreduce(const DirectContext& ctx, const at::Tensor& t, const c10d::ReduceOp& op) {
  return c10::make_intrusive<PeerAllreduce>(ctx, t, op);
}

c10::intrusive_ptr<c10d::Work> peer_reduce_scatter(const DirectContext& ctx, const at::Tensor& out, const at::Tensor& in,
                                                   const c10d::ReduceOp& op) {
  return c10::make_intrusive<PeerReduceScatter>(ctx, out, in, op);
}

c10::intrusive_ptr<c10d::Work> peer_broadcast(const DirectContext& ctx, const at::Tensor& t, int root) {
  return c10::make_intrusive<PeerBroadcast>(ctx, t, root);
}

c10::intrusive_ptr<c10d::Work> peer_allgather(const DirectContext& ctx, const at::Tensor& out, const at::Tensor& in) {
  return c10::make_intrusive<PeerAllgather>(ctx, out, in);
}

}  // namespace neuronx::distributed
