#include "runtime/caching_allocator.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <sstream>

#include "runtime/error.h"
#include "runtime/queue.h"
#include "runtime/telemetry.h"

namespace neuronx::rt {

namespace {

std::string fmt_bytes(size_t b) {
  std::ostringstream os;
  os.precision(2);
  os << std::fixed;
  if (b >= (size_t{1} << 30)) os << static_cast<double>(b) / (1 << 30) << " GiB";
  else if (b >= (size_t{1} << 20)) os << static_cast<double>(b) / (1 << 20) << " MiB";
  else if (b >= 1024) os << static_cast<double>(b) / 1024 << " KiB";
  else os << b << " bytes";
  return os.str();
}

}  // namespace

bool CachingAllocator::Fence::passed() const { return !queue || queue->completed_seq() >= seq; }

void CachingAllocator::Fence::wait() const {
  if (queue) const_cast<Queue*>(queue)->wait_reached(seq);
}

CachingAllocator::CachingAllocator(int device, size_t capacity)
    : device_(device), capacity_(capacity) {}

CachingAllocator::~CachingAllocator() {
  // Device teardown at process exit: return every segment to the host.
  std::lock_guard<std::mutex> g(mu_);
  for (auto& [base, seg] : segments_) {
    munmap(seg->base, seg->size);
    for (Block* b = seg->head; b;) {
      Block* n = b->next;
      delete b;
      b = n;
    }
    delete seg;
  }
  for (Block* b : spare_blocks_) delete b;
}

size_t CachingAllocator::round_size(size_t n) {
  if (n < kMinBlock) return kMinBlock;
  return kMinBlock * ((n + kMinBlock - 1) / kMinBlock);
}

void CachingAllocator::update_stats(bool small, StatArray AllocatorStats::*field, int64_t n) {
  (stats_.*field)[kAggregate].add(n);
  (stats_.*field)[small ? kSmallPool : kLargePool].add(n);
  if (field != &AllocatorStats::allocated_bytes && field != &AllocatorStats::reserved_bytes) return;
  if (telemetry::CoreCounters* t = telemetry::core(device_)) {
    const Stat& a = stats_.allocated_bytes[kAggregate];
    t->allocated.store(static_cast<uint64_t>(a.current), std::memory_order_relaxed);
    t->peak_allocated.store(static_cast<uint64_t>(a.peak), std::memory_order_relaxed);
    t->reserved.store(static_cast<uint64_t>(stats_.reserved_bytes[kAggregate].current), std::memory_order_relaxed);
  }
}

void CachingAllocator::account_block(bool small, int sign, size_t size, size_t requested) {
  const int t = small ? kSmallPool : kLargePool;
  const int64_t bytes = sign * static_cast<int64_t>(size);
  for (int i : {static_cast<int>(kAggregate), t}) {
    stats_.allocation[i].add(sign);
    stats_.active[i].add(sign);
    stats_.allocated_bytes[i].add(bytes);
    stats_.active_bytes[i].add(bytes);
    stats_.requested_bytes[i].add(sign * static_cast<int64_t>(requested));
  }
  if (telemetry::CoreCounters* c = telemetry::core(device_)) {
    const Stat& a = stats_.allocated_bytes[kAggregate];
    c->allocated.store(static_cast<uint64_t>(a.current), std::memory_order_relaxed);
    c->peak_allocated.store(static_cast<uint64_t>(a.peak), std::memory_order_relaxed);
    c->reserved.store(static_cast<uint64_t>(stats_.reserved_bytes[kAggregate].current), std::memory_order_relaxed);
  }
}

void CachingAllocator::pool_insert(Pool& pool, Block* b) {
  if (spare_nodes_.empty()) {
    pool.insert(b);
    return;
  }
  Pool::node_type n = std::move(spare_nodes_.back());
  spare_nodes_.pop_back();
  n.value() = b;
  pool.insert(std::move(n));
}

void CachingAllocator::pool_erase(Pool& pool, Pool::iterator it) {
  if (spare_nodes_.size() < kSpares) spare_nodes_.push_back(pool.extract(it));
  else pool.erase(it);
}

CachingAllocator::Block* CachingAllocator::make_block() {
  if (spare_blocks_.empty()) return new Block;
  Block* b = spare_blocks_.back();
  spare_blocks_.pop_back();
  *b = Block{};
  return b;
}

void CachingAllocator::drop_block(Block* b) {
  if (spare_blocks_.size() < kSpares) {
    b->context.reset();
    b->stream_uses.clear();
    spare_blocks_.push_back(b);
  } else {
    delete b;
  }
}

CachingAllocator::Block* CachingAllocator::find_free(Pool& pool, const Queue* stream, size_t size) {
  Block key;
  key.stream = stream;
  key.size = size;
  key.ptr = nullptr;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  pool_erase(pool, it);
  return b;
}

std::shared_ptr<AllocContext> CachingAllocator::capture(bool for_free) const {
  if (!history_on_.load(std::memory_order_relaxed)) return nullptr;
  const auto level = context_level_.load(std::memory_order_relaxed);
  if (level == HistoryOptions::Context::kNone || (for_free && level != HistoryOptions::Context::kAll))
    return nullptr;
  AllocContextFn fn = capture_fn_.load(std::memory_order_acquire);
  return fn ? fn() : nullptr;
}

void CachingAllocator::record_locked(TraceEntry::Action a, uintptr_t addr, size_t size,
                                     std::shared_ptr<AllocContext> ctx, size_t device_free) {
  if (!trace_on_ || trace_max_ == 0) return;
  // "state" context keeps stacks only for live blocks, not in the trace.
  if (context_level_.load(std::memory_order_relaxed) == HistoryOptions::Context::kState) ctx.reset();
  const int64_t now = std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  TraceEntry e{a, addr, size, device_free, now, std::move(ctx)};
  if (trace_.size() < trace_max_) {
    trace_.push_back(std::move(e));
  } else {
    trace_[trace_next_] = std::move(e);
    trace_next_ = (trace_next_ + 1) % trace_max_;
  }
}

void CachingAllocator::record_history(const HistoryOptions& o) {
  std::lock_guard<std::mutex> g(mu_);
  if (o.clear || !o.enabled) {
    trace_.clear();
    trace_next_ = 0;
  }
  // Keep the newest entries when the ring shrinks.
  if (o.trace && o.max_entries < trace_.size()) {
    std::vector<TraceEntry> kept;
    const size_t n = trace_.size();
    for (size_t i = n - o.max_entries; i < n; ++i) kept.push_back(std::move(trace_[(trace_next_ + i) % n]));
    trace_ = std::move(kept);
    trace_next_ = 0;
  }
  trace_on_ = o.enabled && o.trace;
  trace_max_ = o.max_entries;
  capture_fn_.store(o.capture, std::memory_order_release);
  context_level_.store(o.enabled ? o.context : HistoryOptions::Context::kNone);
  history_on_.store(o.enabled);
  if (!o.enabled) {
    // Turning history off drops the stacks kept for live blocks too.
    for (auto& [base, seg] : segments_) {
      seg->context.reset();
      for (Block* b = seg->head; b; b = b->next) b->context.reset();
    }
  }
}

std::vector<TraceEntry> CachingAllocator::trace() const {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<TraceEntry> out;
  out.reserve(trace_.size());
  for (size_t i = 0; i < trace_.size(); ++i) out.push_back(trace_[(trace_next_ + i) % trace_.size()]);
  return out;
}

CachingAllocator::Block* CachingAllocator::new_segment(size_t alloc_size, bool small, size_t requested,
                                                       const std::shared_ptr<AllocContext>& ctx, const Queue* stream) {
  if (reserved_ + alloc_size > effective_capacity()) {
    stats_.num_alloc_retries++;
    release_cached(alloc_size, effective_capacity());
    if (reserved_ + alloc_size > effective_capacity()) return nullptr;
  }
  void* mem = mmap(nullptr, alloc_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return nullptr;
  // Huge pages, as HBM is mapped: fewer TLB misses, and far fewer pages for a
  // peer's cross-memory reads and writes to pin (docs/distributed.md). Only a hint.
  if (alloc_size >= (2u << 20)) madvise(mem, alloc_size, MADV_HUGEPAGE);
  auto* seg = new Segment{static_cast<char*>(mem), alloc_size, small, nullptr, this, stream, 0, ctx};
  auto* b = new Block;
  b->size = alloc_size;
  b->ptr = seg->base;
  b->seg = seg;
  b->stream = stream;
  b->requested = requested;
  seg->head = b;
  segments_[seg->base] = seg;
  reserved_ += alloc_size;
  stats_.num_device_alloc++;
  update_stats(small, &AllocatorStats::segment, 1);
  update_stats(small, &AllocatorStats::reserved_bytes, static_cast<int64_t>(alloc_size));
  record_locked(TraceEntry::Action::kSegmentAlloc, reinterpret_cast<uintptr_t>(seg->base), alloc_size, ctx);
  return b;
}

void CachingAllocator::release_segment(Segment* s) {
  Pool& pool = s->small ? small_pool_ : large_pool_;
  pool.erase(s->head);
  update_stats(s->small, &AllocatorStats::segment, -1);
  update_stats(s->small, &AllocatorStats::reserved_bytes, -static_cast<int64_t>(s->size));
  reserved_ -= s->size;
  stats_.num_device_free++;
  record_locked(TraceEntry::Action::kSegmentFree, reinterpret_cast<uintptr_t>(s->base), s->size, nullptr);
  segments_.erase(s->base);
  munmap(s->base, s->size);
  delete s->head;
  delete s;
}

bool CachingAllocator::release_cached(size_t needed, size_t budget) {
  // Free whole unused segments, largest first, until `needed` fits in `budget`.
  std::vector<Segment*> idle;
  for (auto& [base, seg] : segments_)
    if (!seg->head->allocated && seg->head->next == nullptr && Fence{seg->stream, seg->fence}.passed())
      idle.push_back(seg);
  std::sort(idle.begin(), idle.end(), [](Segment* a, Segment* b) { return a->size > b->size; });
  bool freed = false;
  for (Segment* s : idle) {
    if (reserved_ + needed <= budget) break;
    release_segment(s);
    freed = true;
  }
  return freed;
}

std::vector<CachingAllocator::Fence> CachingAllocator::outstanding_fences_locked() const {
  std::vector<Fence> out;
  for (auto& [base, seg] : segments_) {
    const Fence f{seg->stream, seg->fence};
    if (!seg->head->allocated && seg->head->next == nullptr && !f.passed()) out.push_back(f);
  }
  for (const PendingFree& p : pending_)
    for (const Fence& f : p.fences)
      if (!f.passed()) out.push_back(f);
  return out;
}

void CachingAllocator::wait_fences(const std::vector<Fence>& fences) {
  for (const Fence& f : fences) f.wait();
}

void CachingAllocator::process_pending_locked() {
  if (pending_.empty()) return;
  auto done = [](const PendingFree& p) {
    return std::all_of(p.fences.begin(), p.fences.end(), [](const Fence& f) { return f.passed(); });
  };
  std::vector<PendingFree> keep;
  for (PendingFree& p : pending_) {
    if (done(p)) free_block_locked(p.block, nullptr);
    else keep.push_back(std::move(p));
  }
  pending_ = std::move(keep);
}

void* CachingAllocator::malloc(size_t n, void** handle, const Queue* stream) {
  *handle = nullptr;
  if (n == 0) return nullptr;
  std::shared_ptr<AllocContext> ctx = capture(false);
  std::unique_lock<std::mutex> g(mu_);
  process_pending_locked();
  const size_t size = round_size(n);
  const bool small = size <= kSmallSize;
  Pool& pool = small ? small_pool_ : large_pool_;
  Block* b = find_free(pool, stream, size);
  if (!b) {
    size_t seg_size = small ? kSmallBuffer
                            : (size < kMinLargeAlloc ? kLargeBuffer
                                                     : kRoundLarge * ((size + kRoundLarge - 1) / kRoundLarge));
    if (gc_threshold_ > 0) {
      const auto budget = static_cast<size_t>(gc_threshold_ * static_cast<double>(effective_capacity()));
      if (reserved_ + seg_size > budget) release_cached(seg_size, budget);
    }
    b = new_segment(seg_size, small, n, ctx, stream);
    if (!b) {
      // Cached memory that queued work may still use (idle segments before their fence,
      // blocks held for other streams) frees up once that work ran: wait for it unlocked
      // (an engine thread frees blocks into this allocator), then try once more.
      std::vector<Fence> fences = outstanding_fences_locked();
      if (!fences.empty() && !on_engine_thread()) {
        g.unlock();
        wait_fences(fences);
        g.lock();
        process_pending_locked();
        b = find_free(pool, stream, size);
        if (!b) b = new_segment(seg_size, small, n, ctx, stream);
      }
    }
    if (!b) {
      stats_.num_ooms++;
      const size_t cap = effective_capacity();
      const size_t free_bytes = cap > reserved_ ? cap - reserved_ : 0;
      record_locked(TraceEntry::Action::kOom, 0, n, ctx, free_bytes);
      std::ostringstream os;
      os << "neuron out of memory. Tried to allocate " << fmt_bytes(n) << ". neuron:" << device_
         << " has a total capacity of " << fmt_bytes(capacity_);
      if (limit_) os << " (limited to " << fmt_bytes(limit_) << " by the memory fraction)";
      const size_t allocated = static_cast<size_t>(stats_.allocated_bytes[kAggregate].current);
      os << ", of which " << fmt_bytes(free_bytes) << " is free. Of the allocated memory "
         << fmt_bytes(allocated) << " is allocated by PyTorch, and "
         << fmt_bytes(reserved_ > allocated ? reserved_ - allocated : 0)
         << " is reserved by PyTorch but unallocated. "
         << "Free tensors you no longer need (del, then torch.neuron.empty_cache()), use smaller "
            "batches, or raise TORCH_NEURONX_SIM_HBM. See torch.neuron.memory_summary() for details.";
      throw Error(ErrorCode::kOutOfMemory, os.str());
    }
  }
  // Split off the remainder when it is worth keeping.
  const size_t remaining = b->size - size;
  const bool split = small ? remaining >= kMinBlock : remaining > kSmallSize;
  if (split) {
    Block* rest = make_block();
    rest->size = remaining;
    rest->ptr = b->ptr + size;
    rest->seg = b->seg;
    rest->stream = b->stream;
    rest->prev = b;
    rest->next = b->next;
    if (b->next) b->next->prev = rest;
    b->next = rest;
    b->size = size;
    pool_insert(pool, rest);
  }
  b->allocated = true;
  b->requested = n;
  record_locked(TraceEntry::Action::kAlloc, reinterpret_cast<uintptr_t>(b->ptr), b->size, ctx);
  b->context = std::move(ctx);
  account_block(small, 1, b->size, n);
  *handle = b;
  return b->ptr;
}

void CachingAllocator::free(void* handle) {
  if (!handle) return;
  std::shared_ptr<AllocContext> ctx = capture(true);
  std::lock_guard<std::mutex> g(mu_);
  Block* b = static_cast<Block*>(handle);
  b->context.reset();
  if (trace_on_)
    record_locked(TraceEntry::Action::kFreeRequested, reinterpret_cast<uintptr_t>(b->ptr), b->size, ctx);
  if (!b->stream_uses.empty()) {
    // Used on other streams: reusable once each has run what was queued on it by now.
    PendingFree p{b, {}};
    for (const Queue* q : b->stream_uses) p.fences.push_back(Fence{q, q->submitted_seq()});
    b->stream_uses.clear();
    b->pending_free = true;
    pending_.push_back(std::move(p));
    return;
  }
  free_block_locked(b, ctx);
}

void CachingAllocator::free_block_locked(Block* b, const std::shared_ptr<AllocContext>& ctx) {
  const bool small = b->seg->small;
  Pool& pool = small ? small_pool_ : large_pool_;
  b->allocated = false;
  b->pending_free = false;
  // Its stream may still have queued work that uses the block; later work on the same
  // stream may have it at once, but the segment is unmapped only after that work ran.
  if (b->stream) b->seg->fence = std::max(b->seg->fence, b->stream->submitted_seq());
  if (trace_on_)
    record_locked(TraceEntry::Action::kFreeCompleted, reinterpret_cast<uintptr_t>(b->ptr), b->size, ctx);
  account_block(small, -1, b->size, b->requested);
  b->requested = 0;
  // Coalesce with free neighbours.
  for (Block* nb : {b->prev, b->next}) {
    if (!nb || nb->allocated) continue;
    pool_erase(pool, pool.find(nb));
    if (nb == b->prev) {
      nb->size += b->size;
      nb->next = b->next;
      if (b->next) b->next->prev = nb;
      if (b->seg->head == b) b->seg->head = nb;
      drop_block(b);
      b = nb;
    } else {
      b->size += nb->size;
      b->next = nb->next;
      if (nb->next) nb->next->prev = b;
      drop_block(nb);
    }
  }
  pool_insert(pool, b);
}

void CachingAllocator::release(void* handle) {
  if (handle) static_cast<Block*>(handle)->seg->owner->free(handle);
}

const Queue* CachingAllocator::stream_of(const void* handle) {
  return handle ? static_cast<const Block*>(handle)->stream : nullptr;
}

void CachingAllocator::record_stream(void* handle, const Queue* stream) {
  if (!handle) return;
  auto* b = static_cast<Block*>(handle);
  if (stream == b->stream) return;
  std::lock_guard<std::mutex> g(b->seg->owner->mu_);
  if (std::find(b->stream_uses.begin(), b->stream_uses.end(), stream) == b->stream_uses.end())
    b->stream_uses.push_back(stream);
}

bool CachingAllocator::owns(const void* ptr) const {
  std::lock_guard<std::mutex> g(mu_);
  auto p = static_cast<const char*>(ptr);
  for (auto& [base, seg] : segments_)
    if (p >= seg->base && p < seg->base + seg->size) return true;
  return false;
}

void CachingAllocator::empty_cache() {
  std::unique_lock<std::mutex> g(mu_);
  process_pending_locked();
  if (!on_engine_thread()) {
    std::vector<Fence> fences = outstanding_fences_locked();
    if (!fences.empty()) {
      g.unlock();
      wait_fences(fences);
      g.lock();
      process_pending_locked();
    }
  }
  std::vector<Segment*> idle;
  for (auto& [base, seg] : segments_)
    if (!seg->head->allocated && seg->head->next == nullptr && Fence{seg->stream, seg->fence}.passed())
      idle.push_back(seg);
  for (Segment* s : idle) release_segment(s);
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  AllocatorStats s = stats_;
  // inactive_split(_bytes): free blocks in segments that are split.
  for (auto& [base, seg] : segments_) {
    if (seg->head->next == nullptr) continue;
    for (Block* b = seg->head; b; b = b->next) {
      if (b->allocated) continue;
      int t = seg->small ? kSmallPool : kLargePool;
      for (int k : {static_cast<int>(kAggregate), t}) {
        s.inactive_split[k].current += 1;
        s.inactive_split_bytes[k].current += static_cast<int64_t>(b->size);
      }
    }
  }
  for (int k = 0; k < kNumStatTypes; ++k) {
    s.inactive_split[k].peak = std::max(s.inactive_split[k].peak, s.inactive_split[k].current);
    s.inactive_split_bytes[k].peak =
        std::max(s.inactive_split_bytes[k].peak, s.inactive_split_bytes[k].current);
  }
  return s;
}

void CachingAllocator::reset_accumulated_stats() {
  std::lock_guard<std::mutex> g(mu_);
#define NEURONX_RESET(f) for (auto& st : stats_.f) st.reset_accumulated();
  NEURONX_ALLOCATOR_STAT_ARRAYS(NEURONX_RESET)
#undef NEURONX_RESET
#define NEURONX_RESET(f) stats_.f.reset_accumulated();
  NEURONX_ALLOCATOR_STATS(NEURONX_RESET)
#undef NEURONX_RESET
#define NEURONX_RESET(f) stats_.f = 0;
  NEURONX_ALLOCATOR_COUNTERS(NEURONX_RESET)
#undef NEURONX_RESET
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> g(mu_);
#define NEURONX_RESET(f) for (auto& st : stats_.f) st.reset_peak();
  NEURONX_ALLOCATOR_STAT_ARRAYS(NEURONX_RESET)
#undef NEURONX_RESET
#define NEURONX_RESET(f) stats_.f.reset_peak();
  NEURONX_ALLOCATOR_STATS(NEURONX_RESET)
#undef NEURONX_RESET
}

std::vector<SegmentInfo> CachingAllocator::snapshot() {
  std::lock_guard<std::mutex> g(mu_);
  record_locked(TraceEntry::Action::kSnapshot, 0, 0, nullptr);
  std::vector<SegmentInfo> out;
  for (auto& [base, seg] : segments_) {
    SegmentInfo si;
    si.address = reinterpret_cast<uintptr_t>(seg->base);
    si.total_size = seg->size;
    si.stream = seg->stream ? seg->stream->id() : 0;
    si.is_large = !seg->small;
    si.context = seg->context;
    for (Block* b = seg->head; b; b = b->next) {
      si.blocks.push_back({b->size, b->requested, b->allocated, b->pending_free, b->allocated ? b->context : nullptr});
      if (b->allocated) {
        si.allocated_size += b->size;
        si.requested_size += b->requested;
      }
    }
    out.push_back(std::move(si));
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.address < b.address; });
  return out;
}

size_t CachingAllocator::reserved() const {
  std::lock_guard<std::mutex> g(mu_);
  return reserved_;
}

void CachingAllocator::set_limit(size_t bytes) {
  std::lock_guard<std::mutex> g(mu_);
  limit_ = bytes > capacity_ ? capacity_ : bytes;
}

void CachingAllocator::set_gc_threshold(double share) {
  std::lock_guard<std::mutex> g(mu_);
  gc_threshold_ = share;
}

size_t CachingAllocator::limit() const {
  std::lock_guard<std::mutex> g(mu_);
  return limit_;
}

}  // namespace neuronx::rt
