#include "runtime/host_allocator.h"

#include <sys/mman.h>

#include <new>

#include "runtime/error.h"

namespace neuronx::rt {

HostAllocator& HostAllocator::instance() {
  // Leaked on purpose: pinned buffers can outlive static destruction order.
  static HostAllocator* a = new HostAllocator();
  return *a;
}

HostAllocator::~HostAllocator() = default;

size_t HostAllocator::size_class(size_t n) {
  size_t c = 4096;
  while (c < n) c <<= 1;
  return c;
}

void* HostAllocator::malloc(size_t n) {
  if (n == 0) return nullptr;
  const size_t c = size_class(n);
  std::lock_guard<std::mutex> g(mu_);
  void* p = nullptr;
  auto& free_list = cached_[c];
  if (!free_list.empty()) {
    p = free_list.back();
    free_list.pop_back();
  } else {
    p = mmap(nullptr, c, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      throw Error(ErrorCode::kOutOfMemory,
                  "could not allocate " + std::to_string(n) + " bytes of pinned host memory");
    blocks_[reinterpret_cast<uintptr_t>(p)] = c;
    stats_.reserved_bytes += static_cast<int64_t>(c);
    stats_.num_host_alloc++;
  }
  live_[p] = c;
  stats_.allocations++;
  stats_.allocated_bytes += static_cast<int64_t>(c);
  if (stats_.allocated_bytes > stats_.peak_allocated_bytes) stats_.peak_allocated_bytes = stats_.allocated_bytes;
  return p;
}

void HostAllocator::free(void* ptr) {
  if (!ptr) return;
  std::lock_guard<std::mutex> g(mu_);
  auto it = live_.find(ptr);
  if (it == live_.end()) return;
  const size_t c = it->second;
  live_.erase(it);
  stats_.allocations--;
  stats_.allocated_bytes -= static_cast<int64_t>(c);
  cached_[c].push_back(ptr);
}

bool HostAllocator::is_pinned(const void* ptr) const {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> g(mu_);
  auto it = blocks_.upper_bound(p);
  if (it == blocks_.begin()) return false;
  --it;
  return p < it->first + it->second;
}

void HostAllocator::empty_cache() {
  std::lock_guard<std::mutex> g(mu_);
  for (auto& [c, list] : cached_) {
    for (void* p : list) {
      munmap(p, c);
      blocks_.erase(reinterpret_cast<uintptr_t>(p));
      stats_.reserved_bytes -= static_cast<int64_t>(c);
      stats_.num_host_free++;
    }
    list.clear();
  }
}

HostAllocatorStats HostAllocator::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  return stats_;
}

void HostAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> g(mu_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
}

void HostAllocator::reset_accumulated_stats() {
  std::lock_guard<std::mutex> g(mu_);
  stats_.num_host_alloc = stats_.num_host_free = 0;
}

}  // namespace neuronx::rt
