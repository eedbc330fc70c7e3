#include "compiler/adaptive_eager.h"

#include <ATen/Parallel.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "backend/op_kernel.h"
#include "compiler/adaptive_plan.h"
#include "compiler/codegen.h"
#include "compiler/kernel_cache.h"
#include "runtime/event.h"
#include "runtime/queue.h"

namespace neuronx::compiler::adaptive {

namespace {

// Elements per thread of a fused kernel: ATen's grain for pointwise kernels (at::internal::GRAIN_SIZE).
constexpr int64_t kGrain = 32768;

struct Counters {
#define NEURONX_FIELD(f) std::atomic<int64_t> f{0};
  NEURONX_ADAPTIVE_COUNTERS(NEURONX_FIELD)
#undef NEURONX_FIELD
  std::array<std::atomic<int64_t>, static_cast<size_t>(End::kCount)> ended{};
};
Counters& counters() {
  static auto* c = new Counters;
  return *c;
}

// One group structure: its kernel once built (null until then, or when the build failed).
struct Variant {
  std::atomic<KernelFn> fn{nullptr};
  std::string name;  // "adaptive_fused(aten::add.Tensor, aten::relu)"
  std::shared_ptr<SharedObject> library;
};

// Builds kernels one at a time on a thread of its own (a build is a C++ compiler run).
class Builds {
 public:
  static Builds& instance() {
    static auto* b = new Builds;  // (never destroyed: engines may use it until exit)
    return *b;
  }
  // Builds waiting or running at most: a program whose groups vary (windows of every length)
  // must not queue a compiler run per shape; a variant refused now is offered again when seen.
  static constexpr int kMaxPending = 4;
  bool full() {
    std::lock_guard<std::mutex> lk(mu_);
    return pending_ >= kMaxPending;
  }
  void submit(std::shared_ptr<Variant> v, std::string source) {
    std::lock_guard<std::mutex> lk(mu_);
    jobs_.push_back({std::move(v), std::move(source)});
    ++pending_;
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    cv_.notify_one();
  }
  bool wait(double timeout_s) {
    std::unique_lock<std::mutex> lk(mu_);
    return done_cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), [&] { return pending_ == 0; });
  }

 private:
  struct Job {
    std::shared_ptr<Variant> variant;
    std::string source;
  };
  void loop() {
    // Builds run behind the program, not beside it: on a machine with few cores a compiler run
    // at normal priority takes a core from the host thread and the engine (nice is per thread on
    // Linux, and the compiler processes this thread starts inherit it).
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 19);
    while (true) {
      Job job;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return !jobs_.empty(); });
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      build(job);
      std::lock_guard<std::mutex> lk(mu_);
      --pending_;
      done_cv_.notify_all();
    }
  }
  static void build(Job& job) {
    Counters& c = counters();
    try {
      BuildStats stats;
      std::vector<std::shared_ptr<SharedObject>> keep;
      auto fns = KernelCache::instance().load({job.source}, {{"nx_adaptive"}}, keep, stats);
      c.kernels_built += stats.kernels_built;
      c.kernel_cache_hits += stats.kernel_cache_hits;
      job.variant->library = keep.empty() ? nullptr : keep[0];
      job.variant->fn.store(fns.at(0).at(0), std::memory_order_release);
    } catch (const std::exception&) {
      c.build_failures++;  // the group keeps running kernel by kernel
    }
  }
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<Job> jobs_;
  int pending_ = 0;
  std::thread thread_;
};

class Variants {
 public:
  static Variants& instance() {
    static auto* v = new Variants;
    return *v;
  }
  // The variant of p's structure; first sight creates it and starts its build (unless the
  // builder is busy: then the group runs unfused under a variant that is not kept).
  std::shared_ptr<Variant> find_or_build(const Plan& p) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = map_.find(p.key);
      if (it != map_.end()) return it->second;
    }
    auto v = std::make_shared<Variant>();
    if (Builds::instance().full()) {
      counters().builds_deferred++;
      v->name = "adaptive_group";
      return v;
    }
    v->name = "adaptive_fused(";
    for (size_t i = 0; i < p.nodes.size(); ++i) {
      const c10::OperatorName& op = p.nodes[i].op->operator_name();
      v->name += (i ? ", " : "") + op.name + (op.overload_name.empty() ? "" : "." + op.overload_name);
    }
    v->name += ")";
    FusionGroup group;
    Graph g = to_graph(p, group);
    // Every op rounds on its own, as eager's kernels do: no multiply-add contraction.
    std::string source = "#pragma GCC optimize(\"fp-contract=off\")\n" + kernel_prelude() +
                         generate_kernel(g, group, "nx_adaptive");
    if (const char* dir = std::getenv("TORCH_NEURONX_ADAPTIVE_DUMP")) {  // sources, for reading
      std::ofstream(std::string(dir) + "/adaptive_" + KernelCache::instance().hash(p.key) + ".cpp")
          << "// " << v->name << "\n// key " << p.key << "\n" << source;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto [it, added] = map_.emplace(p.key, v);
      if (!added) return it->second;
    }
    counters().variants++;
    Builds::instance().submit(v, std::move(source));
    return v;
  }

 private:
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<Variant>> map_;
};

// A group of queued kernels run as one: the generated kernel over the group's buffers, or (until
// it is built) the kernels one by one.
class GroupKernel final : public rt::Kernel {
 public:
  GroupKernel(std::vector<std::unique_ptr<rt::Kernel>> members, std::shared_ptr<Variant> v, const Plan& p)
      : members_(std::move(members)), variant_(std::move(v)), scalars_(p.scalars), numel_(p.numel),
        dead_(p.dead_outputs()) {
    for (int i : p.inputs()) ptrs_.push_back(p.slots[p.value_slot[i]].ptr);
    for (int o : p.outputs()) ptrs_.push_back(p.slots[p.value_slot[o]].ptr);
    origin = members_.front()->origin;
    correlation = members_.front()->correlation;
    enqueue_ns = members_.front()->enqueue_ns;
  }
  void run() override {
    Counters& c = counters();
    if (KernelFn fn = variant_->fn.load(std::memory_order_acquire)) {
      char* const* ptrs = ptrs_.data();
      const double* scalars = scalars_.data();
      at::parallel_for(0, numel_, kGrain, [&](int64_t b, int64_t e) { fn(ptrs, scalars, b, e); });
      c.groups_fused.fetch_add(1, std::memory_order_relaxed);
      c.ops_fused.fetch_add(static_cast<int64_t>(members_.size()), std::memory_order_relaxed);
      if (dead_) c.dead_not_written.fetch_add(dead_, std::memory_order_relaxed);
      return;
    }
    c.groups_unfused.fetch_add(1, std::memory_order_relaxed);
    const bool observed = rt::observing();
    for (auto& k : members_) {
      const int64_t start = observed ? rt::now_ns() : 0;
      try {
        k->run();
      } catch (...) {
        failed_ = k.get();  // the error names the op that failed, as unfused
        origin = k->origin;
        throw;
      }
      if (observed) rt::report_step(k->name(), start, rt::now_ns());
    }
    reported_steps = observed;
  }
  const char* name() const override { return failed_ ? failed_->name() : variant_->name.c_str(); }

 private:
  std::vector<std::unique_ptr<rt::Kernel>> members_;
  std::shared_ptr<Variant> variant_;
  std::vector<char*> ptrs_;
  std::vector<double> scalars_;
  int64_t numel_;
  int dead_;
  const rt::Kernel* failed_ = nullptr;
};

class AdaptiveGrouper final : public rt::Grouper {
 public:
  bool candidate(const rt::Kernel& head) override { return is_candidate(head); }
  size_t plan(const rt::Kernel& head, const rt::GroupWindow& w) override {
    Plan& p = plan_();
    make_plan(head, w, p);
    counters().ended[static_cast<size_t>(p.end)].fetch_add(1, std::memory_order_relaxed);
    return p.members - 1;
  }
  std::unique_ptr<rt::Kernel> make(std::vector<std::unique_ptr<rt::Kernel>> members) override {
    const Plan& p = plan_();
    return std::make_unique<GroupKernel>(std::move(members), Variants::instance().find_or_build(p), p);
  }

 private:
  static Plan& plan_() {
    thread_local Plan p;  // plan() and make() run on one engine thread, one after the other
    return p;
  }
};

std::atomic<Mode> g_mode{Mode::kEager};

}  // namespace

void set_mode(Mode m) {
  static AdaptiveGrouper grouper;
  g_mode.store(m);
  OpKernel::set_track_output_liveness(m == Mode::kAdaptive);
  rt::set_grouper(m == Mode::kAdaptive ? &grouper : nullptr);
}

Mode mode() { return g_mode.load(); }

Metrics metrics() {
  Counters& c = counters();
  Metrics m;
#define NEURONX_COPY(f) m.f = c.f.load();
  NEURONX_ADAPTIVE_COUNTERS(NEURONX_COPY)
#undef NEURONX_COPY
  for (size_t i = 0; i < c.ended.size(); ++i) m.ended[end_name(static_cast<End>(i))] = c.ended[i];
  return m;
}

void reset_metrics() {
  Counters& c = counters();
  const int64_t variants = c.variants;  // (a count of what exists, not of events)
#define NEURONX_ZERO(f) c.f.store(0);
  NEURONX_ADAPTIVE_COUNTERS(NEURONX_ZERO)
#undef NEURONX_ZERO
  c.variants = variants;
  for (auto& e : c.ended) e.store(0);
}

bool wait_for_builds(double timeout_s) { return Builds::instance().wait(timeout_s); }

}  // namespace neuronx::compiler::adaptive
