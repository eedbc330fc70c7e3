#pragma once
// The check before each collective: every rank's fingerprint of the call
// (op, dtype, sizes, root, reduce op), exchanged in batches over the group's
// control transport, so that ranks that call different collectives (or the
// same with different sizes) get an error on every rank instead of a
// transport that aborts the process.
#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace neuronx::distributed {

struct Fingerprint {
  int64_t op = 0, dtype = -1, numel = 0, root = -1, reduce = -1;
  static constexpr int64_t kFields = 5, kMagic = 0x4e4e5843;  // "NNXC"
  // All-to-all sizes may differ by rank (uneven splits): their numel is 0, and
  // root and reduce carry the split signature (see split_signature()).
  bool all_to_all() const;
  std::string describe(const char* name) const;
};

// The fingerprint of a call whose sizes every rank shares (`key`: the tensors
// that must agree; root and reduce: -1 where the op has none).
Fingerprint fingerprint(c10d::OpType type, const std::vector<at::Tensor>& key, int64_t root = -1, int reduce = -1);

// An all-to-all's fingerprint: `f` with the signature of this rank's element
// counts sent to and received from each peer in place of its sizes.
Fingerprint split_signature(Fingerprint f, int rank, const std::vector<int64_t>& sends,
                            const std::vector<int64_t>& receives);

// The fingerprints of a group's collectives, in the order they reach the
// collective queue, checked in batches (see check()).
class Sequencer {
 public:
  std::mutex order_mu;  // held from add() until the collective is on the queue
  // The collective's sequence number.
  uint64_t add(const Fingerprint& f);
  // Raises (on every rank) when the ranks' fingerprints of collective `seq`
  // differ; called by the collective queue in sequence order.
  void check(uint64_t seq, c10d::Backend& control);

 private:
  static constexpr int64_t kBatch = 64, kWords = 2 + kBatch * Fingerprint::kFields;
  struct Entry {
    Fingerprint fp;
    bool checked;
    std::string error;
  };
  std::mutex mu_;
  std::deque<Entry> pending_;  // from sequence number base_ on
  uint64_t base_ = 0, next_ = 0;
};

}  // namespace neuronx::distributed
