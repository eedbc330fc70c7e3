#include "distributed/fingerprint.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <stdexcept>

namespace neuronx::distributed {

bool Fingerprint::all_to_all() const {
  return op == static_cast<int64_t>(c10d::OpType::ALLTOALL) || op == static_cast<int64_t>(c10d::OpType::ALLTOALL_BASE);
}

std::string Fingerprint::describe(const char* name) const {
  std::string s = name;
  if (all_to_all()) return dtype >= 0 ? s + " of " + c10::toString(static_cast<c10::ScalarType>(dtype)) : s;
  if (dtype >= 0) s += " of " + std::to_string(numel) + " " + c10::toString(static_cast<c10::ScalarType>(dtype)) +
                       " elements";
  if (root >= 0) s += " (root " + std::to_string(root) + ")";
  if (reduce >= 0) s += " (reduce op " + std::to_string(reduce) + ")";
  return s;
}

namespace {
uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
uint64_t transfer_hash(int64_t from, int64_t to, int64_t count) {
  return mix(mix(mix(static_cast<uint64_t>(from)) ^ static_cast<uint64_t>(to)) ^ static_cast<uint64_t>(count));
}
}  // namespace

// An all-to-all's splits agree when every count a rank sends is the count its
// peer expects. Each rank knows only its own sends and receives, so it
// contributes a hash sum of each: the sums over all ranks are equal when the
// splits agree (and differ, but for a 2^-64 chance, when they do not).
Fingerprint split_signature(Fingerprint f, int rank, const std::vector<int64_t>& sends,
                            const std::vector<int64_t>& receives) {
  uint64_t sent = 0, expected = 0;
  for (size_t peer = 0; peer < sends.size(); ++peer) sent += transfer_hash(rank, peer, sends[peer]);
  for (size_t peer = 0; peer < receives.size(); ++peer) expected += transfer_hash(peer, rank, receives[peer]);
  f.numel = 0;
  f.root = static_cast<int64_t>(sent);
  f.reduce = static_cast<int64_t>(expected);
  return f;
}

Fingerprint fingerprint(c10d::OpType type, const std::vector<at::Tensor>& key, int64_t root, int reduce) {
  Fingerprint f;
  f.op = static_cast<int64_t>(type);
  f.root = root;
  f.reduce = reduce;
  if (!key.empty()) f.dtype = static_cast<int64_t>(key[0].scalar_type());
  for (const auto& t : key) f.numel += t.numel();
  return f;
}

namespace {
std::string mismatch_message(const std::vector<Fingerprint>& per_rank) {
  std::string msg = "collective mismatch: the ranks called different collectives or sizes:";
  for (size_t r = 0; r < per_rank.size(); ++r) {
    const auto op = static_cast<c10d::OpType>(per_rank[r].op);
    msg += "\n  rank " + std::to_string(r) + ": " + per_rank[r].describe(c10d::opTypeToString(op).c_str());
  }
  return msg + "\nEvery rank must make the same collective calls in the same order.";
}

}  // namespace

uint64_t Sequencer::add(const Fingerprint& f) {
  std::lock_guard<std::mutex> g(mu_);
  pending_.push_back({f, false, {}});
  return next_++;
}

// Called by the collective queue, in sequence order. When `seq` is not yet
// checked, the fingerprints of every collective this rank has enqueued so far
// (up to kBatch) are exchanged in one fixed-size allgather; the first m of
// them, m the smallest count any rank sent, are checked at once. Every rank
// computes the same m, so the exchanges happen at the same collectives on
// every rank.
void Sequencer::check(uint64_t seq, c10d::Backend& control) {
  std::unique_lock<std::mutex> lk(mu_);
  TORCH_INTERNAL_ASSERT(seq == base_ && !pending_.empty(), "collective fingerprints checked out of order");
  if (!pending_.front().checked) {
    const int n = control.getSize();
    const int64_t count = std::min<int64_t>(kBatch, static_cast<int64_t>(pending_.size()));
    at::Tensor mine = at::zeros({kWords}, at::kLong);
    int64_t* m = mine.data_ptr<int64_t>();
    m[0] = Fingerprint::kMagic;
    m[1] = count;
    for (int64_t i = 0; i < count; ++i) {
      const Fingerprint& f = pending_[i].fp;
      int64_t* x = m + 2 + i * Fingerprint::kFields;
      x[0] = f.op, x[1] = f.dtype, x[2] = f.numel, x[3] = f.root, x[4] = f.reduce;
    }
    lk.unlock();
    at::Tensor all = at::empty({n * kWords}, at::kLong);
    std::string failure;
    try {
      control._allgather_base(all, mine)->wait();
    } catch (const std::exception& e) {
      failure = e.what();
    }
    lk.lock();
    if (!failure.empty()) {
      pending_.pop_front();
      ++base_;
      throw std::runtime_error(failure);
    }
    const int64_t* a = all.data_ptr<int64_t>();
    int64_t checked = count;
    for (int r = 0; r < n; ++r) {
      if (a[r * kWords] != Fingerprint::kMagic) {
        pending_.pop_front();  // this collective fails; the ones after it are checked in turn
        ++base_;
        TORCH_CHECK(false, "collective check: rank ", r,
                    " sent an unexpected message (is it running the same torch_neuronx version?)");
      }
      checked = std::min(checked, a[r * kWords + 1]);
    }
    for (int64_t i = 0; i < checked; ++i) {
      std::vector<Fingerprint> per_rank;
      bool same = true;
      uint64_t sent = 0, expected = 0;  // all-to-all: the split signature's sums
      for (int r = 0; r < n; ++r) {
        const int64_t* x = a + r * kWords + 2 + i * Fingerprint::kFields;
        per_rank.push_back(Fingerprint{x[0], x[1], x[2], x[3], x[4]});
        const int64_t* first = a + 2 + i * Fingerprint::kFields;
        same = same && (per_rank[0].all_to_all() ? x[0] == first[0] && x[1] == first[1]
                                                 : std::equal(x, x + Fingerprint::kFields, first));
        sent += static_cast<uint64_t>(x[3]);
        expected += static_cast<uint64_t>(x[4]);
      }
      pending_[i].checked = true;
      if (!same) {
        pending_[i].error = mismatch_message(per_rank);
      } else if (per_rank[0].all_to_all() && sent != expected) {
        pending_[i].error =
            "all_to_all split mismatch: the element counts some rank sends differ from what its peers expect to "
            "receive (rank r's input split for rank j must equal rank j's output split for rank r).";
      }
    }
  }
  std::string error = std::move(pending_.front().error);
  pending_.pop_front();
  ++base_;
  if (!error.empty()) throw std::runtime_error(error);
}

}  // namespace neuronx::distributed
