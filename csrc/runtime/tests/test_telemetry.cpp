// Telemetry: the per-process shared-memory segment that neuron-ls/neuron-top
// read: created at device init, counters follow the allocator and the
// engine, removed at exit and not by a forked child.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/device.h"
#include "runtime/telemetry.h"
#include "test_util.h"

namespace rt = neuronx::rt;
namespace telem = neuronx::rt::telemetry;
using namespace neuronx::rt::testing;

namespace {

bool segment_exists(pid_t pid) {
  const int fd = shm_open(telem::segment_name(pid).c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

}  // namespace

TEST(Telemetry, DeviceInitPublishesCountersThatFollowTheDevice) {
  if (std::getenv("TORCH_NEURONX_TELEMETRY")) GTEST_SKIP() << "telemetry configured by the environment";
  rt::Device& d = rt::device(0);
  ASSERT_TRUE(segment_exists(getpid()));
  const int fd = shm_open(telem::segment_name(getpid()).c_str(), O_RDONLY, 0);
  ASSERT_GE(fd, 0);
  void* p = mmap(nullptr, sizeof(telem::Segment), PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(p, MAP_FAILED);
  const auto* seg = static_cast<const telem::Segment*>(p);
  EXPECT_EQ(seg->magic, telem::kMagic);
  EXPECT_EQ(seg->version, telem::kVersion);
  EXPECT_EQ(seg->pid, getpid());
  EXPECT_EQ(seg->num_cores, static_cast<uint32_t>(rt::device_count()));
  EXPECT_NE(std::string(seg->command).find("runtime_tests"), std::string::npos);
  const telem::CoreCounters& c = seg->cores[0];
  EXPECT_EQ(c.physical_core.load(), d.physical_core());
  EXPECT_EQ(c.capacity.load(), d.allocator().capacity());
  EXPECT_EQ(seg->cores[rt::device_count()].physical_core.load(), -1);

  void* h = nullptr;
  d.allocator().malloc(3 << 20, &h);
  EXPECT_EQ(c.allocated.load(), 3u << 20);
  EXPECT_GE(c.reserved.load(), 3u << 20);
  const uint64_t kernels = c.kernels.load();
  for (int i = 0; i < 10; ++i)
    d.default_queue().launch(fn("spin", [] { std::this_thread::sleep_for(1ms); }));
  d.synchronize();
  EXPECT_EQ(c.kernels.load(), kernels + 10);
  EXPECT_GE(c.busy_ns.load(), 10u * 1000000);
  EXPECT_EQ(c.submitted.load(), c.started.load());  // nothing queued
  EXPECT_GT(c.submitted.load(), 0u);
  d.allocator().free(h);
  EXPECT_EQ(c.allocated.load(), 0u);
  EXPECT_EQ(c.peak_allocated.load(), 3u << 20);

  // A forked child exiting leaves the parent's segment in place.
  const pid_t child = fork();
  if (child == 0) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(segment_exists(getpid()));
  telem::unpublish();
  EXPECT_FALSE(segment_exists(getpid()));
  munmap(p, sizeof(telem::Segment));
}

TEST(Telemetry, SegmentRemovedAtExit) {
  // Forked children must initialize the device themselves (ctest runs each test in its own process).
  if (rt::is_initialized()) GTEST_SKIP() << "needs a process that has not initialized the device";
  const pid_t child = fork();
  if (child == 0) {
    rt::device(0);
    _exit(segment_exists(getpid()) ? 0 : 1);  // _exit skips atexit: removed below by exit()
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_EQ(WEXITSTATUS(status), 0);
  EXPECT_TRUE(segment_exists(child));  // killed/_exit: stale until a reader cleans it
  shm_unlink(telem::segment_name(child).c_str());

  const pid_t child2 = fork();
  if (child2 == 0) {
    rt::device(0);
    std::exit(segment_exists(getpid()) ? 0 : 1);
  }
  waitpid(child2, &status, 0);
  ASSERT_EQ(WEXITSTATUS(status), 0);
  EXPECT_FALSE(segment_exists(child2));
}
