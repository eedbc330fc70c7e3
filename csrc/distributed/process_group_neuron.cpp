#include "distributed/process_group_neuron.h"

#include <ATen/ops/empty.h>
#include <c10/core/InferenceMode.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/distributed/c10d/exception.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>

#include "backend/common.h"
#include "backend/tensor_views.h"
#include "distributed/peer_access.h"
#include "runtime/event.h"

namespace neuronx::distributed {

namespace {

bool on_neuron(const at::Tensor& t) { return t.defined() && t.device().type() == kNeuron; }

std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<at::Tensor> out;
  for (const auto& l : lists) out.insert(out.end(), l.begin(), l.end());
  return out;
}

std::vector<at::Tensor> host(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  // Fresh TensorImpls (no Python object): the transport may drop its last
  // reference on its own threads, even while the interpreter shuts down.
  // Normal tensors even when the caller is in inference mode: the transport
  // and the completer update them in place on threads that are not.
  c10::InferenceMode normal(false);
  for (const auto& t : ts) out.push_back(cpu_alias(t));
  return out;
}

std::vector<std::vector<at::Tensor>> host(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<std::vector<at::Tensor>> out;
  out.reserve(lists.size());
  for (const auto& l : lists) out.push_back(host(l));
  return out;
}

// What every tensor of one collective call must satisfy, checked on the
// calling thread so a bad call raises there, on the rank that made it.
enum class Placement { kNeuron, kCpu };
Placement check_tensors(const char* name, const std::vector<at::Tensor>& ts, c10::DeviceIndex* device) {
  bool any_neuron = false, any_cpu = false;
  for (const auto& t : ts) {
    TORCH_CHECK_VALUE(t.defined(), name, ": got an undefined tensor");
    if (on_neuron(t)) any_neuron = true;
    else if (t.is_cpu()) any_cpu = true;
    else TORCH_CHECK_VALUE(false, name, ": the neuron backend takes neuron (or CPU) tensors, got one on ", t.device());
  }
  TORCH_CHECK_VALUE(!(any_neuron && any_cpu), name,
                    ": got a mix of neuron and CPU tensors; move them to one device first");
  if (!any_neuron) {
    *device = current_device();
    return Placement::kCpu;
  }
  *device = -1;
  for (const auto& t : ts) {
    TORCH_CHECK_VALUE(t.layout() == c10::kStrided, name, ": sparse neuron tensors are not supported by collectives");
    TORCH_CHECK_VALUE(t.is_non_overlapping_and_dense(), name,
                      ": neuron collectives need dense tensors; call .contiguous() first");
    if (*device < 0) *device = t.device().index();
    TORCH_CHECK_VALUE(t.device().index() == *device, name, ": tensors are on neuron:", *device, " and ", t.device(),
                      "; one collective runs on one device");
  }
  return Placement::kNeuron;
}

// The transport has no AVG or PREMUL_SUM: they become SUM with a scaling
// step before (PREMUL_SUM) or after (AVG) the transfer.
c10d::ReduceOp transport_op(const c10d::ReduceOp& op) {
  if (op == c10d::ReduceOp::AVG || op == c10d::ReduceOp::PREMUL_SUM) return c10d::ReduceOp(c10d::ReduceOp::SUM);
  return op;
}

void premultiply(const c10d::ReduceOp& op, at::Tensor& t) {
  if (op != c10d::ReduceOp::PREMUL_SUM) return;
  auto* s = dynamic_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
  TORCH_CHECK(s, "PREMUL_SUM without a factor");
  if (s->tensor_factor.defined()) {
    const at::Tensor f = on_neuron(s->tensor_factor) ? cpu_alias(s->tensor_factor) : s->tensor_factor;  // read only
    t.mul_(f.to(t.scalar_type()));
  } else {
    t.mul_(s->double_factor);
  }
}

void average(const c10d::ReduceOp& op, at::Tensor& t, int size) {
  if (op != c10d::ReduceOp::AVG) return;
  if (c10::isIntegralType(t.scalar_type(), /*includeBool=*/true)) t.div_(size, "trunc");
  else t.div_(size);
}

}  // namespace

struct CollectiveState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  // Point-to-point: the transport operation once issued (it completes on its own).
  bool issued = false;
  c10::intrusive_ptr<c10d::Work> transport;
  std::exception_ptr error;
  std::string message;
  int source_rank = -1;

  void finish(std::exception_ptr e, std::string msg, int src) {
    {
      std::lock_guard<std::mutex> g(mu);
      done = true;
      error = std::move(e);
      message = std::move(msg);
      source_rank = src;
    }
    cv.notify_all();
  }
  bool finished() {
    std::lock_guard<std::mutex> g(mu);
    return done;
  }
  void wait_finished() {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return done; });
  }
};

// What a rank is about to run, exchanged before the data so that ranks that
// call different collectives (or the same with different sizes) get an error
// on every rank instead of a transport that aborts the process.
struct Fingerprint {
  int64_t op = 0, dtype = -1, numel = 0, root = -1, reduce = -1;
  static constexpr int64_t kFields = 5, kMagic = 0x4e4e5843;  // "NNXC"
  // All-to-all sizes may differ by rank (uneven splits): their numel is 0, and
  // root and reduce carry the split signature (see split_signature()).
  bool all_to_all() const {
    return op == static_cast<int64_t>(c10d::OpType::ALLTOALL) || op == static_cast<int64_t>(c10d::OpType::ALLTOALL_BASE);
  }
  std::string describe(const char* name) const {
    std::string s = name;
    if (all_to_all()) return dtype >= 0 ? s + " of " + c10::toString(static_cast<c10::ScalarType>(dtype)) : s;
    if (dtype >= 0) s += " of " + std::to_string(numel) + " " + c10::toString(static_cast<c10::ScalarType>(dtype)) +
                         " elements";
    if (root >= 0) s += " (root " + std::to_string(root) + ")";
    if (reduce >= 0) s += " (reduce op " + std::to_string(reduce) + ")";
    return s;
  }
};

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

Fingerprint fingerprint(c10d::OpType type, const std::vector<at::Tensor>& key, int64_t root = -1, int reduce = -1) {
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

// Receive buffers of the backend's own algorithms, reused: a fresh buffer
// would be paged in by every receive.
class BufferPool {
 public:
  at::Tensor take(int64_t bytes) {
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
  void give(at::Tensor t) {
    std::lock_guard<std::mutex> g(mu_);
    if (pool_.size() < 4) pool_.push_back(std::move(t));
  }

 private:
  std::mutex mu_;
  std::vector<at::Tensor> pool_;
};

// The fingerprints of a group's collectives, checked in batches (see check()).
class Sequencer {
 public:
  std::mutex order_mu;  // held from add() until the collective is on the queue
  uint64_t add(const Fingerprint& f);
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

// The memory of the group's collectives that have been issued and not finished.
class InFlight {
 public:
  using Ranges = std::vector<std::pair<uintptr_t, uintptr_t>>;
  // Waits for the collectives in flight on memory overlapping `ranges`, then
  // registers this one (`state`), which later ones on that memory wait for.
  void admit(const Ranges& ranges, std::shared_ptr<CollectiveState> state);
  // Waits without registering: for sends and receives, whose completion is
  // the caller's host wait (registering them would make collectives wait for it).
  void wait_overlapping(const Ranges& ranges);
  // Waits for every collective in flight (a barrier orders after all of them).
  void wait_all();

 private:
  std::vector<std::shared_ptr<CollectiveState>> overlapping(const Ranges& ranges);  // mu_ held
  std::mutex mu_;
  std::vector<std::pair<Ranges, std::shared_ptr<CollectiveState>>> entries_;
};

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

namespace {
InFlight::Ranges memory_ranges(const std::vector<at::Tensor>& ts) {
  InFlight::Ranges out;
  for (const auto& t : ts) {
    if (!t.defined() || t.numel() == 0) continue;
    const auto begin = reinterpret_cast<uintptr_t>(t.data_ptr());
    int64_t extent = 1;  // elements from the first to the last one addressed
    for (int64_t i = 0; i < t.dim(); ++i) extent += (t.size(i) - 1) * std::abs(t.stride(i));
    out.emplace_back(begin, begin + extent * t.element_size());
  }
  return out;
}
}  // namespace

// Waits until no collective still in flight uses memory that `ranges` overlap,
// then records the new one: the transport runs collectives concurrently, so
// two on the same buffer (allreduce(x) twice) would otherwise race.
std::vector<std::shared_ptr<CollectiveState>> InFlight::overlapping(const Ranges& ranges) {
  auto overlaps = [&](const Ranges& other) {
    for (const auto& a : ranges)
      for (const auto& b : other)
        if (a.first < b.second && b.first < a.second) return true;
    return false;
  };
  entries_.erase(std::remove_if(entries_.begin(), entries_.end(), [](const auto& e) { return e.second->finished(); }),
                 entries_.end());
  std::vector<std::shared_ptr<CollectiveState>> out;
  for (const auto& e : entries_)
    if (overlaps(e.first)) out.push_back(e.second);
  return out;
}

void InFlight::admit(const Ranges& ranges, std::shared_ptr<CollectiveState> state) {
  std::vector<std::shared_ptr<CollectiveState>> wait_for;
  {
    std::lock_guard<std::mutex> g(mu_);
    wait_for = overlapping(ranges);
    entries_.emplace_back(ranges, std::move(state));
  }
  for (const auto& w : wait_for) w->wait_finished();
}

void InFlight::wait_overlapping(const Ranges& ranges) {
  std::vector<std::shared_ptr<CollectiveState>> wait_for;
  {
    std::lock_guard<std::mutex> g(mu_);
    wait_for = overlapping(ranges);
  }
  for (const auto& w : wait_for) w->wait_finished();
}

void InFlight::wait_all() {
  std::vector<std::shared_ptr<CollectiveState>> wait_for;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (const auto& e : entries_) wait_for.push_back(e.second);
  }
  for (const auto& w : wait_for) w->wait_finished();
}

namespace {

class NeuronWork final : public c10d::Work {
 public:
  NeuronWork(int rank, c10d::OpType type, const char* name, std::shared_ptr<CollectiveState> state,
             std::shared_ptr<rt::Event> done, c10::DeviceIndex device, bool on_host,
             std::vector<at::Tensor> outputs, c10::intrusive_ptr<c10::ivalue::Future> future)
      : c10d::Work(rank, type, name),
        state_(std::move(state)),
        done_(std::move(done)),
        device_(device),
        on_host_(on_host),
        outputs_(std::move(outputs)),
        future_(std::move(future)) {}

  bool isCompleted() override {
    std::lock_guard<std::mutex> g(state_->mu);
    return state_->done || (state_->issued && state_->transport->isCompleted());
  }
  bool isSuccess() const override {
    std::lock_guard<std::mutex> g(state_->mu);
    return state_->done && !state_->error;
  }
  std::exception_ptr exception() const override {
    std::lock_guard<std::mutex> g(state_->mu);
    return state_->error;
  }
  int sourceRank() const override {
    std::lock_guard<std::mutex> g(state_->mu);
    return state_->source_rank;
  }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  // The caller's current stream waits for the collective; a failed collective
  // fails that stream (its next synchronization raises the error).
  void synchronize() override {
    if (p2p()) {
      wait_p2p(kNoTimeout);
      return;
    }
    rt::Queue& q = current_queue(device_);
    translate([&] {
      done_->block(q);
      q.launch(std::make_unique<rt::FunctionKernel>("c10d::wait", [state = state_] {
        std::lock_guard<std::mutex> g(state->mu);
        if (state->error) throw std::runtime_error(state->message);
      }));
    });
  }

  bool wait(std::chrono::milliseconds timeout) override {
    if (p2p()) return wait_p2p(timeout);
    // A barrier is a host synchronization point; so is a wait with a timeout,
    // and so is a collective on CPU tensors.
    if (on_host_ || retrieveOpType() == c10d::OpType::BARRIER || timeout != kNoTimeout) host_wait(timeout);
    {
      std::lock_guard<std::mutex> g(state_->mu);
      if (state_->done && state_->error) throw_error();
    }
    if (!on_host_) synchronize();
    return true;
  }

 private:
  bool p2p() const {
    const auto t = retrieveOpType();
    return t == c10d::OpType::SEND || t == c10d::OpType::RECV || t == c10d::OpType::RECVANYSOURCE;
  }

  // Sends and receives are issued by the collective queue without blocking it
  // (a rank's send and its receive must both be posted for either to finish,
  // as in batch_isend_irecv); their wait() blocks the host like Gloo's.
  bool wait_p2p(std::chrono::milliseconds timeout) {
    // The timeout covers the whole wait: a transfer may wait to be issued
    // behind collectives still running on the queue.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    c10::intrusive_ptr<c10d::Work> transport;
    {
      rt::BlockingScope blocking;
      std::unique_lock<std::mutex> lk(state_->mu);
      auto ready = [&] { return state_->issued || state_->done; };
      if (timeout == kNoTimeout) {
        state_->cv.wait(lk, ready);
      } else if (!state_->cv.wait_until(lk, deadline, ready)) {
        lk.unlock();
        throw_timeout(timeout, " (it was still waiting to be issued behind earlier collectives)");
      }
      if (state_->done) {
        if (state_->error) throw_error();
        return true;
      }
      transport = state_->transport;
    }
    if (timeout != kNoTimeout) {
      // Gloo reads 0 as "its default timeout": never pass less than 1 ms.
      timeout = std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                          deadline - std::chrono::steady_clock::now()));
    }
    try {
      rt::BlockingScope blocking;
      transport->wait(timeout);
    } catch (const std::exception& e) {
      std::string msg = std::string("neuron ") + c10d::opTypeToString(retrieveOpType()) + " failed: " + e.what();
      auto eptr = std::make_exception_ptr(c10::DistBackendError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, msg));
      state_->finish(eptr, msg, -1);
      if (!future_->completed()) future_->setError(eptr);
      throw_error();
    }
    const int src = retrieveOpType() == c10d::OpType::SEND ? -1 : transport->sourceRank();
    state_->finish(nullptr, "", src);
    if (!future_->completed()) future_->markCompleted(c10::IValue(outputs_));
    return true;
  }

  void host_wait(std::chrono::milliseconds timeout) {
    rt::BlockingScope blocking;  // releases the GIL while we wait
    std::unique_lock<std::mutex> lk(state_->mu);
    if (timeout == kNoTimeout) {
      state_->cv.wait(lk, [&] { return state_->done; });
    } else if (!state_->cv.wait_for(lk, timeout, [&] { return state_->done; })) {
      lk.unlock();
      throw_timeout(timeout, "");
    }
  }
  [[noreturn]] void throw_error() const { C10_THROW_ERROR(DistBackendError, state_->message); }
  [[noreturn]] void throw_timeout(std::chrono::milliseconds timeout, const std::string& why) const {
    C10_THROW_ERROR(DistBackendError, "neuron " + c10d::opTypeToString(retrieveOpType()) + " did not complete within the " +
                                          std::to_string(timeout.count()) + " ms passed to wait()" + why);
  }

  std::shared_ptr<CollectiveState> state_;
  std::shared_ptr<rt::Event> done_;
  c10::DeviceIndex device_;
  const bool on_host_;  // CPU tensors: wait() blocks until the data is there
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// Algorithms of our own move data with point-to-point transfers on the
// control transport: its tag space is not the user's send/recv one, and
// every rank derives the same tags from the collective's sequence number.
struct Direct {
  c10d::Backend* control;
  std::shared_ptr<BufferPool> buffers;  // shared: a work may outlive its group
  uint64_t seq;
  int rank, size;
  std::chrono::milliseconds timeout;
  std::shared_ptr<PeerLink> peers;  // null: no peer access
  int tag(int64_t step) const { return static_cast<int>((seq % (1u << 21)) * 512 + step % 512); }
};

using Issue = std::function<c10::intrusive_ptr<c10d::Work>(c10d::Backend&, const Direct&)>;
using Post = std::function<void()>;

// A collective of the backend's own algorithms (no future of its own: the
// completer thread waits for it).
class DirectWork : public c10d::Work {};

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

// Direct algorithms (any world size): every rank sends its data straight to
// every other rank with point-to-point transfers, which the transport runs
// on the connection's I/O thread from and into the tensors themselves. The
// transport's own allgather copies through a fresh flat buffer and its
// allreduce hands each operation to a worker thread; here both were
// slower than these (see bench/collectives.py and docs/distributed.md).
c10::intrusive_ptr<c10d::Work> send(const Direct& d, const at::Tensor& t, int peer, int tag) {
  std::vector<at::Tensor> v{t};
  return d.control->send(v, peer, tag);
}
c10::intrusive_ptr<c10d::Work> recv(const Direct& d, const at::Tensor& t, int peer, int tag) {
  std::vector<at::Tensor> v{t};
  return d.control->recv(v, peer, tag);
}

// all_gather_into_tensor of contiguous tensors.
bool direct_allgather_applies(const at::Tensor& out, const at::Tensor& in) {
  return out.is_contiguous() && in.is_contiguous();
}

c10::intrusive_ptr<c10d::Work> direct_allgather(const Direct& d, const at::Tensor& out, const at::Tensor& in) {
  const int64_t n = in.numel();
  at::Tensor flat_in = in.view(-1), flat_out = out.view(-1);
  std::vector<c10::intrusive_ptr<c10d::Work>> parts;
  if (n > 0) {
    for (int peer = 0; peer < d.size; ++peer) {
      if (peer == d.rank) continue;
      parts.push_back(recv(d, flat_out.narrow(0, peer * n, n), peer, d.tag(0)));
      parts.push_back(send(d, flat_in, peer, d.tag(0)));
    }
    at::Tensor own = flat_out.narrow(0, d.rank * n, n);
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

c10::intrusive_ptr<c10d::Work> direct_alltoall(const Direct& d, const std::vector<at::Tensor>& outputs,
                                               const std::vector<at::Tensor>& inputs) {
  std::vector<c10::intrusive_ptr<c10d::Work>> parts;
  for (int peer = 0; peer < d.size; ++peer) {
    if (peer == d.rank) continue;
    if (outputs[peer].numel() > 0) parts.push_back(recv(d, outputs[peer].view(-1), peer, d.tag(0)));
    if (inputs[peer].numel() > 0) parts.push_back(send(d, inputs[peer].view(-1), peer, d.tag(0)));
  }
  at::Tensor own = outputs[d.rank];
  if (own.numel() > 0 && own.data_ptr() != inputs[d.rank].data_ptr()) own.copy_(inputs[d.rank]);
  return c10::make_intrusive<JoinedWork>(std::move(parts));
}

// Allreduce of up to kDirectAllreduceBytes: each rank owns 1/size of the
// tensor; it receives the other ranks' copies of its part, reduces them into
// its own in rank order, and sends the result to everyone (a reduce-scatter
// and an allgather: the bytes of a ring, in two steps). Only the owner
// reduces a part, so every rank ends with the same bits. Above that size
// the transport's pipelined ring allreduce is as fast (measured), and is used.
constexpr int64_t kDirectAllreduceBytes = 1 << 20;

bool reducible(const at::Tensor& t, const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: case c10d::ReduceOp::PRODUCT:
      return true;
    case c10d::ReduceOp::MIN: case c10d::ReduceOp::MAX:
      return !t.is_complex();
    case c10d::ReduceOp::BAND: case c10d::ReduceOp::BOR: case c10d::ReduceOp::BXOR:
      return c10::isIntegralType(t.scalar_type(), /*includeBool=*/true);
    default:
      return false;
  }
}

bool direct_allreduce_applies(const at::Tensor& t, const c10d::ReduceOp& op) {
  return t.is_contiguous() && t.numel() * t.element_size() <= kDirectAllreduceBytes && reducible(t, op);
}

void reduce_into(at::Tensor& acc, const at::Tensor& other, const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: acc.add_(other); break;
    case c10d::ReduceOp::PRODUCT: acc.mul_(other); break;
    case c10d::ReduceOp::MIN: at::minimum_out(acc, acc, other); break;
    case c10d::ReduceOp::MAX: at::maximum_out(acc, acc, other); break;
    case c10d::ReduceOp::BAND: acc.bitwise_and_(other); break;
    case c10d::ReduceOp::BOR: acc.bitwise_or_(other); break;
    case c10d::ReduceOp::BXOR: acc.bitwise_xor_(other); break;
    default: TORCH_INTERNAL_ASSERT(false, "direct allreduce: unsupported reduce op");
  }
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
  ExchangeAllreduce(const Direct& d, at::Tensor flat, c10d::ReduceOp op)
      : buffers_(d.buffers), flat_(std::move(flat)), op_(std::move(op)), rank_(d.rank), timeout_(d.timeout) {
    if (flat_.numel() == 0) return;
    buffer_ = buffers_->take(flat_.numel() * flat_.element_size());
    theirs_ = buffer_.narrow(0, 0, flat_.numel() * flat_.element_size()).view(flat_.scalar_type());
    recv_ = recv(d, theirs_, 1 - rank_, d.tag(0));
    send_ = send(d, flat_, 1 - rank_, d.tag(0));
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

// Runs the reduce-scatter on the calling thread (it waits for the receives
// it reduces) and returns the allgather, still moving.
c10::intrusive_ptr<c10d::Work> direct_allreduce(const Direct& d, const at::Tensor& t, const c10d::ReduceOp& op) {
  const auto parts = t.view(-1).tensor_split(d.size);
  const at::Tensor& mine = parts[d.rank];
  const int64_t bytes = mine.numel() * mine.element_size();
  at::Tensor buffer = d.buffers->take((d.size - 1) * bytes);
  std::vector<at::Tensor> theirs(d.size);
  std::vector<c10::intrusive_ptr<c10d::Work>> recvs(d.size), sends;
  for (int peer = 0, slot = 0; peer < d.size; ++peer) {
    if (peer == d.rank) continue;
    if (bytes > 0) {
      theirs[peer] = buffer.narrow(0, bytes * slot++, bytes).view(mine.scalar_type());
      recvs[peer] = recv(d, theirs[peer], peer, d.tag(0));
    }
    if (parts[peer].numel() > 0) sends.push_back(send(d, parts[peer], peer, d.tag(0)));
  }
  at::Tensor acc = mine;
  for (int peer = 0; peer < d.size; ++peer) {
    if (!recvs[peer]) continue;
    recvs[peer]->wait(d.timeout);
    reduce_into(acc, theirs[peer], op);
  }
  // The parts sent above are overwritten by the allgather's receives.
  for (auto& w : sends) w->wait(d.timeout);
  recvs.clear();  // they hold views of the buffer
  theirs.clear();
  d.buffers->give(std::move(buffer));
  std::vector<c10::intrusive_ptr<c10d::Work>> gathers;
  for (int peer = 0; peer < d.size; ++peer) {
    if (peer == d.rank) continue;
    if (parts[peer].numel() > 0) gathers.push_back(recv(d, parts[peer], peer, d.tag(1)));
    if (bytes > 0) gathers.push_back(send(d, mine, peer, d.tag(1)));
  }
  return c10::make_intrusive<JoinedWork>(std::move(gathers));
}

// Peer access (ranks on one host, peer_access.h): each rank moves data
// straight between its memory and its peers' with one kernel copy, instead
// of a TCP send and receive (two copies and the protocol's work per byte,
// and a message's wake-ups). Every rank decides the same way: the choice
// depends only on what the fingerprint check compared (op, dtype, sizes).
// The work runs on the completer's thread, one collective at a time, in
// order; pieces of kPeerPieceBytes stay in cache between a read, its
// reduction and the writes.
constexpr int64_t kPeerPieceBytes = 512 << 10;

bool peer_access_applies(const Direct& d, const at::Tensor& t) { return d.peers && t.numel() > 0; }

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
  PeerWork(const Direct& d, at::Tensor exposed)
      : d_(d), exposed_(std::move(exposed)), number_(d.peers->take_number()) {}
  ~PeerWork() override {
    if (scratch_.defined()) d_.buffers->give(std::move(scratch_));
    // A numbered collective that never ran (its issue failed after this was
    // made): the peers wait for it, so they must learn that it will not come.
    if (!waited_) d_.peers->mark_broken("a collective was dropped on this rank before it ran");
  }

  bool isCompleted() override { return done_; }
  bool wait(std::chrono::milliseconds) override {
    if (done_) return true;
    waited_ = true;
    PeerLink& link = *d_.peers;
    TORCH_CHECK(!link.broken(), "peer access: an earlier collective of this group failed (", link.broken_reason(),
                "); the group cannot be used any more: create a new one");
    const auto now = std::chrono::steady_clock::now();
    const auto deadline = d_.timeout >= std::chrono::hours(24 * 365)
                              ? std::chrono::steady_clock::time_point::max()  // no overflow
                              : now + d_.timeout;
    const int64_t bytes = exposed_.numel() * exposed_.element_size();
    bool announced = false;
    try {
      link.announce(number_, {reinterpret_cast<uintptr_t>(exposed_.data_ptr()), bytes, d_.seq});
      announced = true;
      std::vector<uintptr_t> bases(d_.size);
      for (int peer = 0; peer < d_.size; ++peer) {
        if (peer == d_.rank) continue;
        const auto b = link.announced(peer, number_, deadline);
        TORCH_CHECK(b.check == d_.seq && b.bytes == bytes, "peer access: rank ", peer, " announced ", b.bytes,
                    " bytes for its collective ", b.check, "; this rank has ", bytes, " bytes for its collective ",
                    d_.seq);
        bases[peer] = b.address;
      }
      move(bases);
      link.finish(number_);
      for (int peer = 0; peer < d_.size; ++peer)
        if (peer != d_.rank) link.await_finished(peer, number_, deadline);
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
    const PeerLink& link = *d_.peers;
    const int64_t es = acc.element_size(), n = acc.numel(), piece = kPeerPieceBytes / es;
    if (n == 0) return;
    if (!scratch_.defined()) scratch_ = d_.buffers->take(std::min(n, piece) * es);
    for (int64_t at = 0; at < n; at += piece) {
      const int64_t k = std::min(piece, n - at);
      at::Tensor part = acc.narrow(0, at, k);
      at::Tensor theirs = scratch_.narrow(0, 0, k * es).view(acc.scalar_type());
      const uintptr_t where = offset + static_cast<uintptr_t>(at * es);
      for (int peer = 0; peer < d_.size; ++peer) {
        if (peer == d_.rank) continue;
        link.read(peer, theirs.data_ptr(), bases[peer] + where, k * es);
        reduce_into(part, theirs, op);
      }
      if (write_back)
        for (int peer = 0; peer < d_.size; ++peer)
          if (peer != d_.rank) link.write(peer, part.data_ptr(), bases[peer] + where, k * es);
    }
  }

  Direct d_;
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
  PeerAllreduce(const Direct& d, const at::Tensor& t, c10d::ReduceOp op) : PeerWork(d, peer_buffer(t)), op_(std::move(op)) {
    set_result(t, exposed_);
  }

 private:
  void move(const std::vector<uintptr_t>& bases) override {
    const at::Tensor mine = exposed_.tensor_split(d_.size)[d_.rank];
    const auto offset = static_cast<uintptr_t>((mine.storage_offset() - exposed_.storage_offset()) * mine.element_size());
    reduce_from_peers(mine, bases, offset, op_, /*write_back=*/true);
  }

  c10d::ReduceOp op_;
};

// reduce_scatter_tensor: each rank reads its part of every peer's input and
// reduces it into its output; nobody writes into a peer.
class PeerReduceScatter final : public PeerWork {
 public:
  PeerReduceScatter(const Direct& d, const at::Tensor& out, const at::Tensor& in, c10d::ReduceOp op)
      : PeerWork(d, peer_buffer(in)),
        acc_(peer_reachable(out) ? out.view(-1)
                                 : at::empty({out.numel()}, out.options().memory_format(c10::MemoryFormat::Contiguous))),
        op_(std::move(op)) {
    set_result(out, acc_);
  }

 private:
  void move(const std::vector<uintptr_t>& bases) override {
    const int64_t n = acc_.numel();
    acc_.copy_(exposed_.narrow(0, d_.rank * n, n));
    reduce_from_peers(acc_, bases, static_cast<uintptr_t>(d_.rank * n * acc_.element_size()), op_, false);
  }

  at::Tensor acc_;
  c10d::ReduceOp op_;
};

// broadcast: every other rank reads the root's tensor.
class PeerBroadcast final : public PeerWork {
 public:
  PeerBroadcast(const Direct& d, const at::Tensor& t, int root) : PeerWork(d, peer_buffer(t)), root_(root) {
    if (d.rank != root) set_result(t, exposed_);
  }

 private:
  void move(const std::vector<uintptr_t>& bases) override {
    if (d_.rank == root_) return;
    d_.peers->read(root_, exposed_.data_ptr(), bases[root_], exposed_.numel() * exposed_.element_size());
  }

  int root_;
};

// all_gather_into_tensor: each rank writes its input into its slot of every
// peer's output.
class PeerAllgather final : public PeerWork {
 public:
  PeerAllgather(const Direct& d, const at::Tensor& out, const at::Tensor& in)
      : PeerWork(d, peer_buffer(out)), in_(peer_buffer(in)) {
    set_result(out, exposed_);
    at::Tensor own = exposed_.narrow(0, d.rank * in_.numel(), in_.numel());
    if (own.data_ptr() != in_.data_ptr()) own.copy_(in_);
  }

 private:
  void move(const std::vector<uintptr_t>& bases) override {
    const int64_t bytes = in_.numel() * in_.element_size();
    for (int peer = 0; peer < d_.size; ++peer)
      if (peer != d_.rank)
        d_.peers->write(peer, in_.data_ptr(), bases[peer] + static_cast<uintptr_t>(d_.rank * bytes), bytes);
  }

  at::Tensor in_;
};

}  // namespace

namespace {
std::mutex g_groups_mu;
std::vector<ProcessGroupNeuron*> g_groups;  // live groups
bool g_shut_down = false;
}  // namespace

ProcessGroupNeuron::~ProcessGroupNeuron() {
  std::lock_guard<std::mutex> g(g_groups_mu);
  g_groups.erase(std::remove(g_groups.begin(), g_groups.end(), this), g_groups.end());
}

void ProcessGroupNeuron::shutdown_all() {
  // Released after unlocking: a split group held only here unregisters
  // itself in its destructor, which takes the lock.
  std::vector<c10::intrusive_ptr<c10d::Backend>> transports;
  std::vector<c10::intrusive_ptr<c10d::Store>> stores;
  {
    std::lock_guard<std::mutex> g(g_groups_mu);
    g_shut_down = true;
    for (ProcessGroupNeuron* pg : g_groups) {
      transports.push_back(std::move(pg->gloo_));
      transports.push_back(std::move(pg->control_));
      transports.push_back(std::move(pg->last_split_));
      stores.push_back(std::move(pg->last_split_store_));
    }
  }
  transports.clear();  // the caller has released the GIL
  stores.clear();
}

ProcessGroupNeuron::ProcessGroupNeuron(c10::intrusive_ptr<c10d::Backend> transport,
                                       c10::intrusive_ptr<c10d::Backend> control, int rank, int size,
                                       std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size),
      gloo_(std::move(transport)),
      control_(std::move(control)),
      timeout_(timeout),
      sequencer_(std::make_shared<Sequencer>()),
      in_flight_(std::make_shared<InFlight>()),
      buffers_(std::make_shared<BufferPool>()) {
  TORCH_CHECK_VALUE(gloo_, "ProcessGroupNeuron needs a transport backend");
  TORCH_CHECK_VALUE(gloo_->getRank() == rank && gloo_->getSize() == size,
                    "ProcessGroupNeuron: transport is rank ", gloo_->getRank(), " of ", gloo_->getSize(),
                    ", expected rank ", rank, " of ", size);
  TORCH_CHECK_VALUE(control_ && control_->getRank() == rank && control_->getSize() == size,
                    "ProcessGroupNeuron: the control transport must be a backend of the same ranks");
  // Collective: every rank creates the group at the same point.
  peers_ = PeerLink::negotiate(*control_);
  // Registered last: a constructor that throws runs no destructor to unregister.
  std::lock_guard<std::mutex> g(g_groups_mu);
  TORCH_CHECK(!g_shut_down, "the neuron distributed backend was shut down (interpreter exit)");
  g_groups.push_back(this);
}

c10::intrusive_ptr<c10d::Backend::Options> ProcessGroupNeuron::getBackendOptions() {
  return c10::make_intrusive<Options>("neuron", timeout_);
}

Completer::Completer() : thread_([this] { loop(); }) {}

Completer::~Completer() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

namespace {
std::mutex g_pending_mu;
std::condition_variable g_pending_cv;
int64_t g_pending = 0;  // completions queued or running, all groups
}  // namespace

bool Completer::drain(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(g_pending_mu);
  return g_pending_cv.wait_for(lk, timeout, [] { return g_pending == 0; });
}

namespace {
void count_pending() {
  std::lock_guard<std::mutex> g(g_pending_mu);
  ++g_pending;
}

void count_done() {
  {
    std::lock_guard<std::mutex> g(g_pending_mu);
    --g_pending;
  }
  g_pending_cv.notify_all();
}

// Counts a collective from the moment it is queued until the completer has it
// (or it failed, or its queue dropped it unrun), so that drain() also waits
// for collectives still on a queue.
struct QueuedCollective {
  QueuedCollective() { count_pending(); }
  ~QueuedCollective() { count_done(); }
  QueuedCollective(const QueuedCollective&) = delete;
  QueuedCollective& operator=(const QueuedCollective&) = delete;
};
}  // namespace

void Completer::add(c10::intrusive_ptr<c10d::Work> work, Done done, bool on_future) {
  // The transport's collectives complete a future on its worker thread: the
  // completion runs right there, without waking this thread (a wake-up costs
  // tens of microseconds of kernel time here, per collective).
  if (on_future && !dynamic_cast<DirectWork*>(work.get())) {
    auto future = work->getFuture();  // before counting: it may throw
    count_pending();
    future->addCallback([done = std::move(done)](c10::ivalue::Future& f) mutable {
      std::string error;
      if (f.hasError()) error = f.tryRetrieveErrorMessage();
      done(f.hasError() ? &error : nullptr);
      done = nullptr;  // drop the tensors before counting it done
      count_done();
    });
    return;
  }
  count_pending();
  {
    std::lock_guard<std::mutex> g(mu_);
    pending_.emplace_back(std::move(work), std::move(done));
  }
  cv_.notify_one();
}

void Completer::loop() {
  for (;;) {
    std::pair<c10::intrusive_ptr<c10d::Work>, Done> item;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !pending_.empty(); });
      if (pending_.empty()) return;  // stopping, nothing left
      item = std::move(pending_.front());
      pending_.pop_front();
    }
    std::string error;
    bool failed = false;
    try {
      item.first->wait();
    } catch (const std::exception& e) {
      error = e.what();
      failed = true;
    }
    item.second(failed ? &error : nullptr);
    item = {};  // drop the work and the callback before counting it done
    count_done();
  }
}

rt::Queue& ProcessGroupNeuron::ordering_queue(c10::DeviceIndex d) {
  TORCH_CHECK(gloo_, "neuron process group used after the interpreter began to exit");
  int expected = -1;
  queue_device_.compare_exchange_strong(expected, d);
  return runtime_device(static_cast<c10::DeviceIndex>(queue_device_.load())).collective_queue();
}

void ProcessGroupNeuron::setTimeout(std::chrono::milliseconds timeout) {
  timeout_ = timeout;
  gloo_->setTimeout(timeout);
  control_->setTimeout(timeout);
}

namespace {

// Runs one collective on the collective queue of `device`, after the work
// queued so far on the caller's current stream.
c10::intrusive_ptr<c10d::Work> run_collective(const Links& links, const Fingerprint* fp, rt::Queue& coll,
                                              c10d::OpType type, const char* name, c10::DeviceIndex device,
                                              bool on_host, std::vector<at::Tensor> keep,
                                              std::vector<at::Tensor> outputs, Issue issue, Post post) {
  const bool p2p = type == c10d::OpType::SEND || type == c10d::OpType::RECV || type == c10d::OpType::RECVANYSOURCE;
  // Point-to-point transfers wait for the collectives in flight on their
  // memory but are not tracked themselves: their completion is the caller's
  // host wait, which may come after later collectives.
  auto ranges = memory_ranges(keep);
  auto queued = std::make_shared<QueuedCollective>();
  rt::Queue& compute = current_queue(device);
  auto state = std::make_shared<CollectiveState>();
  auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  // Completed by the host when the transport has finished (not when the
  // queue passes it): the collective queue only *issues* collectives, in
  // program order, and the transport runs several at once.
  auto done = rt::Event::create(/*timing=*/false);
  const uint64_t done_version = done->record_external();
  // Sequence numbers are taken in the order the collectives reach the queue.
  std::lock_guard<std::mutex> order(links.sequencer->order_mu);
  const uint64_t seq = fp ? links.sequencer->add(*fp) : 0;
  translate([&] {
    auto ready = rt::Event::create(false);
    ready->record(compute);
    ready->block(coll);
    coll.launch(std::make_unique<rt::FunctionKernel>(
        name, [links, p2p, type, seq, check = fp != nullptr, ranges = std::move(ranges), issue = std::move(issue),
               post = std::move(post), state, future, outputs, keep = std::move(keep), name, done,
               done_version, queued = std::move(queued)]() mutable {
          // Released when this returns, whatever the path: by then the
          // collective failed, is a host-waited transfer, or is the completer's.
          const auto queued_until_return = std::move(queued);
          // Never throws: a failure is the collective's result (raised by
          // wait() and on the streams that wait for it), and the collective
          // queue stays usable for the collectives that follow.
          // By value: it also runs later, on the transport's thread.
          auto fail = [state, future, done, done_version, name](const std::string& what) {
            std::string msg = std::string("neuron collective ") + name + " failed: " + what;
            auto eptr = std::make_exception_ptr(
                c10::DistBackendError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, msg));
            state->finish(eptr, msg, -1);
            if (!future->completed()) future->setError(eptr);
            done->complete_external(done_version);
          };
          c10::intrusive_ptr<c10d::Work> w;
          try {
            if (check) links.sequencer->check(seq, *links.control);
            if (type == c10d::OpType::BARRIER) links.in_flight->wait_all();  // as a stream-ordered barrier would
            if (p2p) {
              links.in_flight->wait_overlapping(ranges);
            } else if (!ranges.empty()) {
              links.in_flight->admit(ranges, state);
            }
            w = issue(*links.gloo, Direct{links.control.get(), links.buffers, seq, links.rank, links.control->getSize(),
                                          links.timeout, links.peers});
          } catch (const std::exception& e) {
            return fail(e.what());
          }
          if (p2p) {
            {
              std::lock_guard<std::mutex> g(state->mu);
              state->transport = w;
              state->issued = true;
            }
            state->cv.notify_all();
            done->complete_external(done_version);  // p2p waits are host waits (wait_p2p)
            return;
          }
          // Completion on the completer's thread: the scaling step (AVG),
          // then the work's state, its future and the device-side event.
          // The tensors move along: the caller's tensors (with their Python
          // objects) are released here before the caller can see completion,
          // never by this thread afterwards (possibly during interpreter exit).
          // Gloo's allreduce completes its future when the data is in place. Not every Gloo
          // work does: reduce_scatter_tensor's does its last copy in wait() and never
          // completes a future, so the others are waited for on the completer's thread.
          const bool on_future = type == c10d::OpType::ALLREDUCE;
          try {
            links.completer->add(
              std::move(w), [state, future, outputs = std::move(outputs), post = std::move(post), done,
                             done_version, fail, keep = std::move(keep)](const std::string* error) mutable {
                std::string what = error ? *error : "";
                if (!error) {
                  try {
                    if (post) post();
                  } catch (const std::exception& e) {
                    what = e.what();
                    error = &what;
                  }
                }
                keep.clear();
                if (error) {
                  outputs.clear();
                  return fail(what);
                }
                future->markCompleted(c10::IValue(std::move(outputs)));
                outputs.clear();
                state->finish(nullptr, "", -1);
                done->complete_external(done_version);
              },
              on_future);
          } catch (const std::exception& e) {  // the queue must go on with the collectives after it
            return fail(e.what());
          }
        }));
  });
  return c10::make_intrusive<NeuronWork>(links.rank, type, name, state, done, device, on_host, std::move(outputs),
                                         future);
}

void check_reduce_op(const char* name, const c10d::ReduceOp& op, const std::vector<at::Tensor>& ts) {
  for (const auto& t : ts) {
    if (op == c10d::ReduceOp::BAND || op == c10d::ReduceOp::BOR || op == c10d::ReduceOp::BXOR)
      TORCH_CHECK_VALUE(c10::isIntegralType(t.scalar_type(), /*includeBool=*/true), name,
                        ": bitwise reductions need integer or bool tensors, got ", t.scalar_type());
    if (op == c10d::ReduceOp::PREMUL_SUM)
      TORCH_CHECK_VALUE(c10::isFloatingType(t.scalar_type()) || c10::isComplexType(t.scalar_type()), name,
                        ": PREMUL_SUM needs floating-point tensors, got ", t.scalar_type());
  }
}

// Inputs of a reduce-scatter are not written by the collective: premultiply a copy.
std::vector<at::Tensor> premultiplied(const c10d::ReduceOp& op, const std::vector<at::Tensor>& h) {
  if (op != c10d::ReduceOp::PREMUL_SUM) return h;
  std::vector<at::Tensor> out;
  for (const auto& t : h) {
    at::Tensor c = t.clone();
    premultiply(op, c);
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace

// CPU tensors take the same path (same queue, so every collective of the
// group reaches the transport in program order), and their wait() blocks.
#define NEURON_C10D_PLACE(NAME, ALL)  \
  c10::DeviceIndex d = -1;            \
  const bool on_host = check_tensors(NAME, ALL, &d) == Placement::kCpu;

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::broadcast(std::vector<at::Tensor>& tensors,
                                                             const c10d::BroadcastOptions& opts) {
  NEURON_C10D_PLACE("broadcast", tensors)
  auto h = host(tensors);
  const Fingerprint fp = fingerprint(c10d::OpType::BROADCAST, tensors, opts.rootRank);
  return run_collective(links(), &fp, ordering_queue(d), c10d::OpType::BROADCAST, "c10d::broadcast", d, on_host, tensors, tensors,
                        [h, opts](c10d::Backend& g, const Direct& direct) mutable {
                          if (h.size() == 1 && peer_access_applies(direct, h[0]))
                            return c10::intrusive_ptr<c10d::Work>(
                                c10::make_intrusive<PeerBroadcast>(direct, h[0], static_cast<int>(opts.rootRank)));
                          return g.broadcast(h, opts);
                        },
                        nullptr);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::allreduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  return allreduce_impl(tensors, opts, /*coalesced=*/false);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                       const c10d::AllreduceCoalescedOptions& opts) {
  return allreduce_impl(tensors, opts, /*coalesced=*/true);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::allreduce_impl(std::vector<at::Tensor>& tensors,
                                                                  const c10d::AllreduceOptions& opts, bool coalesced) {
  const char* name = coalesced ? "allreduce_coalesced" : "allreduce";
  const auto type = coalesced ? c10d::OpType::ALLREDUCE_COALESCED : c10d::OpType::ALLREDUCE;
  NEURON_C10D_PLACE(name, tensors)
  check_reduce_op(name, opts.reduceOp, tensors);
  auto h = host(tensors);
  const int size = size_;
  const Fingerprint fp = fingerprint(type, tensors, -1, opts.reduceOp.op_);
  return run_collective(
      links(), &fp, ordering_queue(d), type, coalesced ? "c10d::allreduce_coalesced" : "c10d::allreduce",
      d, on_host, tensors, tensors,
      [h, opts, coalesced](c10d::Backend& g, const Direct& direct) mutable {
        for (auto& t : h) premultiply(opts.reduceOp, t);
        if (coalesced) {
          c10d::AllreduceCoalescedOptions o;
          o.reduceOp = transport_op(opts.reduceOp);
          o.timeout = opts.timeout;
          return g.allreduce_coalesced(h, o);
        }
        c10d::AllreduceOptions o = opts;
        o.reduceOp = transport_op(opts.reduceOp);
        if (h.size() == 1 && reducible(h[0], o.reduceOp) && peer_access_applies(direct, h[0]))
          return c10::intrusive_ptr<c10d::Work>(c10::make_intrusive<PeerAllreduce>(direct, h[0], o.reduceOp));
        if (h.size() == 1 && direct_allreduce_applies(h[0], o.reduceOp)) {
          if (direct.size == 2)
            return c10::intrusive_ptr<c10d::Work>(c10::make_intrusive<ExchangeAllreduce>(direct, h[0].view(-1), o.reduceOp));
          return direct_allreduce(direct, h[0], o.reduceOp);
        }
        return g.allreduce(h, o);
      },
      [h, op = opts.reduceOp, size]() mutable {
        for (auto& t : h) average(op, t, size);
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::reduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  NEURON_C10D_PLACE("reduce", tensors)
  check_reduce_op("reduce", opts.reduceOp, tensors);
  auto h = host(tensors);
  const int size = size_;
  const bool root = opts.rootRank == rank_;
  const Fingerprint fp = fingerprint(c10d::OpType::REDUCE, tensors, opts.rootRank, opts.reduceOp.op_);
  return run_collective(
      links(), &fp, ordering_queue(d), c10d::OpType::REDUCE, "c10d::reduce", d, on_host, tensors, tensors,
      [h, opts](c10d::Backend& g, const Direct&) mutable {
        for (auto& t : h) premultiply(opts.reduceOp, t);
        c10d::ReduceOptions o = opts;
        o.reduceOp = transport_op(opts.reduceOp);
        return g.reduce(h, o);
      },
      [h, op = opts.reduceOp, size, root]() mutable {
        if (root)
          for (auto& t : h) average(op, t, size);
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllgatherOptions& opts) {
  auto all = flatten(outputs);
  all.insert(all.end(), inputs.begin(), inputs.end());
  NEURON_C10D_PLACE("allgather", all)
  auto ho = host(outputs);
  auto hi = host(inputs);
  const Fingerprint fp = fingerprint(c10d::OpType::ALLGATHER, inputs);
  return run_collective(links(), &fp, ordering_queue(d), c10d::OpType::ALLGATHER, "c10d::allgather", d, on_host, all, flatten(outputs),
                        [ho, hi, opts](c10d::Backend& g, const Direct&) mutable { return g.allgather(ho, hi, opts); }, nullptr);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                   const c10d::AllgatherOptions& opts) {
  std::vector<at::Tensor> all{output, input};
  NEURON_C10D_PLACE("all_gather_into_tensor", all)
  // Checked here, on every rank, before anything moves: the transfers would
  // otherwise fill part of the output, or fail inside the transport.
  TORCH_CHECK_VALUE(output.scalar_type() == input.scalar_type(), "all_gather_into_tensor: the output is ",
                    output.scalar_type(), " and the input ", input.scalar_type(), "; they must have the same dtype");
  TORCH_CHECK_VALUE(output.numel() == input.numel() * size_, "all_gather_into_tensor: the output has ", output.numel(),
                    " elements; it must have world size (", size_, ") x the input's ", input.numel());
  at::Tensor ho = host({output})[0], hi = host({input})[0];
  const Fingerprint fp = fingerprint(c10d::OpType::_ALLGATHER_BASE, {input});
  return run_collective(links(), &fp, ordering_queue(d), c10d::OpType::_ALLGATHER_BASE, "c10d::all_gather_into_tensor", d, on_host, all,
                        {output},
                        [ho, hi, opts](c10d::Backend& g, const Direct& direct) mutable {
                          if (peer_access_applies(direct, hi))
                            return c10::intrusive_ptr<c10d::Work>(c10::make_intrusive<PeerAllgather>(direct, ho, hi));
                          if (direct_allgather_applies(ho, hi)) return direct_allgather(direct, ho, hi);
                          return g._allgather_base(ho, hi, opts);
                        },
                        nullptr);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  auto all = flatten(outputs);
  all.insert(all.end(), inputs.begin(), inputs.end());
  NEURON_C10D_PLACE("allgather_coalesced", all)
  auto ho = host(outputs);
  auto hi = host(inputs);
  const Fingerprint fp = fingerprint(c10d::OpType::ALLGATHER_COALESCED, inputs);
  return run_collective(links(), &fp, ordering_queue(d), c10d::OpType::ALLGATHER_COALESCED, "c10d::allgather_coalesced", d, on_host, all,
                        flatten(outputs),
                        [ho, hi, opts](c10d::Backend& g, const Direct&) mutable { return g.allgather_coalesced(ho, hi, opts); },
                        nullptr);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  auto all = outputs;
  all.insert(all.end(), inputs.begin(), inputs.end());
  NEURON_C10D_PLACE("allgather_into_tensor_coalesced", all)
  auto ho = host(outputs);
  auto hi = host(inputs);
  const Fingerprint fp = fingerprint(c10d::OpType::COALESCED, inputs);
  return run_collective(
      links(), &fp, ordering_queue(d), c10d::OpType::COALESCED, "c10d::allgather_into_tensor_coalesced", d, on_host, all, outputs,
      [ho, hi, opts](c10d::Backend& g, const Direct&) mutable { return g.allgather_into_tensor_coalesced(ho, hi, opts); }, nullptr);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::GatherOptions& opts) {
  auto all = flatten(outputs);
  all.insert(all.end(), inputs.begin(), inputs.end());
  NEURON_C10D_PLACE("gather", all)
  auto ho = host(outputs);
  auto hi = host(inputs);
  const Fingerprint fp = fingerprint(c10d::OpType::GATHER, inputs, opts.rootRank);
  return run_collective(links(), &fp, ordering_queue(d), c10d::OpType::GATHER, "c10d::gather", d, on_host, all, flatten(outputs),
                        [ho, hi, opts](c10d::Backend& g, const Direct&) mutable { return g.gather(ho, hi, opts); }, nullptr);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::scatter(std::vector<at::Tensor>& outputs,
                                                           std::vector<std::vector<at::Tensor>>& inputs,
                                                           const c10d::ScatterOptions& opts) {
  auto all = flatten(inputs);
  all.insert(all.end(), outputs.begin(), outputs.end());
  NEURON_C10D_PLACE("scatter", all)
  auto ho = host(outputs);
  auto hi = host(inputs);
  const Fingerprint fp = fingerprint(c10d::OpType::SCATTER, outputs, opts.rootRank);
  return run_collective(links(), &fp, ordering_queue(d), c10d::OpType::SCATTER, "c10d::scatter", d, on_host, all, outputs,
                        [ho, hi, opts](c10d::Backend& g, const Direct&) mutable { return g.scatter(ho, hi, opts); }, nullptr);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                                  const c10d::ReduceScatterOptions& opts) {
  auto all = flatten(inputs);
  all.insert(all.end(), outputs.begin(), outputs.end());
  NEURON_C10D_PLACE("reduce_scatter", all)
  check_reduce_op("reduce_scatter", opts.reduceOp, all);
  auto ho = host(outputs);
  auto hi = host(inputs);
  const int size = size_;
  const Fingerprint fp = fingerprint(c10d::OpType::REDUCE_SCATTER, outputs, -1, opts.reduceOp.op_);
  return run_collective(
      links(), &fp, ordering_queue(d), c10d::OpType::REDUCE_SCATTER, "c10d::reduce_scatter", d, on_host, all, outputs,
      [ho, hi, opts](c10d::Backend& g, const Direct&) mutable {
        std::vector<std::vector<at::Tensor>> in;
        for (auto& l : hi) in.push_back(premultiplied(opts.reduceOp, l));
        c10d::ReduceScatterOptions o = opts;
        o.reduceOp = transport_op(opts.reduceOp);
        return g.reduce_scatter(ho, in, o);
      },
      [ho, op = opts.reduceOp, size]() mutable {
        for (auto& t : ho) average(op, t, size);
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                        const c10d::ReduceScatterOptions& opts) {
  std::vector<at::Tensor> all{output, input};
  NEURON_C10D_PLACE("reduce_scatter_tensor", all)
  check_reduce_op("reduce_scatter_tensor", opts.reduceOp, all);
  // Checked here, on every rank, before anything moves (as all_gather_into_tensor's output).
  TORCH_CHECK_VALUE(output.scalar_type() == input.scalar_type(), "reduce_scatter_tensor: the output is ",
                    output.scalar_type(), " and the input ", input.scalar_type(), "; they must have the same dtype");
  TORCH_CHECK_VALUE(input.numel() == output.numel() * size_, "reduce_scatter_tensor: the input has ", input.numel(),
                    " elements; it must have world size (", size_, ") x the output's ", output.numel());
  at::Tensor ho = host({output})[0], hi = host({input})[0];
  const int size = size_;
  const Fingerprint fp = fingerprint(c10d::OpType::_REDUCE_SCATTER_BASE, {output}, -1, opts.reduceOp.op_);
  return run_collective(
      links(), &fp, ordering_queue(d), c10d::OpType::_REDUCE_SCATTER_BASE, "c10d::reduce_scatter_tensor", d, on_host, all, {output},
      [ho, hi, opts](c10d::Backend& g, const Direct& direct) mutable {
        at::Tensor in = premultiplied(opts.reduceOp, {hi})[0];
        c10d::ReduceScatterOptions o = opts;
        o.reduceOp = transport_op(opts.reduceOp);
        if (reducible(ho, o.reduceOp) && peer_access_applies(direct, ho))
          return c10::intrusive_ptr<c10d::Work>(c10::make_intrusive<PeerReduceScatter>(direct, ho, in, o.reduceOp));
        return g._reduce_scatter_base(ho, in, o);
      },
      [ho, op = opts.reduceOp, size]() mutable { average(op, ho, size); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  auto all = outputs;
  all.insert(all.end(), inputs.begin(), inputs.end());
  NEURON_C10D_PLACE("reduce_scatter_tensor_coalesced", all)
  check_reduce_op("reduce_scatter_tensor_coalesced", opts.reduceOp, all);
  auto ho = host(outputs);
  auto hi = host(inputs);
  const int size = size_;
  const Fingerprint fp = fingerprint(c10d::OpType::COALESCED, outputs, -1, opts.reduceOp.op_);
  return run_collective(
      links(), &fp, ordering_queue(d), c10d::OpType::COALESCED, "c10d::reduce_scatter_tensor_coalesced", d, on_host, all, outputs,
      [ho, hi, opts](c10d::Backend& g, const Direct&) mutable {
        auto in = premultiplied(opts.reduceOp, hi);
        c10d::ReduceScatterOptions o = opts;
        o.reduceOp = transport_op(opts.reduceOp);
        return g.reduce_scatter_tensor_coalesced(ho, in, o);
      },
      [ho, op = opts.reduceOp, size]() mutable {
        for (auto& t : ho) average(op, t, size);
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                 std::vector<int64_t>& output_splits,
                                                                 std::vector<int64_t>& input_splits,
                                                                 const c10d::AllToAllOptions& opts) {
  std::vector<at::Tensor> all{output, input};
  NEURON_C10D_PLACE("all_to_all_single", all)
  at::Tensor ho = host({output})[0], hi = host({input})[0];
  // Element counts per peer (splits count rows; none: equal parts).
  auto counts = [&](const at::Tensor& t, const std::vector<int64_t>& splits) {
    TORCH_CHECK_VALUE(splits.empty() || static_cast<int>(splits.size()) == size_, "all_to_all_single: expected ",
                      size_, " split sizes, got ", splits.size());
    const int64_t rows = t.dim() > 0 ? t.size(0) : 1, row = rows > 0 ? t.numel() / rows : 0;
    std::vector<int64_t> c(size_);
    int64_t total = 0;
    for (int j = 0; j < size_; ++j) {
      c[j] = (splits.empty() ? rows / size_ : splits[j]) * row;
      total += splits.empty() ? rows / size_ : splits[j];
    }
    TORCH_CHECK_VALUE(splits.empty() ? rows % size_ == 0 : total == rows, "all_to_all_single: ",
                      splits.empty() ? "without split sizes, dim 0 (" + std::to_string(rows) +
                                           ") must divide by the world size (" + std::to_string(size_) + ")"
                                     : "the split sizes add up to " + std::to_string(total) + ", not dim 0 (" +
                                           std::to_string(rows) + ")");
    return c;
  };
  const auto sends = counts(input, input_splits), receives = counts(output, output_splits);
  TORCH_CHECK_VALUE(sends[rank_] == receives[rank_], "all_to_all_single: this rank sends itself ", sends[rank_],
                    " elements but expects ", receives[rank_]);
  const Fingerprint fp =
      split_signature(fingerprint(c10d::OpType::ALLTOALL_BASE, {input}), rank_, sends, receives);
  return run_collective(links(), &fp, ordering_queue(d), c10d::OpType::ALLTOALL_BASE, "c10d::all_to_all_single", d, on_host, all,
                        {output},
                        [ho, hi, output_splits, input_splits, opts](c10d::Backend& g, const Direct&) mutable {
                          return g.alltoall_base(ho, hi, output_splits, input_splits, opts);
                        },
                        nullptr);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::alltoall(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllToAllOptions& opts) {
  TORCH_CHECK_VALUE(static_cast<int>(outputs.size()) == size_ && static_cast<int>(inputs.size()) == size_,
                    "all_to_all: expected one input and one output tensor per rank (", size_, "), got ", inputs.size(),
                    " inputs and ", outputs.size(), " outputs");
  auto all = outputs;
  all.insert(all.end(), inputs.begin(), inputs.end());
  for (const auto& t : all)
    TORCH_CHECK_VALUE(t.scalar_type() == inputs[0].scalar_type(), "all_to_all: every tensor must have the dtype ",
                      inputs[0].scalar_type(), ", got one of ", t.scalar_type());
  NEURON_C10D_PLACE("all_to_all", all)
  auto ho = host(outputs);
  auto hi = host(inputs);
  std::vector<int64_t> sends, receives;
  for (int j = 0; j < size_; ++j) {
    sends.push_back(inputs[j].numel());
    receives.push_back(outputs[j].numel());
  }
  TORCH_CHECK_VALUE(sends[rank_] == receives[rank_], "all_to_all: this rank's input for itself has ", sends[rank_],
                    " elements, its output for itself ", receives[rank_]);
  const Fingerprint fp = split_signature(fingerprint(c10d::OpType::ALLTOALL, inputs), rank_, sends, receives);
  return run_collective(links(), &fp, ordering_queue(d), c10d::OpType::ALLTOALL, "c10d::all_to_all", d, on_host, all, outputs,
                        [ho, hi, opts](c10d::Backend& g, const Direct& direct) mutable {
                          if (direct_alltoall_applies(ho, hi)) return direct_alltoall(direct, ho, hi);
                          return g.alltoall(ho, hi, opts);
                        },
                        nullptr);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  NEURON_C10D_PLACE("send", tensors)
  auto h = host(tensors);
  return run_collective(links(), nullptr, ordering_queue(d), c10d::OpType::SEND, "c10d::send", d, on_host, tensors, tensors,
                        [h, dst, tag](c10d::Backend& g, const Direct&) mutable { return g.send(h, dst, tag); }, nullptr);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  NEURON_C10D_PLACE("recv", tensors)
  auto h = host(tensors);
  return run_collective(links(), nullptr, ordering_queue(d), c10d::OpType::RECV, "c10d::recv", d, on_host, tensors, tensors,
                        [h, src, tag](c10d::Backend& g, const Direct&) mutable { return g.recv(h, src, tag); }, nullptr);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  NEURON_C10D_PLACE("recv", tensors)
  auto h = host(tensors);
  return run_collective(links(), nullptr, ordering_queue(d), c10d::OpType::RECVANYSOURCE, "c10d::recv", d, on_host, tensors, tensors,
                        [h, tag](c10d::Backend& g, const Direct&) mutable {
                          // Gloo's receive from any source rejects an empty buffer; an empty
                          // message fits in a 1-byte one (the work holds it).
                          if (h.size() == 1 && h[0].numel() == 0) {
                            std::vector<at::Tensor> scratch{at::empty({1}, at::kByte)};
                            return g.recvAnysource(scratch, tag);
                          }
                          return g.recvAnysource(h, tag);
                        },
                        nullptr);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::barrier(const c10d::BarrierOptions& opts) {
  // Ordered after the current stream's queued work, then every rank meets.
  const c10::DeviceIndex d = current_device();
  const Fingerprint fp = fingerprint(c10d::OpType::BARRIER, {});
  return run_collective(links(), &fp, ordering_queue(d), c10d::OpType::BARRIER, "c10d::barrier", d, /*on_host=*/true, {}, {},
                        [opts](c10d::Backend& g, const Direct&) mutable {
                          c10d::BarrierOptions o = opts;
                          o.device_ids.clear();  // the transport's barrier is device-free
                          return g.barrier(o);
                        },
                        nullptr);
}

}  // namespace neuronx::distributed
