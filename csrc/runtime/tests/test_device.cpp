// Device and the process-wide registry: lazy init, index validation, stream
// ids and priorities, pool streams, device synchronize, bad fork.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <set>
#include <string>

#include "runtime/device.h"
#include "runtime/error.h"
#include "test_util.h"

namespace rt = neuronx::rt;
using namespace neuronx::rt::testing;
using rt::Device;
using rt::ErrorCode;

namespace {

bool default_env() {
  return !std::getenv("TORCH_NEURONX_SIM_CORES") && !std::getenv("NEURON_RT_VISIBLE_CORES") &&
         !std::getenv("TORCH_NEURONX_SIM_HBM");
}

TEST(DeviceStatic, StreamIds) {
  EXPECT_TRUE(Device::valid_stream_id(0));
  EXPECT_TRUE(Device::valid_stream_id(1));
  EXPECT_TRUE(Device::valid_stream_id(64));
  EXPECT_FALSE(Device::valid_stream_id(65));
  EXPECT_FALSE(Device::valid_stream_id(~uint64_t{0}));
  EXPECT_EQ(Device::priority_of(0), 0);
  EXPECT_EQ(Device::priority_of(1), 0);
  EXPECT_EQ(Device::priority_of(32), 0);
  EXPECT_EQ(Device::priority_of(33), -1);
  EXPECT_EQ(Device::priority_of(64), -1);
}

TEST(DeviceStandalone, QueuesAndPoolStreams) {
  Device d(7, 3, 64 << 20);
  EXPECT_EQ(d.index(), 7);
  EXPECT_EQ(d.physical_core(), 3);
  EXPECT_EQ(d.allocator().capacity(), size_t{64} << 20);
  EXPECT_EQ(d.allocator().device(), 7);
  EXPECT_TRUE(d.live_queues().empty()) << "queues are created lazily";

  rt::Queue& q0 = d.default_queue();
  EXPECT_EQ(&q0, &d.queue(0));
  EXPECT_EQ(q0.id(), 0u);
  EXPECT_EQ(q0.device(), 7);
  EXPECT_EQ(q0.priority(), 0);
  EXPECT_EQ(d.queue(33).priority(), -1);
  EXPECT_EQ(d.queue(5).priority(), 0);
  EXPECT_EQ(d.live_queues().size(), 3u);
  EXPECT_RT_ERROR(d.queue(65), ErrorCode::kInvalidArgument, "invalid neuron stream id 65", "neuron:7");

  // Pool streams cycle through 32 ids per level.
  std::set<uint64_t> normal, high;
  const uint64_t first = d.next_pool_stream(0);
  normal.insert(first);
  for (int i = 1; i < 32; ++i) normal.insert(d.next_pool_stream(0));
  EXPECT_EQ(normal.size(), 32u);
  EXPECT_EQ(*normal.begin(), 1u);
  EXPECT_EQ(*normal.rbegin(), 32u);
  EXPECT_EQ(d.next_pool_stream(0), first) << "wraps after kPoolSize";
  for (int i = 0; i < 32; ++i) high.insert(d.next_pool_stream(-1));
  EXPECT_EQ(high.size(), 32u);
  EXPECT_EQ(*high.begin(), 33u);
  EXPECT_EQ(*high.rbegin(), 64u);
  EXPECT_GE(d.next_pool_stream(-7), 33u) << "any negative priority is the high level";
  EXPECT_LE(d.next_pool_stream(5), 32u) << "positive priorities map to normal";
}

TEST(DeviceStandalone, SynchronizeDrainsAllQueuesAndReportsFirstError) {
  std::atomic<int> ran{0};
  {
    Device d(0, 0, 64 << 20);
    d.queue(3).launch(failing("aten::bad", "boom"));
    d.queue(3).launch(fn("skipped", [&] { ran += 100; }));
    for (int i = 0; i < 10; ++i) d.queue(0).launch(fn("ok", [&] { ++ran; }));
    d.queue(40).launch(fn("hp", [&] { ++ran; }));
    EXPECT_RT_ERROR(d.synchronize(), ErrorCode::kKernelFailed, "aten::bad", "boom");
    EXPECT_EQ(ran.load(), 11);
    for (rt::Queue* q : d.live_queues()) EXPECT_TRUE(q->query());
    EXPECT_NO_THROW(d.synchronize()) << "reported once";
    d.queue(3).launch(fn("again", [&] { ++ran; }));
    d.synchronize();
    EXPECT_EQ(ran.load(), 12);
    // Leave queued work behind: destroying the device drains it safely.
    for (int i = 0; i < 20; ++i) d.queue(1 + i % 3).launch(fn("tail", [&] { ++ran; }));
  }
  EXPECT_EQ(ran.load(), 32);
}

TEST(DeviceStandalone, AllocatorUsableFromKernels) {
  Device d(0, 0, 64 << 20);
  void* h = nullptr;
  void* p = d.allocator().malloc(4096, &h);
  ASSERT_NE(p, nullptr);
  d.queue(0).launch(fn("fill", [p] { static_cast<char*>(p)[0] = 7; }));
  d.queue(0).launch(fn("free", [h] { rt::CachingAllocator::release(h); }));
  d.synchronize();
  EXPECT_EQ(d.allocator().stats().allocation[rt::kAggregate].current, 0);
}

// ---------------------------------------------------------------- registry

TEST(Registry, DeviceCountAndConfig) {
  if (!default_env()) GTEST_SKIP() << "device environment variables set";
  EXPECT_EQ(rt::device_count(), 2);
  EXPECT_TRUE(rt::config_error().empty());
  EXPECT_NO_THROW(rt::check_usable());
}

TEST(Registry, LazyInitAndIndices) {
  if (!default_env()) GTEST_SKIP() << "device environment variables set";
  rt::Device& d0 = rt::device(0);
  EXPECT_TRUE(rt::is_initialized());
  EXPECT_EQ(&d0, &rt::device(0)) << "one Device per index";
  EXPECT_EQ(d0.index(), 0);
  EXPECT_EQ(d0.physical_core(), 0);
  EXPECT_EQ(rt::device(1).index(), 1);
  EXPECT_EQ(rt::device(1).physical_core(), 1);
  EXPECT_EQ(d0.allocator().capacity(), rt::config().hbm_bytes);
  EXPECT_RT_ERROR(rt::device(2), ErrorCode::kInvalidArgument, "invalid neuron device index 2",
                  "sees 2 NeuronCore(s)", "NEURON_RT_VISIBLE_CORES");
  EXPECT_RT_ERROR(rt::device(-1), ErrorCode::kInvalidArgument, "invalid neuron device index -1");
  EXPECT_FALSE(rt::in_bad_fork());
}

TEST(Registry, WorkAndErrorsOnGlobalDevice) {
  SKIP_IF_LAUNCH_BLOCKING();
  if (rt::device_count() < 1) GTEST_SKIP() << rt::config_error();
  rt::Device& d = rt::device(0);
  std::atomic<int> ran{0};
  rt::Queue& q = d.queue(d.next_pool_stream(0));
  q.launch(fn("k", [&] { ++ran; }));
  d.default_queue().launch(fn("k", [&] { ++ran; }));
  rt::synchronize_all();
  EXPECT_EQ(ran.load(), 2);

  q.launch(failing("aten::oops", "broken"));
  EXPECT_RT_ERROR(rt::synchronize_all(), ErrorCode::kKernelFailed, "aten::oops");
  EXPECT_NO_THROW(rt::synchronize_all());
  q.launch(fn("k", [&] { ++ran; }));
  d.synchronize();
  EXPECT_EQ(ran.load(), 3);
}

TEST(Registry, ForkedChildGetsBadForkError) {
  if (rt::device_count() < 1) GTEST_SKIP() << rt::config_error();
  rt::device(0);  // initialize in the parent
  ASSERT_TRUE(rt::is_initialized());
  ASSERT_FALSE(rt::in_bad_fork());
  fflush(nullptr);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int rc = 0;
    if (!rt::in_bad_fork()) rc = 10;
    try {
      rt::device(0);
      rc = rc ? rc : 11;
    } catch (const rt::Error& e) {
      if (e.code() != ErrorCode::kBadFork) rc = rc ? rc : 12;
      if (std::string(e.what()).find("spawn") == std::string::npos) rc = rc ? rc : 13;
    } catch (...) {
      rc = rc ? rc : 14;
    }
    try {
      rt::check_usable();
      rc = rc ? rc : 15;
    } catch (const rt::Error& e) {
      if (e.code() != ErrorCode::kBadFork) rc = rc ? rc : 16;
    }
    _exit(rc);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_FALSE(rt::in_bad_fork()) << "the parent is unaffected";
}

}  // namespace
