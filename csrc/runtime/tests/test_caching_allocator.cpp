// CachingAllocator: rounding, small/large pools, caching, split/coalesce,
// empty_cache, capacity/limit errors and statistics.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "runtime/caching_allocator.h"
#include "runtime/error.h"
#include "test_util.h"

namespace rt = neuronx::rt;
using rt::CachingAllocator;
using rt::ErrorCode;

namespace {

constexpr size_t KiB = size_t{1} << 10;
constexpr size_t MiB = size_t{1} << 20;

// malloc/free pairs with the handle kept next to the pointer.
struct Alloc {
  void* ptr = nullptr;
  void* handle = nullptr;
};
Alloc get(CachingAllocator& a, size_t n) {
  Alloc r;
  r.ptr = a.malloc(n, &r.handle);
  return r;
}

TEST(CachingAllocator, RoundSize) {
  EXPECT_EQ(CachingAllocator::round_size(0), 512u);
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(511), 512u);
  EXPECT_EQ(CachingAllocator::round_size(512), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::round_size(1000), 1024u);
  EXPECT_EQ(CachingAllocator::round_size(MiB), MiB);
  EXPECT_EQ(CachingAllocator::round_size(MiB + 1), MiB + 512);
}

TEST(CachingAllocator, ZeroBytesIsNull) {
  CachingAllocator a(0, 64 * MiB);
  void* h = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(a.malloc(0, &h), nullptr);
  EXPECT_EQ(h, nullptr);
  a.free(nullptr);  // no-op
  CachingAllocator::release(nullptr);
  EXPECT_EQ(a.reserved(), 0u);
  EXPECT_EQ(a.stats().num_device_alloc, 0);
}

TEST(CachingAllocator, SmallRequestUsesSmallPool) {
  CachingAllocator a(3, 64 * MiB);
  EXPECT_EQ(a.device(), 3);
  EXPECT_EQ(a.capacity(), 64 * MiB);
  Alloc x = get(a, 1000);
  ASSERT_NE(x.ptr, nullptr);
  ASSERT_NE(x.handle, nullptr);
  std::memset(x.ptr, 0xab, 1000);  // really backed by memory
  EXPECT_TRUE(a.owns(x.ptr));
  EXPECT_TRUE(a.owns(static_cast<char*>(x.ptr) + 999));
  EXPECT_EQ(a.reserved(), 2 * MiB);

  auto s = a.stats();
  EXPECT_EQ(s.allocated_bytes[rt::kSmallPool].current, 1024);
  EXPECT_EQ(s.allocated_bytes[rt::kLargePool].current, 0);
  EXPECT_EQ(s.allocated_bytes[rt::kAggregate].current, 1024);
  EXPECT_EQ(s.requested_bytes[rt::kAggregate].current, 1000);
  EXPECT_EQ(s.reserved_bytes[rt::kSmallPool].current, static_cast<int64_t>(2 * MiB));
  EXPECT_EQ(s.reserved_bytes[rt::kLargePool].current, 0);
  EXPECT_EQ(s.segment[rt::kSmallPool].current, 1);
  EXPECT_EQ(s.segment[rt::kLargePool].current, 0);
  EXPECT_EQ(s.allocation[rt::kAggregate].current, 1);
  EXPECT_EQ(s.active[rt::kSmallPool].current, 1);
  EXPECT_EQ(s.active_bytes[rt::kSmallPool].current, 1024);
  EXPECT_EQ(s.num_device_alloc, 1);

  auto snap = a.snapshot();
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_FALSE(snap[0].is_large);
  EXPECT_EQ(snap[0].total_size, 2 * MiB);
  EXPECT_EQ(snap[0].address, reinterpret_cast<uintptr_t>(x.ptr));
  EXPECT_EQ(snap[0].allocated_size, 1024u);
  EXPECT_EQ(snap[0].requested_size, 1000u);
  ASSERT_EQ(snap[0].blocks.size(), 2u);  // the allocation + the split-off rest
  EXPECT_TRUE(snap[0].blocks[0].allocated);
  EXPECT_EQ(snap[0].blocks[1].size, 2 * MiB - 1024);
  EXPECT_FALSE(snap[0].blocks[1].allocated);
  a.free(x.handle);
}

TEST(CachingAllocator, OneMiBIsSmallOneMiBPlusOneIsLarge) {
  CachingAllocator a(0, 256 * MiB);
  Alloc s = get(a, MiB);
  auto st = a.stats();
  EXPECT_EQ(st.allocated_bytes[rt::kSmallPool].current, static_cast<int64_t>(MiB));
  EXPECT_EQ(st.reserved_bytes[rt::kSmallPool].current, static_cast<int64_t>(2 * MiB));

  Alloc l = get(a, MiB + 1);
  st = a.stats();
  EXPECT_EQ(st.allocated_bytes[rt::kLargePool].current, static_cast<int64_t>(MiB + 512));
  // 1..10 MiB requests get a 20 MiB segment.
  EXPECT_EQ(st.reserved_bytes[rt::kLargePool].current, static_cast<int64_t>(20 * MiB));
  EXPECT_EQ(st.segment[rt::kLargePool].current, 1);
  EXPECT_EQ(a.reserved(), 22 * MiB);
  a.free(s.handle);
  a.free(l.handle);
}

TEST(CachingAllocator, LargeSegmentSizes) {
  CachingAllocator a(0, 256 * MiB);
  // >= 10 MiB: rounded up to 2 MiB (12 MiB + 512 -> 14 MiB).
  Alloc x = get(a, 12 * MiB + 1);
  EXPECT_EQ(a.reserved(), 14 * MiB);
  auto snap = a.snapshot();
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_TRUE(snap[0].is_large);
  EXPECT_EQ(snap[0].total_size, 14 * MiB);
  // Remainder 2 MiB - 512 > 1 MiB: split.
  ASSERT_EQ(snap[0].blocks.size(), 2u);
  EXPECT_EQ(snap[0].blocks[0].size, 12 * MiB + 512);

  // 19 MiB -> 20 MiB segment; the 1 MiB remainder is not worth a split in
  // the large pool, so the whole segment is the block.
  Alloc y = get(a, 19 * MiB);
  EXPECT_EQ(a.reserved(), 34 * MiB);
  EXPECT_EQ(a.stats().allocated_bytes[rt::kLargePool].current,
            static_cast<int64_t>(12 * MiB + 512 + 20 * MiB));
  EXPECT_EQ(a.stats().requested_bytes[rt::kLargePool].current,
            static_cast<int64_t>(12 * MiB + 1 + 19 * MiB));
  a.free(x.handle);
  a.free(y.handle);
  EXPECT_EQ(a.stats().allocated_bytes[rt::kAggregate].current, 0);
  EXPECT_EQ(a.stats().requested_bytes[rt::kAggregate].current, 0);
}

TEST(CachingAllocator, FreedBlockIsReusedWithoutGrowing) {
  CachingAllocator a(0, 64 * MiB);
  Alloc x = get(a, 4096);
  const size_t reserved = a.reserved();
  a.free(x.handle);
  EXPECT_EQ(a.reserved(), reserved) << "free caches, it does not release";
  EXPECT_TRUE(a.owns(x.ptr));
  Alloc y = get(a, 4096);
  EXPECT_EQ(y.ptr, x.ptr);
  EXPECT_EQ(a.reserved(), reserved);
  EXPECT_EQ(a.stats().num_device_alloc, 1);

  // Same for the large pool.
  Alloc l1 = get(a, 5 * MiB);
  const size_t reserved2 = a.reserved();
  a.free(l1.handle);
  Alloc l2 = get(a, 5 * MiB);
  EXPECT_EQ(l2.ptr, l1.ptr);
  EXPECT_EQ(a.reserved(), reserved2);
  EXPECT_EQ(a.stats().num_device_alloc, 2);
  a.free(y.handle);
  a.free(l2.handle);
}

TEST(CachingAllocator, PoolsAreSeparate) {
  CachingAllocator a(0, 64 * MiB);
  Alloc l = get(a, 3 * MiB);
  a.free(l.handle);
  // A cached 20 MiB large block does not serve a small request.
  Alloc s = get(a, 4096);
  EXPECT_EQ(a.reserved(), 22 * MiB);
  EXPECT_EQ(a.stats().segment[rt::kSmallPool].current, 1);
  a.free(s.handle);
}

TEST(CachingAllocator, SplitAndCoalesce) {
  CachingAllocator a(0, 64 * MiB);
  Alloc x = get(a, 4096), y = get(a, 4096), z = get(a, 4096);
  // Carved from one segment, back to back.
  EXPECT_EQ(static_cast<char*>(y.ptr), static_cast<char*>(x.ptr) + 4096);
  EXPECT_EQ(static_cast<char*>(z.ptr), static_cast<char*>(y.ptr) + 4096);
  EXPECT_EQ(a.stats().segment[rt::kAggregate].current, 1);
  {
    auto snap = a.snapshot();
    ASSERT_EQ(snap.size(), 1u);
    ASSERT_EQ(snap[0].blocks.size(), 4u);
    EXPECT_EQ(snap[0].allocated_size, 3 * 4096u);
    EXPECT_EQ(snap[0].blocks[3].size, 2 * MiB - 3 * 4096);
  }

  a.free(y.handle);  // hole in the middle: nothing to merge with
  {
    auto snap = a.snapshot();
    ASSERT_EQ(snap[0].blocks.size(), 4u);
    EXPECT_FALSE(snap[0].blocks[1].allocated);
    auto st = a.stats();
    EXPECT_EQ(st.inactive_split[rt::kAggregate].current, 2);  // the hole and the tail
    EXPECT_EQ(st.inactive_split_bytes[rt::kAggregate].current,
              static_cast<int64_t>(4096 + 2 * MiB - 3 * 4096));
  }

  a.free(x.handle);  // merges with the hole after it
  {
    auto snap = a.snapshot();
    ASSERT_EQ(snap[0].blocks.size(), 3u);
    EXPECT_EQ(snap[0].blocks[0].size, 8192u);
    EXPECT_FALSE(snap[0].blocks[0].allocated);
    EXPECT_TRUE(snap[0].blocks[1].allocated);
  }

  // An 8 KiB request now fits the merged hole exactly (best fit).
  Alloc w = get(a, 8192);
  EXPECT_EQ(w.ptr, x.ptr);
  a.free(w.handle);

  a.free(z.handle);  // merges with both neighbours: one free block again
  {
    auto snap = a.snapshot();
    ASSERT_EQ(snap.size(), 1u);
    ASSERT_EQ(snap[0].blocks.size(), 1u);
    EXPECT_EQ(snap[0].blocks[0].size, 2 * MiB);
    EXPECT_FALSE(snap[0].blocks[0].allocated);
    EXPECT_EQ(snap[0].allocated_size, 0u);
    auto st = a.stats();
    EXPECT_EQ(st.inactive_split[rt::kAggregate].current, 0);
    EXPECT_EQ(st.allocation[rt::kAggregate].current, 0);
    EXPECT_EQ(st.active_bytes[rt::kAggregate].current, 0);
  }
  // The whole segment can now be handed out in one piece.
  Alloc big = get(a, MiB);
  EXPECT_EQ(big.ptr, x.ptr);
  EXPECT_EQ(a.stats().num_device_alloc, 1);
  a.free(big.handle);
}

// Splits and merges reuse their tree nodes and Block records: thousands of mixed-size
// allocations and frees in a shuffled order must leave each segment one free block.
TEST(CachingAllocator, RecycledRecordsKeepSplitAndCoalesceExact) {
  CachingAllocator a(0, 256 * MiB);
  std::vector<Alloc> live;
  uint64_t seed = 12345;
  auto next = [&] { return seed = seed * 6364136223846793005ULL + 1442695040888963407ULL; };
  size_t requested = 0;
  for (int i = 0; i < 20000; ++i) {
    if (live.empty() || (live.size() < 300 && next() % 2 == 0)) {
      const size_t n = 1 + (next() >> 33) % (i % 7 == 0 ? 3 * MiB : 64 * KiB);
      live.push_back(get(a, n));
      std::memset(live.back().ptr, i & 0xff, n < 64 ? n : 64);  // the memory is really ours
      requested += n;
    } else {
      const size_t k = (next() >> 33) % live.size();
      a.free(live[k].handle);
      live[k] = live.back();
      live.pop_back();
    }
  }
  EXPECT_GT(requested, 100 * MiB);
  for (const Alloc& x : live) a.free(x.handle);
  const auto st = a.stats();
  EXPECT_EQ(st.allocation[rt::kAggregate].current, 0);
  EXPECT_EQ(st.active_bytes[rt::kAggregate].current, 0);
  EXPECT_EQ(st.requested_bytes[rt::kAggregate].current, 0);
  EXPECT_EQ(st.allocated_bytes[rt::kSmallPool].current + st.allocated_bytes[rt::kLargePool].current, 0);
  EXPECT_EQ(st.inactive_split[rt::kAggregate].current, 0);
  for (const auto& seg : a.snapshot()) {
    ASSERT_EQ(seg.blocks.size(), 1u);
    EXPECT_FALSE(seg.blocks[0].allocated);
    EXPECT_EQ(seg.blocks[0].size, seg.total_size);
  }
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes[rt::kAggregate].current, 0);
}

TEST(CachingAllocator, EmptyCacheReleasesOnlyIdleSegments) {
  CachingAllocator a(0, 64 * MiB);
  Alloc s1 = get(a, 4096);           // small segment, stays live
  Alloc l1 = get(a, 3 * MiB);        // large segment, freed below
  Alloc l2 = get(a, 12 * MiB);       // carved from the rest of l1's 20 MiB segment
  EXPECT_EQ(a.reserved(), 22 * MiB);
  a.free(l1.handle);
  a.free(l2.handle);
  EXPECT_EQ(a.reserved(), 22 * MiB);

  a.empty_cache();
  EXPECT_EQ(a.reserved(), 2 * MiB);
  EXPECT_FALSE(a.owns(l1.ptr));
  EXPECT_TRUE(a.owns(s1.ptr));
  auto st = a.stats();
  EXPECT_EQ(st.num_device_free, 1);
  EXPECT_EQ(st.segment[rt::kLargePool].current, 0);
  EXPECT_EQ(st.reserved_bytes[rt::kLargePool].current, 0);
  EXPECT_EQ(st.reserved_bytes[rt::kSmallPool].current, static_cast<int64_t>(2 * MiB));

  // A partly used small segment is not idle.
  Alloc s2 = get(a, 4096);
  a.free(s2.handle);
  a.empty_cache();
  EXPECT_EQ(a.reserved(), 2 * MiB);

  a.free(s1.handle);
  a.empty_cache();
  EXPECT_EQ(a.reserved(), 0u);
  EXPECT_TRUE(a.snapshot().empty());
  EXPECT_EQ(a.stats().num_device_free, 2);
  EXPECT_EQ(a.stats().segment[rt::kAggregate].current, 0);

  // And it still allocates afterwards.
  Alloc s3 = get(a, 4096);
  EXPECT_NE(s3.ptr, nullptr);
  EXPECT_EQ(a.reserved(), 2 * MiB);
  a.free(s3.handle);
}

TEST(CachingAllocator, OutOfMemoryMessageAndRecovery) {
  CachingAllocator a(3, 64 * MiB);
  Alloc x = get(a, 40 * MiB);
  ASSERT_NE(x.ptr, nullptr);
  EXPECT_RT_ERROR(get(a, 30 * MiB), ErrorCode::kOutOfMemory,
                  "Tried to allocate 30.00 MiB", "neuron:3", "total capacity of 64.00 MiB",
                  "24.00 MiB is free", "40.00 MiB is allocated",
                  "0 bytes is reserved by PyTorch but unallocated");
  auto st = a.stats();
  EXPECT_EQ(st.num_ooms, 1);
  EXPECT_EQ(st.num_alloc_retries, 1);
  EXPECT_EQ(a.reserved(), 40 * MiB) << "a failed allocation reserves nothing";
  EXPECT_EQ(st.allocation[rt::kAggregate].current, 1);

  // After freeing, the next allocation succeeds: here it even needs a new
  // 50 MiB segment, which only fits once the cached 40 MiB one is released.
  a.free(x.handle);
  Alloc y;
  ASSERT_NO_THROW(y = get(a, 50 * MiB));
  ASSERT_NE(y.ptr, nullptr);
  EXPECT_EQ(a.reserved(), 50 * MiB);
  st = a.stats();
  EXPECT_EQ(st.num_device_free, 1);
  EXPECT_EQ(st.num_device_alloc, 2);
  EXPECT_EQ(st.num_ooms, 1);
  a.free(y.handle);
}

TEST(CachingAllocator, ExceedingCapacityReleasesCachedSegmentsFirst) {
  CachingAllocator a(0, 32 * MiB);
  Alloc s = get(a, 4096);
  a.free(s.handle);  // 2 MiB small segment cached
  Alloc l = get(a, 30 * MiB);  // 2 + 30 = 32: fits exactly
  EXPECT_EQ(a.reserved(), 32 * MiB);
  a.free(l.handle);
  // 32 MiB cached; a 4 MiB request would need a 20 MiB segment: the cached
  // 30 MiB block serves it instead (best fit in the large pool).
  Alloc m = get(a, 4 * MiB);
  EXPECT_EQ(m.ptr, l.ptr);
  a.free(m.handle);
  // A small request reuses the cached small segment.
  Alloc s2 = get(a, 4096);
  EXPECT_EQ(s2.ptr, s.ptr);
  a.free(s2.handle);
  // 31 MiB -> 32 MiB segment: needs both cached segments released.
  Alloc big = get(a, 31 * MiB);
  EXPECT_EQ(a.reserved(), 32 * MiB);
  EXPECT_EQ(a.stats().num_device_free, 2);
  EXPECT_EQ(a.stats().num_ooms, 0);
  a.free(big.handle);
}

TEST(CachingAllocator, RequestLargerThanCapacity) {
  CachingAllocator a(1, 16 * MiB);
  EXPECT_RT_ERROR(get(a, 17 * MiB), ErrorCode::kOutOfMemory, "Tried to allocate 17.00 MiB",
                  "neuron:1", "16.00 MiB is free");
  EXPECT_EQ(a.reserved(), 0u);
  // A 1..10 MiB request needs a 20 MiB segment, more than this core has.
  EXPECT_RT_ERROR(get(a, 2 * MiB), ErrorCode::kOutOfMemory, "Tried to allocate 2.00 MiB");
  // Small requests still work.
  Alloc s = get(a, 100 * KiB);
  EXPECT_NE(s.ptr, nullptr);
  EXPECT_EQ(a.stats().num_ooms, 2);
  a.free(s.handle);
}

TEST(CachingAllocator, StatsPeakAndReset) {
  CachingAllocator a(0, 64 * MiB);
  Alloc x = get(a, 512 * KiB), y = get(a, 256 * KiB);
  a.free(x.handle);
  Alloc z = get(a, 128 * KiB);
  auto st = a.stats();
  EXPECT_EQ(st.allocated_bytes[rt::kAggregate].current, static_cast<int64_t>(384 * KiB));
  EXPECT_EQ(st.allocated_bytes[rt::kAggregate].peak, static_cast<int64_t>(768 * KiB));
  EXPECT_EQ(st.allocated_bytes[rt::kAggregate].allocated, static_cast<int64_t>(896 * KiB));
  EXPECT_EQ(st.allocated_bytes[rt::kAggregate].freed, static_cast<int64_t>(512 * KiB));
  EXPECT_EQ(st.allocation[rt::kAggregate].peak, 2);
  EXPECT_EQ(st.allocation[rt::kAggregate].allocated, 3);
  EXPECT_EQ(st.allocation[rt::kAggregate].freed, 1);
  EXPECT_EQ(st.reserved_bytes[rt::kAggregate].peak, static_cast<int64_t>(2 * MiB));

  a.reset_peak_stats();
  st = a.stats();
  EXPECT_EQ(st.allocated_bytes[rt::kAggregate].peak, static_cast<int64_t>(384 * KiB));
  EXPECT_EQ(st.allocation[rt::kAggregate].peak, 2);
  EXPECT_EQ(st.allocated_bytes[rt::kAggregate].allocated, static_cast<int64_t>(896 * KiB))
      << "reset_peak_stats keeps accumulated counters";

  a.reset_accumulated_stats();
  st = a.stats();
  EXPECT_EQ(st.allocated_bytes[rt::kAggregate].allocated, 0);
  EXPECT_EQ(st.allocated_bytes[rt::kAggregate].freed, 0);
  EXPECT_EQ(st.num_device_alloc, 0);
  EXPECT_EQ(st.allocated_bytes[rt::kAggregate].current, static_cast<int64_t>(384 * KiB))
      << "current values survive resets";

  a.free(y.handle);
  a.free(z.handle);
  st = a.stats();
  EXPECT_EQ(st.allocated_bytes[rt::kAggregate].current, 0);
  EXPECT_EQ(st.allocated_bytes[rt::kAggregate].peak, static_cast<int64_t>(384 * KiB));
  EXPECT_EQ(st.allocated_bytes[rt::kAggregate].freed, static_cast<int64_t>(384 * KiB));
  a.reset_peak_stats();
  EXPECT_EQ(a.stats().allocated_bytes[rt::kAggregate].peak, 0);
  EXPECT_EQ(a.stats().reserved_bytes[rt::kAggregate].peak, static_cast<int64_t>(2 * MiB));
}

TEST(CachingAllocator, SetLimit) {
  CachingAllocator a(2, 64 * MiB);
  EXPECT_EQ(a.limit(), 0u);
  a.set_limit(32 * MiB);
  EXPECT_EQ(a.limit(), 32 * MiB);
  EXPECT_EQ(a.capacity(), 64 * MiB);
  EXPECT_RT_ERROR(get(a, 40 * MiB), ErrorCode::kOutOfMemory, "Tried to allocate 40.00 MiB",
                  "total capacity of 64.00 MiB", "limited to 32.00 MiB", "32.00 MiB is free");
  Alloc x = get(a, 30 * MiB);
  EXPECT_NE(x.ptr, nullptr);
  EXPECT_RT_ERROR(get(a, 12 * MiB), ErrorCode::kOutOfMemory, "2.00 MiB is free");
  a.set_limit(0);  // no cap
  EXPECT_EQ(a.limit(), 0u);
  Alloc y = get(a, 12 * MiB);
  EXPECT_NE(y.ptr, nullptr);
  a.set_limit(size_t{1} << 40);  // above capacity: clamped
  EXPECT_EQ(a.limit(), 64 * MiB);
  a.free(x.handle);
  a.free(y.handle);
}

TEST(CachingAllocator, ReleaseFindsOwner) {
  CachingAllocator a(0, 64 * MiB), b(1, 64 * MiB);
  Alloc x = get(a, 4096), y = get(b, 4096);
  EXPECT_TRUE(a.owns(x.ptr));
  EXPECT_FALSE(a.owns(y.ptr));
  EXPECT_TRUE(b.owns(y.ptr));
  CachingAllocator::release(y.handle);
  CachingAllocator::release(x.handle);
  EXPECT_EQ(a.stats().allocation[rt::kAggregate].current, 0);
  EXPECT_EQ(b.stats().allocation[rt::kAggregate].current, 0);
  EXPECT_EQ(a.stats().allocation[rt::kAggregate].freed, 1);
  EXPECT_EQ(b.stats().allocation[rt::kAggregate].freed, 1);
}

TEST(CachingAllocator, ConcurrentMallocFree) {
  CachingAllocator a(0, 256 * MiB);
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      std::vector<Alloc> live;
      for (int i = 0; i < 500; ++i) {
        live.push_back(get(a, 512 * static_cast<size_t>(1 + (i + t) % 64)));
        std::memset(live.back().ptr, t, 512);
        if (live.size() > 8) {
          a.free(live.front().handle);
          live.erase(live.begin());
        }
      }
      for (auto& l : live) a.free(l.handle);
    });
  for (auto& t : ts) t.join();
  auto st = a.stats();
  EXPECT_EQ(st.allocation[rt::kAggregate].current, 0);
  EXPECT_EQ(st.allocated_bytes[rt::kAggregate].current, 0);
  EXPECT_EQ(st.allocation[rt::kAggregate].allocated, 2000);
  a.empty_cache();
  EXPECT_EQ(a.reserved(), 0u);
}

}  // namespace

TEST(CachingAllocator, GarbageCollectionThresholdFreesIdleSegmentsBeforeGrowing) {
  // 100 MiB device, collect above 50%: two idle 12 MiB segments are cached, and a 30 MiB
  // request would take reserved memory to 54 MiB; idle segments are released until the new
  // one fits under 50 MiB (one is enough).
  for (double threshold : {0.0, 0.5}) {
    CachingAllocator a(0, 100 * MiB);
    if (threshold > 0) a.set_gc_threshold(threshold);
    void *h1, *h2, *h3;
    a.malloc(12 * MiB, &h1);
    a.malloc(12 * MiB, &h2);
    a.free(h1);
    a.free(h2);
    ASSERT_EQ(a.reserved(), 24 * MiB);  // cached, not returned
    a.malloc(30 * MiB, &h3);            // no idle block fits: a new segment
    if (threshold > 0) {
      EXPECT_EQ(a.reserved(), 42 * MiB);  // one idle 12 MiB segment released first
    } else {
      EXPECT_EQ(a.reserved(), 54 * MiB);
    }
    a.free(h3);
  }
}

namespace {
struct TagContext : rt::AllocContext {
  explicit TagContext(int t) : tag(t) {}
  int tag;
};
int g_next_tag = 0;
std::shared_ptr<rt::AllocContext> tag_capture() { return std::make_shared<TagContext>(++g_next_tag); }
int tag_of(const std::shared_ptr<rt::AllocContext>& c) {
  return c ? static_cast<const TagContext&>(*c).tag : 0;
}
using Action = rt::TraceEntry::Action;
}  // namespace

TEST(CachingAllocator, HistoryRecordsActionsAndContexts) {
  CachingAllocator a(0, 64 * MiB);
  rt::HistoryOptions o;
  o.enabled = o.trace = true;
  o.context = rt::HistoryOptions::Context::kAll;
  o.max_entries = 100;
  o.capture = &tag_capture;
  g_next_tag = 0;
  a.record_history(o);
  void* h = nullptr;
  void* p = a.malloc(1000, &h);
  auto segs = a.snapshot();
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_EQ(tag_of(segs[0].context), 1);
  ASSERT_GE(segs[0].blocks.size(), 1u);
  EXPECT_EQ(tag_of(segs[0].blocks[0].context), 1);  // the live block keeps its stack
  a.free(h);
  a.empty_cache();
  EXPECT_THROW(a.malloc(128 * MiB, &h), rt::Error);
  const auto t = a.trace();
  std::vector<Action> actions;
  for (const auto& e : t) actions.push_back(e.action);
  EXPECT_EQ(actions, (std::vector<Action>{Action::kSegmentAlloc, Action::kAlloc, Action::kSnapshot,
                                          Action::kFreeRequested, Action::kFreeCompleted,
                                          Action::kSegmentFree, Action::kOom}));
  EXPECT_EQ(t[1].addr, reinterpret_cast<uintptr_t>(p));
  EXPECT_EQ(t[1].size, 1024u);
  EXPECT_EQ(tag_of(t[3].context), 2);   // "all" captures frees too
  EXPECT_EQ(t[6].size, 128 * MiB);
  EXPECT_EQ(t[6].device_free, 64 * MiB);
  EXPECT_GT(t[0].time_us, 0);
}

TEST(CachingAllocator, HistoryRingKeepsNewestAndOffDropsStacks) {
  CachingAllocator a(0, 64 * MiB);
  rt::HistoryOptions o;
  o.enabled = o.trace = true;
  o.context = rt::HistoryOptions::Context::kAlloc;
  o.max_entries = 3;
  o.capture = &tag_capture;
  g_next_tag = 0;
  a.record_history(o);
  std::vector<void*> hs(4);
  for (auto& h : hs) a.malloc(4096, &h);
  auto t = a.trace();
  ASSERT_EQ(t.size(), 3u);  // segment_alloc + 4 allocs, newest 3 kept in order
  for (int i = 0; i < 3; ++i) EXPECT_EQ(t[i].action, Action::kAlloc);
  EXPECT_EQ(tag_of(t[0].context), 2);
  EXPECT_EQ(tag_of(t[2].context), 4);
  a.free(hs[0]);  // "alloc" context: frees carry no stack
  t = a.trace();
  EXPECT_EQ(t.back().action, Action::kFreeCompleted);
  EXPECT_EQ(tag_of(t.back().context), 0);
  rt::HistoryOptions off;
  a.record_history(off);
  EXPECT_TRUE(a.trace().empty());
  for (const auto& s : a.snapshot())
    for (const auto& b : s.blocks) EXPECT_EQ(b.context, nullptr);
  for (size_t i = 1; i < hs.size(); ++i) a.free(hs[i]);
  EXPECT_TRUE(a.trace().empty());
}
