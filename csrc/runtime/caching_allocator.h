#pragma once
// Caching allocator for one simulated NeuronCore's HBM.
//
// Same shape as PyTorch's CUDA caching allocator, so the statistics read the
// same: requests up to 1 MiB come from a small pool carved out of 2 MiB
// segments; larger ones from a large pool (20 MiB segments below 10 MiB,
// otherwise rounded to 2 MiB). Freed blocks are cached, split and coalesced;
// segments go back to the host only on empty_cache() or when an allocation
// would exceed the core's capacity.
#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace neuronx::rt {

struct Stat {
  int64_t current = 0, peak = 0, allocated = 0, freed = 0;
  void add(int64_t n) {
    current += n;
    if (n > 0) allocated += n; else freed -= n;
    if (current > peak) peak = current;
  }
  void reset_accumulated() { allocated = 0; freed = 0; }
  void reset_peak() { peak = current; }
};

enum StatType { kAggregate = 0, kSmallPool = 1, kLargePool = 2, kNumStatTypes = 3 };
using StatArray = std::array<Stat, kNumStatTypes>;

// Field names follow c10::CachingDeviceAllocator::DeviceStats.
struct AllocatorStats {
  StatArray allocation, segment, active, inactive_split;
  StatArray allocated_bytes, reserved_bytes, active_bytes, inactive_split_bytes, requested_bytes;
  int64_t num_alloc_retries = 0, num_ooms = 0, num_device_alloc = 0, num_device_free = 0;
  Stat oversize_allocations, oversize_segments;
  int64_t max_split_size = 0;
};

struct SegmentInfo {
  uintptr_t address = 0;
  size_t total_size = 0, allocated_size = 0, requested_size = 0;
  bool is_large = false;
  struct BlockInfo { size_t size, requested_size; bool allocated; };
  std::vector<BlockInfo> blocks;
};

class CachingAllocator {
 public:
  static constexpr size_t kMinBlock = 512;
  static constexpr size_t kSmallSize = 1 << 20;       // requests <= 1 MiB: small pool
  static constexpr size_t kSmallBuffer = 2 << 20;     // small pool segment size
  static constexpr size_t kLargeBuffer = 20 << 20;    // segment for 1..10 MiB requests
  static constexpr size_t kMinLargeAlloc = 10 << 20;
  static constexpr size_t kRoundLarge = 2 << 20;

  CachingAllocator(int device, size_t capacity);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Returns device memory of at least n bytes (nullptr for n == 0) and an
  // opaque handle for free(). Throws Error(kOutOfMemory) past capacity.
  void* malloc(size_t n, void** handle);
  void free(void* handle);
  // Frees a handle from any device's allocator (for deleters that only get the handle).
  static void release(void* handle);

  bool owns(const void* ptr) const;
  void empty_cache();
  AllocatorStats stats() const;
  void reset_accumulated_stats();
  void reset_peak_stats();
  std::vector<SegmentInfo> snapshot() const;

  size_t capacity() const { return capacity_; }
  size_t reserved() const;
  // Per-process cap below capacity (memory fraction); 0 means none.
  void set_limit(size_t bytes);
  size_t limit() const;
  // Before growing past this share of the (limited) capacity, free idle
  // cached segments first (PyTorch's garbage_collection_threshold). 0: off.
  void set_gc_threshold(double share);
  int device() const { return device_; }

  static size_t round_size(size_t n);

 private:
  struct Segment;
  struct Block {
    size_t size = 0, requested = 0;
    char* ptr = nullptr;
    Segment* seg = nullptr;
    Block *prev = nullptr, *next = nullptr;
    bool allocated = false;
  };
  struct Segment {
    char* base = nullptr;
    size_t size = 0;
    bool small = false;
    Block* head = nullptr;
    CachingAllocator* owner = nullptr;
  };
  struct BlockLess {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
    }
  };
  using Pool = std::set<Block*, BlockLess>;

  Block* find_free(Pool& pool, size_t size);
  Block* new_segment(size_t alloc_size, bool small, size_t requested);
  bool release_cached(size_t needed, size_t budget);
  void release_segment(Segment* s);
  void update_stats(bool small, StatArray AllocatorStats::*field, int64_t n);
  size_t effective_capacity() const { return limit_ ? limit_ : capacity_; }

  const int device_;
  const size_t capacity_;
  size_t limit_ = 0;
  double gc_threshold_ = 0;
  mutable std::mutex mu_;
  Pool small_pool_, large_pool_;
  std::unordered_map<char*, Segment*> segments_;  // base -> segment
  size_t reserved_ = 0;
  AllocatorStats stats_;
};

}  // namespace neuronx::rt
