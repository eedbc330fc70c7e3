// HostAllocator (pinned host memory): size classes, caching, is_pinned for
// interior pointers, empty_cache and statistics. The allocator is a process
// singleton, so every check is made on differences.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "runtime/host_allocator.h"

namespace rt = neuronx::rt;

namespace {

rt::HostAllocator& host() { return rt::HostAllocator::instance(); }

TEST(HostAllocator, SingletonAndZeroBytes) {
  EXPECT_EQ(&rt::HostAllocator::instance(), &host());
  EXPECT_EQ(host().malloc(0), nullptr);
  host().free(nullptr);  // no-op
}

TEST(HostAllocator, SizeClassesInStats) {
  host().empty_cache();
  const auto before = host().stats();
  void* a = host().malloc(100);     // 4 KiB class
  void* b = host().malloc(5000);    // 8 KiB class
  void* c = host().malloc(65536);   // exactly 64 KiB
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_NE(c, nullptr);
  std::memset(a, 1, 100);
  std::memset(b, 2, 5000);
  std::memset(c, 3, 65536);
  auto s = host().stats();
  EXPECT_EQ(s.allocations - before.allocations, 3);
  EXPECT_EQ(s.allocated_bytes - before.allocated_bytes, 4096 + 8192 + 65536);
  EXPECT_EQ(s.reserved_bytes - before.reserved_bytes, 4096 + 8192 + 65536);
  EXPECT_EQ(s.num_host_alloc - before.num_host_alloc, 3);
  host().free(a);
  host().free(b);
  host().free(c);
  s = host().stats();
  EXPECT_EQ(s.allocations, before.allocations);
  EXPECT_EQ(s.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(s.reserved_bytes - before.reserved_bytes, 4096 + 8192 + 65536) << "freed blocks are cached";
  host().empty_cache();
  s = host().stats();
  EXPECT_EQ(s.reserved_bytes, before.reserved_bytes);
  EXPECT_EQ(s.num_host_free - before.num_host_free, 3);
}

TEST(HostAllocator, IsPinnedForInteriorPointers) {
  void* p = host().malloc(10000);  // 16 KiB class
  ASSERT_NE(p, nullptr);
  auto* c = static_cast<char*>(p);
  EXPECT_TRUE(host().is_pinned(c));
  EXPECT_TRUE(host().is_pinned(c + 1));
  EXPECT_TRUE(host().is_pinned(c + 9999));
  EXPECT_TRUE(host().is_pinned(c + 16383));  // still inside the 16 KiB block

  int on_stack = 0;
  auto on_heap = std::make_unique<char[]>(64);
  EXPECT_FALSE(host().is_pinned(&on_stack));
  EXPECT_FALSE(host().is_pinned(on_heap.get()));
  EXPECT_FALSE(host().is_pinned(nullptr));

  host().free(p);
  EXPECT_TRUE(host().is_pinned(c + 100)) << "a cached block is still pinned memory";
  host().empty_cache();
  EXPECT_FALSE(host().is_pinned(c));
  EXPECT_FALSE(host().is_pinned(c + 100));
}

TEST(HostAllocator, FreedBlocksAreReusedBySizeClass) {
  host().empty_cache();
  const auto before = host().stats();
  void* p = host().malloc(5000);  // 8 KiB class
  host().free(p);
  void* q = host().malloc(8192);  // same class: the cached block
  EXPECT_EQ(q, p);
  EXPECT_EQ(host().stats().num_host_alloc - before.num_host_alloc, 1);
  void* r = host().malloc(8193);  // next class: a new block
  EXPECT_NE(r, p);
  EXPECT_EQ(host().stats().num_host_alloc - before.num_host_alloc, 2);
  EXPECT_EQ(host().stats().reserved_bytes - before.reserved_bytes, 8192 + 16384);
  host().free(q);
  host().free(r);
  host().empty_cache();
  EXPECT_EQ(host().stats().reserved_bytes, before.reserved_bytes);
}

TEST(HostAllocator, UnknownPointerFreeIsIgnored) {
  const auto before = host().stats();
  int x = 0;
  host().free(&x);
  void* p = host().malloc(4096);
  host().free(static_cast<char*>(p) + 8);  // interior pointer: not a block base
  EXPECT_EQ(host().stats().allocations - before.allocations, 1);
  host().free(p);
  host().free(p);  // double free is ignored, not double-cached
  EXPECT_EQ(host().stats().allocations, before.allocations);
  void* a = host().malloc(4096);
  void* b = host().malloc(4096);
  EXPECT_NE(a, b) << "a double free must not hand the same block out twice";
  host().free(a);
  host().free(b);
}

TEST(HostAllocator, PeakAndAccumulatedStats) {
  host().empty_cache();
  host().reset_peak_stats();
  host().reset_accumulated_stats();
  const auto base = host().stats();
  EXPECT_EQ(base.peak_allocated_bytes, base.allocated_bytes);
  EXPECT_EQ(base.num_host_alloc, 0);
  EXPECT_EQ(base.num_host_free, 0);

  void* a = host().malloc(1 << 20);
  void* b = host().malloc(1 << 20);
  host().free(a);
  auto s = host().stats();
  EXPECT_EQ(s.peak_allocated_bytes - base.allocated_bytes, 2 << 20);
  EXPECT_EQ(s.allocated_bytes - base.allocated_bytes, 1 << 20);
  EXPECT_EQ(s.num_host_alloc, 2);
  host().reset_peak_stats();
  EXPECT_EQ(host().stats().peak_allocated_bytes - base.allocated_bytes, 1 << 20);
  host().free(b);
  host().empty_cache();
  EXPECT_EQ(host().stats().num_host_free, 2);
  host().reset_accumulated_stats();
  EXPECT_EQ(host().stats().num_host_alloc, 0);
  EXPECT_EQ(host().stats().num_host_free, 0);
}

TEST(HostAllocator, ConcurrentUse) {
  const auto before = host().stats();
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([t] {
      for (int i = 0; i < 200; ++i) {
        size_t n = 1000 + static_cast<size_t>((i * 7 + t) % 20000);
        void* p = host().malloc(n);
        std::memset(p, t, n);
        EXPECT_TRUE(host().is_pinned(static_cast<char*>(p) + n - 1));
        host().free(p);
      }
    });
  for (auto& t : ts) t.join();
  auto s = host().stats();
  EXPECT_EQ(s.allocations, before.allocations);
  EXPECT_EQ(s.allocated_bytes, before.allocated_bytes);
}

}  // namespace
