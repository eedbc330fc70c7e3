#pragma once
// Pinned (page-locked) host memory. On the simulated device every host page
// is reachable, but pinned buffers are still distinct: only they allow truly
// asynchronous host<->device copies, and is_pinned() must answer for them.
// Blocks are cached by power-of-two size class, as CUDA's host allocator does.
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace neuronx::rt {

// allocations: live blocks handed out; allocated_bytes: bytes in them; reserved_bytes: bytes
// held (live + cached). Listed once: the export iterates this list.
#define NEURONX_HOST_ALLOCATOR_STATS(X) \
  X(allocations) X(allocated_bytes) X(reserved_bytes) X(peak_allocated_bytes) X(num_host_alloc) X(num_host_free)

struct HostAllocatorStats {
#define NEURONX_FIELD(f) int64_t f = 0;
  NEURONX_HOST_ALLOCATOR_STATS(NEURONX_FIELD)
#undef NEURONX_FIELD
};

class HostAllocator {
 public:
  static HostAllocator& instance();
  void* malloc(size_t n);
  void free(void* ptr);
  bool is_pinned(const void* ptr) const;  // true for any address inside a live or cached block
  void empty_cache();
  HostAllocatorStats stats() const;
  void reset_peak_stats();
  void reset_accumulated_stats();

 private:
  HostAllocator() = default;
  ~HostAllocator();
  static size_t size_class(size_t n);
  mutable std::mutex mu_;
  std::map<uintptr_t, size_t> blocks_;               // base -> class size (all blocks)
  std::unordered_map<void*, size_t> live_;           // base -> class size
  std::unordered_map<size_t, std::vector<void*>> cached_;
  HostAllocatorStats stats_;
};

}  // namespace neuronx::rt
