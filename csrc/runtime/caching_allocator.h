#pragma once
// Caching allocator for one simulated NeuronCore's HBM.
//
// Same shape as PyTorch's CUDA caching allocator, so the statistics read the
// same: requests up to 1 MiB come from a small pool carved out of 2 MiB
// segments; larger ones from a large pool (20 MiB segments below 10 MiB,
// otherwise rounded to 2 MiB). Freed blocks are cached, split and coalesced;
// segments go back to the host only on empty_cache() or when an allocation
// would exceed the core's capacity.
//
// Stream-ordered, as CUDA's: every segment belongs to the stream (queue) it was
// allocated for, and a block freed on the host goes back to that stream's pool at
// once, to be handed to later work on the same stream. Stream order makes that safe:
// a kernel queued earlier on the stream runs before any later user of the block.
// Queued kernels therefore do not own their operands' memory. A use on another stream
// is covered by record_stream(): the freed block is held until that stream has passed
// the point where the free happened. Segments go back to the host only once their
// stream has run everything queued before their last free (a fence per segment).
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace neuronx::rt {

class Queue;

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

// The statistics, listed once: every copy, reset and export iterates these lists. Field names
// follow c10::CachingDeviceAllocator::DeviceStats.
#define NEURONX_ALLOCATOR_STAT_ARRAYS(X) \
  X(allocation) X(segment) X(active) X(inactive_split) X(allocated_bytes) X(reserved_bytes) X(active_bytes) \
  X(inactive_split_bytes) X(requested_bytes)
#define NEURONX_ALLOCATOR_STATS(X) X(oversize_allocations) X(oversize_segments)
#define NEURONX_ALLOCATOR_COUNTERS(X) X(num_alloc_retries) X(num_ooms) X(num_device_alloc) X(num_device_free)

struct AllocatorStats {
#define NEURONX_FIELD(f) StatArray f;
  NEURONX_ALLOCATOR_STAT_ARRAYS(NEURONX_FIELD)
#undef NEURONX_FIELD
#define NEURONX_FIELD(f) Stat f;
  NEURONX_ALLOCATOR_STATS(NEURONX_FIELD)
#undef NEURONX_FIELD
#define NEURONX_FIELD(f) int64_t f = 0;
  NEURONX_ALLOCATOR_COUNTERS(NEURONX_FIELD)
#undef NEURONX_FIELD
  int64_t max_split_size = 0;  // a setting, reported with the statistics
};

// Where an allocation came from (a captured stack). Opaque here: the layer
// above captures and symbolizes it, so the runtime stays torch-free.
struct AllocContext {
  virtual ~AllocContext() = default;
};
using AllocContextFn = std::shared_ptr<AllocContext> (*)();

// Memory history, as PyTorch's _record_memory_history defines it.
struct HistoryOptions {
  bool enabled = false;       // keep contexts of live blocks ("state")
  bool trace = false;         // also keep the alloc/free event trace ("all")
  enum class Context : uint8_t { kNone, kState, kAlloc, kAll } context = Context::kNone;
  size_t max_entries = 0;     // trace ring size
  bool clear = false;         // drop the trace recorded so far
  AllocContextFn capture = nullptr;
};

struct TraceEntry {
  enum class Action : uint8_t { kAlloc, kFreeRequested, kFreeCompleted, kSegmentAlloc, kSegmentFree, kOom, kSnapshot };
  Action action;
  uintptr_t addr;
  size_t size;
  size_t device_free;  // for kOom: what was still free
  int64_t time_us;     // since the epoch
  std::shared_ptr<AllocContext> context;
};

struct SegmentInfo {
  uintptr_t address = 0;
  uint64_t stream = 0;  // id of the queue the segment belongs to
  size_t total_size = 0, allocated_size = 0, requested_size = 0;
  bool is_large = false;
  struct BlockInfo {
    size_t size, requested_size;
    bool allocated;
    bool pending_free;  // freed, held until the streams recorded on it pass the free
    std::shared_ptr<AllocContext> context;
  };
  std::vector<BlockInfo> blocks;
  std::shared_ptr<AllocContext> context;  // of the allocation that created it
};

class CachingAllocator {
 public:
  static constexpr size_t kMinBlock = 512;
  static constexpr size_t kSmallSize = 1 << 20;       // requests <= 1 MiB: small pool
  static constexpr size_t kSpares = 64;               // recycled tree nodes and Block records kept
  static constexpr size_t kSmallBuffer = 2 << 20;     // small pool segment size
  static constexpr size_t kLargeBuffer = 20 << 20;    // segment for 1..10 MiB requests
  static constexpr size_t kMinLargeAlloc = 10 << 20;
  static constexpr size_t kRoundLarge = 2 << 20;

  CachingAllocator(int device, size_t capacity);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Returns device memory of at least n bytes (nullptr for n == 0) for work on
  // `stream` and an opaque handle for free(). Throws Error(kOutOfMemory) past
  // capacity. A null stream is a stream of its own whose user orders work itself.
  void* malloc(size_t n, void** handle, const Queue* stream = nullptr);
  void free(void* handle);
  // Frees a handle from any device's allocator (for deleters that only get the handle).
  static void release(void* handle);
  // The stream a handle's block was allocated for.
  static const Queue* stream_of(const void* handle);
  // The block is also used by work on `stream`: when it is freed, it is reused only
  // after `stream` has run everything queued on it by then.
  static void record_stream(void* handle, const Queue* stream);

  bool owns(const void* ptr) const;
  // Returns idle cached segments to the host, after waiting for the queued work that
  // may still use them (from a host thread; an engine thread skips what it cannot wait for).
  void empty_cache();
  AllocatorStats stats() const;
  void reset_accumulated_stats();
  void reset_peak_stats();
  // Also records a kSnapshot trace entry when the trace is on.
  std::vector<SegmentInfo> snapshot();

  void record_history(const HistoryOptions& opts);
  std::vector<TraceEntry> trace() const;  // oldest first

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
  // A point in a queue's order: passed once the queue completed task `seq`.
  struct Fence {
    const Queue* queue = nullptr;
    uint64_t seq = 0;
    bool passed() const;
    void wait() const;
  };
  struct Block {
    size_t size = 0, requested = 0;
    char* ptr = nullptr;
    Segment* seg = nullptr;
    const Queue* stream = nullptr;  // the segment's
    Block *prev = nullptr, *next = nullptr;
    bool allocated = false;
    bool pending_free = false;
    std::vector<const Queue*> stream_uses;  // record_stream()
    std::shared_ptr<AllocContext> context;
  };
  struct Segment {
    char* base = nullptr;
    size_t size = 0;
    bool small = false;
    Block* head = nullptr;
    CachingAllocator* owner = nullptr;
    const Queue* stream = nullptr;
    // The stream's position at the last free of a block here: work queued before it
    // may still use the memory, so the segment is unmapped only after it passed.
    uint64_t fence = 0;
    std::shared_ptr<AllocContext> context;
  };
  struct BlockLess {
    bool operator()(const Block* a, const Block* b) const {
      if (a->stream != b->stream) return std::less<const Queue*>()(a->stream, b->stream);
      return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
    }
  };
  using Pool = std::set<Block*, BlockLess>;
  // A freed block waiting for the other streams that used it.
  struct PendingFree {
    Block* block;
    std::vector<Fence> fences;
  };

  Block* find_free(Pool& pool, const Queue* stream, size_t size);
  // Splitting and coalescing run on every allocation and free of a small tensor: their
  // tree nodes and Block records are recycled instead of going through malloc each time.
  void pool_insert(Pool& pool, Block* b);
  void pool_erase(Pool& pool, Pool::iterator it);
  Block* make_block();
  void drop_block(Block* b);
  Block* new_segment(size_t alloc_size, bool small, size_t requested,
                     const std::shared_ptr<AllocContext>& ctx, const Queue* stream);
  void record_locked(TraceEntry::Action a, uintptr_t addr, size_t size,
                     std::shared_ptr<AllocContext> ctx, size_t device_free = 0);
  std::shared_ptr<AllocContext> capture(bool for_free) const;
  // Frees idle segments whose fence has passed until `needed` fits in `budget`.
  bool release_cached(size_t needed, size_t budget);
  // The fences that idle segments and pending frees wait for, to be waited on unlocked.
  std::vector<Fence> outstanding_fences_locked() const;
  static void wait_fences(const std::vector<Fence>& fences);
  void free_block_locked(Block* b, const std::shared_ptr<AllocContext>& ctx);
  void process_pending_locked();
  void release_segment(Segment* s);
  void update_stats(bool small, StatArray AllocatorStats::*field, int64_t n);
  // The five per-block statistics of an allocation (sign +1) or a free (-1).
  void account_block(bool small, int sign, size_t size, size_t requested);
  size_t effective_capacity() const { return limit_ ? limit_ : capacity_; }

  const int device_;
  const size_t capacity_;
  size_t limit_ = 0;
  double gc_threshold_ = 0;
  mutable std::mutex mu_;
  Pool small_pool_, large_pool_;
  std::vector<Pool::node_type> spare_nodes_;
  std::vector<Block*> spare_blocks_;
  std::vector<PendingFree> pending_;
  std::unordered_map<char*, Segment*> segments_;  // base -> segment
  size_t reserved_ = 0;
  AllocatorStats stats_;
  // History. Contexts are captured before taking mu_ (capturing a Python
  // stack may take the GIL), so these are read without the lock.
  std::atomic<bool> history_on_{false};
  std::atomic<HistoryOptions::Context> context_level_{HistoryOptions::Context::kNone};
  std::atomic<AllocContextFn> capture_fn_{nullptr};
  bool trace_on_ = false;                // guarded by mu_
  size_t trace_max_ = 0;                 // guarded by mu_
  std::vector<TraceEntry> trace_;        // ring buffer, guarded by mu_
  size_t trace_next_ = 0;                // guarded by mu_
};

}  // namespace neuronx::rt
