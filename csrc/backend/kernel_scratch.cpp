// Host memory that ATen's CPU kernels allocate while they run on the device's engine threads:
// a library call's results in a compiled graph, a functional op's result before it is copied
// into device memory, a kernel's own temporaries. Through the default CPU allocator every such
// block of a megabyte or more is a fresh mmap, and each of its pages faults on first touch: a
// GPT-2 training step took 87,000 page faults (340 MB of fresh pages) every step, compiled.
// These blocks play the part of a NeuronCore's scratch memory, so they are kept and reused, by
// size, like the device's own memory (torch.neuron.empty_cache() returns them). Past the cap the
// blocks idle longest go first: shapes that change (dynamic sequence lengths) leave no dead
// sizes behind.
#include "backend/kernel_scratch.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <atomic>
#include <cstdlib>
#include <list>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/queue.h"

namespace neuronx {

namespace {

thread_local ScratchPlacement* t_placement = nullptr;
std::atomic<int64_t> g_placed{0};

void keep(void*) {}  // placed memory belongs to the tensor it was lent from

constexpr size_t kMinBytes = size_t{1} << 20;   // smaller blocks come from malloc's own heap
constexpr size_t kGranule = size_t{64} << 10;   // sizes are rounded up to this, then reused exactly
constexpr size_t kDefaultMaxCached = size_t{2} << 30;  // idle bytes kept at most

// TORCH_NEURONX_KERNEL_SCRATCH_BYTES overrides the cap (0: nothing kept).
size_t max_cached() {
  const char* v = std::getenv("TORCH_NEURONX_KERNEL_SCRATCH_BYTES");
  if (!v || !*v) return kDefaultMaxCached;
  if (*v < '0' || *v > '9') return kDefaultMaxCached;  // (strtoull would take "-1" as a huge cap)
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  return end && *end == '\0' ? static_cast<size_t>(n) : kDefaultMaxCached;
}

class ScratchAllocator final : public c10::Allocator {
 public:
  explicit ScratchAllocator(c10::Allocator* base)
      : base_(base), base_raw_deleter_(base->raw_deleter()), max_cached_(max_cached()) {}

  c10::DataPtr allocate(size_t n) override {
    if (ScratchPlacement* h = t_placement; h && !h->taken() && n == h->bytes()) {
      g_placed.fetch_add(1, std::memory_order_relaxed);
      return {h->take(), h->memory(), &keep, c10::Device(c10::kCPU)};
    }
    if (n < kMinBytes || !rt::on_engine_thread()) return base_->allocate(n);
    const size_t size = (n + kGranule - 1) / kGranule * kGranule;
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> g(mu_);
      auto it = idle_.find(size);
      if (it != idle_.end() && !it->second.empty()) {
        const auto block = it->second.back();  // the most recently idle one (warm in cache)
        it->second.pop_back();
        if (it->second.empty()) idle_.erase(it);
        p = block->second;
        lru_.erase(block);
        idle_bytes_ -= size;
        live_.emplace(p, size);
        stats_.reused++;
      }
    }
    if (!p) {
      p = c10::alloc_cpu(size);
      std::lock_guard<std::mutex> g(mu_);
      live_.emplace(p, size);
      stats_.fresh++;
    }
    return {p, p, &release, c10::Device(c10::kCPU)};
  }

  // Also the raw deleter: blocks of base_ (raw_allocate of small sizes) go back to it.
  static void release(void* p) { instance()->put(p); }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  void empty() {
    std::vector<void*> blocks;
    {
      std::lock_guard<std::mutex> g(mu_);
      for (const auto& [size, p] : lru_) blocks.push_back(p);
      lru_.clear();
      idle_.clear();
      idle_bytes_ = 0;
    }
    for (void* p : blocks) c10::free_cpu(p);
  }

  KernelScratchStats stats() {
    std::lock_guard<std::mutex> g(mu_);
    KernelScratchStats s = stats_;
    s.idle_bytes = idle_bytes_;
    s.idle_blocks = lru_.size();
    return s;
  }

  static ScratchAllocator*& instance() {
    static ScratchAllocator* a = nullptr;
    return a;
  }

 private:
  void put(void* p) {
    bool ours = false;
    std::vector<void*> evicted;
    {
      std::lock_guard<std::mutex> g(mu_);
      auto it = live_.find(p);
      if (it != live_.end()) {
        ours = true;
        const size_t size = it->second;
        live_.erase(it);
        if (size <= max_cached_) {
          while (idle_bytes_ + size > max_cached_) {  // the blocks idle longest make room
            const auto [old_size, old] = lru_.front();
            auto& same = idle_[old_size];
            same.erase(same.begin());  // (the oldest of its size: vectors fill in idle order)
            if (same.empty()) idle_.erase(old_size);
            lru_.pop_front();
            idle_bytes_ -= old_size;
            stats_.evicted_bytes += old_size;
            evicted.push_back(old);
          }
          idle_[size].push_back(lru_.insert(lru_.end(), {size, p}));
          idle_bytes_ += size;
          p = nullptr;
        }
      }
    }
    for (void* e : evicted) c10::free_cpu(e);
    if (!p) return;
    if (ours) c10::free_cpu(p);
    else base_raw_deleter_(p);
  }

  c10::Allocator* base_;
  c10::DeleterFnPtr base_raw_deleter_;
  const size_t max_cached_;
  std::mutex mu_;
  using Lru = std::list<std::pair<size_t, void*>>;  // idle blocks, longest idle first
  std::unordered_map<void*, size_t> live_;
  Lru lru_;
  std::unordered_map<size_t, std::vector<Lru::iterator>> idle_;  // by size, in idle order
  size_t idle_bytes_ = 0;
  KernelScratchStats stats_;
};

}  // namespace

ScratchPlacement::ScratchPlacement(void* memory, size_t bytes) : memory_(memory), bytes_(bytes), outer_(t_placement) {
  t_placement = this;
}

ScratchPlacement::~ScratchPlacement() { t_placement = outer_; }

void install_kernel_scratch_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto* a = new ScratchAllocator(c10::GetCPUAllocator());  // lives as long as the process
    ScratchAllocator::instance() = a;
    c10::SetCPUAllocator(a, /*priority=*/1);
  });
}

void empty_kernel_scratch() {
  if (ScratchAllocator* a = ScratchAllocator::instance()) a->empty();
}

KernelScratchStats kernel_scratch_stats() {
  ScratchAllocator* a = ScratchAllocator::instance();
  KernelScratchStats s = a ? a->stats() : KernelScratchStats{};
  s.placed = g_placed.load(std::memory_order_relaxed);
  return s;
}

}  // namespace neuronx
