// Queues and engines: FIFO order, priorities, round robin, inspect(), the
// poisoned-queue error model, wait_idle, launch blocking (concurrency: test_queue_concurrency.cpp).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/config.h"
#include "runtime/error.h"
#include "runtime/queue.h"
#include "test_util.h"

namespace rt = neuronx::rt;
using namespace neuronx::rt::testing;
using rt::ErrorCode;

namespace {

// Records the names of kernels in execution order (written by the engine).
struct Trace {
  std::mutex mu;
  std::vector<std::string> order;
  std::unique_ptr<rt::Kernel> k(const char* name) {
    return fn(name, [this, name] {
      std::lock_guard<std::mutex> g(mu);
      order.emplace_back(name);
    });
  }
  std::vector<std::string> get() {
    std::lock_guard<std::mutex> g(mu);
    return order;
  }
};

using Names = std::vector<std::string>;

TEST(Queue, Properties) {
  Rig rig(5);
  rt::Queue& q = rig.add(7, -1);
  EXPECT_EQ(q.device(), 5);
  EXPECT_EQ(q.id(), 7u);
  EXPECT_EQ(q.priority(), -1);
  EXPECT_TRUE(q.query());
  EXPECT_EQ(q.pending(), 0u);
  q.synchronize();  // nothing submitted: returns at once
  q.wait_idle();
}

TEST(Queue, RunsKernelsInFifoOrder) {
  Rig rig;
  rt::Queue& q = rig.add(0);
  std::vector<int> seen;  // only the engine thread writes, synchronize() publishes
  for (int i = 0; i < 200; ++i) q.launch(fn("k", [&seen, i] { seen.push_back(i); }));
  q.synchronize();
  ASSERT_EQ(seen.size(), 200u);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(seen[i], i);
  EXPECT_TRUE(q.query());
  EXPECT_EQ(q.pending(), 0u);
}

TEST(Queue, SynchronizeWaitsForRunningWork) {
  Rig rig;
  rt::Queue& q = rig.add(0);
  std::atomic<bool> done{false};
  q.launch(fn("slow", [&] {
    std::this_thread::sleep_for(30ms);
    done = true;
  }));
  q.synchronize();
  EXPECT_TRUE(done.load());
  EXPECT_TRUE(q.query());
}

TEST(Queue, WaitIdleForReturnsAtItsTimeoutOrWhenIdle) {
  SKIP_IF_LAUNCH_BLOCKING();
  Rig rig;
  rt::Queue& q = rig.add(0);
  std::atomic<bool> release{false};
  q.launch(fn("gate", [&] {
    while (!release) std::this_thread::sleep_for(1ms);
  }));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(q.wait_idle_for(20'000'000));  // 20 ms: the gate is still closed
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 20ms);
  release = true;
  EXPECT_TRUE(q.wait_idle_for(10'000'000'000));
  EXPECT_TRUE(q.query());
}

TEST(Queue, DiscardPendingSkipsKernelsNotStartedButCompletesEvents) {
  SKIP_IF_LAUNCH_BLOCKING();
  Rig rig;
  rt::Queue& q = rig.add(0);
  std::atomic<bool> release{false}, started{false};
  std::atomic<int> ran{0};
  q.launch(fn("running", [&] {
    started = true;
    while (!release) std::this_thread::sleep_for(1ms);
    ran++;
  }));
  for (int i = 0; i < 100; ++i) q.launch(fn("queued", [&] { ran++; }));
  auto ev = rt::Event::create(false);
  ev->record(q);
  while (!started) std::this_thread::sleep_for(1ms);
  q.discard_pending();
  q.launch(fn("later", [&] { ran++; }));
  release = true;
  q.synchronize();  // no error: dropping is not a failure
  EXPECT_EQ(ran.load(), 1);  // only the kernel that was running
  EXPECT_TRUE(ev->query());
}

TEST(Queue, QueryPendingAndInspectWhileBlocked) {
  SKIP_IF_LAUNCH_BLOCKING();
  Rig rig;
  rt::Queue& q = rig.add(0);
  Gate gate;
  Trace trace;
  q.launch(gate.kernel("gate"));
  ASSERT_TRUE(gate.wait_started());
  q.launch(trace.k("aten::add"));
  q.launch(trace.k("aten::mul"));
  auto origin_kernel = trace.k("aten::relu");
  origin_kernel->origin = 7;
  q.launch(std::move(origin_kernel));

  EXPECT_FALSE(q.query());
  EXPECT_EQ(q.pending(), 4u) << "the running gate kernel counts as pending";
  Names names;
  std::vector<uint64_t> origins;
  q.inspect([&](const rt::Task& t) {
    ASSERT_EQ(t.kind, rt::Task::Kind::kKernel);
    names.emplace_back(t.kernel->name());
    origins.push_back(t.kernel->origin);
  });
  // Only queued, not yet started tasks, in submission order.
  EXPECT_EQ(names, (Names{"aten::add", "aten::mul", "aten::relu"}));
  EXPECT_EQ(origins, (std::vector<uint64_t>{0, 0, 7}));
  EXPECT_TRUE(trace.get().empty());

  gate.open();
  q.synchronize();
  EXPECT_EQ(trace.get(), (Names{"aten::add", "aten::mul", "aten::relu"}));
  int visited = 0;
  q.inspect([&](const rt::Task&) { ++visited; });
  EXPECT_EQ(visited, 0);
  EXPECT_TRUE(q.query());
}

TEST(Queue, InspectSeesEventTasks) {
  SKIP_IF_LAUNCH_BLOCKING();
  Rig rig;
  rt::Queue& q = rig.add(0);
  Gate gate;
  q.launch(gate.kernel());
  ASSERT_TRUE(gate.wait_started());
  auto ev = rt::Event::create(false);
  ev->record(q);
  std::vector<rt::Task::Kind> kinds;
  std::vector<uint64_t> versions;
  q.inspect([&](const rt::Task& t) {
    kinds.push_back(t.kind);
    versions.push_back(t.version);
  });
  EXPECT_EQ(kinds, (std::vector<rt::Task::Kind>{rt::Task::Kind::kRecord}));
  EXPECT_EQ(versions, (std::vector<uint64_t>{1}));
  gate.open();
  q.synchronize();
}

TEST(Engine, HighPriorityQueueRunsFirst) {
  SKIP_IF_LAUNCH_BLOCKING();
  Rig rig;
  rt::Queue& blocker = rig.add(0, 0);
  rt::Queue& normal = rig.add(1, 0);
  rt::Queue& high = rig.add(2, -1);
  Gate gate;
  Trace trace;
  blocker.launch(gate.kernel());
  ASSERT_TRUE(gate.wait_started());
  // Normal work is submitted first, yet the high-priority queue wins.
  normal.launch(trace.k("n1"));
  normal.launch(trace.k("n2"));
  high.launch(trace.k("h1"));
  high.launch(trace.k("h2"));
  gate.open();
  normal.synchronize();
  high.synchronize();
  EXPECT_EQ(trace.get(), (Names{"h1", "h2", "n1", "n2"}));
}

TEST(Engine, HighPriorityAttachedFirstStillWins) {
  SKIP_IF_LAUNCH_BLOCKING();
  // Attach order must not matter: the engine sorts queues by priority.
  Rig rig;
  rt::Queue& high = rig.add(2, -1);
  rt::Queue& normal = rig.add(1, 0);
  rt::Queue& blocker = rig.add(0, 0);
  Gate gate;
  Trace trace;
  blocker.launch(gate.kernel());
  ASSERT_TRUE(gate.wait_started());
  normal.launch(trace.k("n1"));
  high.launch(trace.k("h1"));
  normal.launch(trace.k("n2"));
  high.launch(trace.k("h2"));
  gate.open();
  normal.synchronize();
  high.synchronize();
  EXPECT_EQ(trace.get(), (Names{"h1", "h2", "n1", "n2"}));
}

TEST(Engine, EqualPrioritiesAreServedRoundRobin) {
  SKIP_IF_LAUNCH_BLOCKING();
  Rig rig;
  rt::Queue& blocker = rig.add(0);
  rt::Queue& a = rig.add(1);
  rt::Queue& b = rig.add(2);
  Gate gate;
  Trace trace;
  blocker.launch(gate.kernel());
  ASSERT_TRUE(gate.wait_started());
  a.launch(trace.k("a1"));
  a.launch(trace.k("a2"));
  a.launch(trace.k("a3"));
  b.launch(trace.k("b1"));
  b.launch(trace.k("b2"));
  gate.open();
  a.synchronize();
  b.synchronize();
  EXPECT_EQ(trace.get(), (Names{"a1", "b1", "a2", "b2", "a3"}));
}

TEST(Engine, BlockedHighPriorityQueueDoesNotStarveOthers) {
  SKIP_IF_LAUNCH_BLOCKING();
  // A high-priority queue whose head waits on an incomplete event is not
  // ready, so the normal queue runs meanwhile.
  Rig rig;
  Rig other(0, "test/other");
  rt::Queue& high = rig.add(1, -1);
  rt::Queue& normal = rig.add(2, 0);
  rt::Queue& remote = other.add(3, 0);
  Gate gate;
  Trace trace;
  remote.launch(gate.kernel());
  ASSERT_TRUE(gate.wait_started());
  auto ev = rt::Event::create(false);
  ev->record(remote);
  ev->block(high);
  high.launch(trace.k("high"));
  normal.launch(trace.k("normal"));
  normal.synchronize();
  EXPECT_EQ(trace.get(), (Names{"normal"}));
  EXPECT_FALSE(high.query());
  gate.open();
  high.synchronize();
  EXPECT_EQ(trace.get(), (Names{"normal", "high"}));
}

TEST(QueueOrigin, CaptureHookTagsEachLaunchUnlessTheKernelHasOne) {
  Rig rig;
  rt::Queue& q = rig.add(0);
  Gate gate;
  q.launch(gate.kernel("gate"));
  ASSERT_TRUE(gate.wait_started());
  rt::set_origin_hooks([]() -> uint64_t { return 5; }, nullptr);
  q.launch(fn("captured", [] {}));
  q.launch(failing("preset", "x", 9));
  rt::set_origin_hooks(nullptr, nullptr);
  q.launch(fn("after", [] {}));
  std::vector<uint64_t> origins;
  q.inspect([&](const rt::Task& t) { origins.push_back(t.kernel->origin); });
  EXPECT_EQ(origins, (std::vector<uint64_t>{5, 9, 0}));
  gate.open();
  EXPECT_THROW(q.synchronize(), rt::Error);
}

// ---------------------------------------------------------------- errors

TEST(QueueErrors, FailingKernelPoisonsUntilReported) {
  Rig rig;
  rt::Queue& q = rig.add(0);
  std::atomic<int> ran{0};
  rt::set_origin_hooks(nullptr, [](uint64_t t) { return "train.py:" + std::to_string(t); });
  q.launch(fn("ok1", [&] { ++ran; }));
  q.launch(failing("aten::index_select", "index 9 is out of bounds", 42));
  q.launch(fn("skipped", [&] { ran += 100; }));
  q.launch(fn("skipped2", [&] { ran += 100; }));
  EXPECT_RT_ERROR(q.synchronize(), ErrorCode::kKernelFailed, "aten::index_select",
                  "index 9 is out of bounds", "train.py:42");
  rt::set_origin_hooks(nullptr, nullptr);
  EXPECT_EQ(ran.load(), 1) << "kernels after the failure must be skipped";
  EXPECT_EQ(q.peek_error(), nullptr);

  // Reported: the queue works again and the next sync is clean.
  q.launch(fn("ok2", [&] { ++ran; }));
  EXPECT_NO_THROW(q.synchronize());
  EXPECT_EQ(ran.load(), 2);
  EXPECT_NO_THROW(q.synchronize());
}

TEST(QueueErrors, MessageFormat) {
  Rig rig;
  rt::Queue& q = rig.add(0);
  q.launch(failing("aten::div", "division by zero"));
  try {
    q.synchronize();
    FAIL() << "expected an error";
  } catch (const rt::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kKernelFailed);
    EXPECT_STREQ(e.what(), "neuron kernel 'aten::div' failed: division by zero");
  }
}

TEST(QueueErrors, NonStdExceptionIsCaught) {
  Rig rig;
  rt::Queue& q = rig.add(0);
  q.launch(fn("weird_op", [] { throw 42; }));
  EXPECT_RT_ERROR(q.synchronize(), ErrorCode::kKernelFailed, "weird_op", "unknown exception");
  std::atomic<bool> ran{false};
  q.launch(fn("after", [&] { ran = true; }));
  q.synchronize();
  EXPECT_TRUE(ran.load());
}

TEST(QueueErrors, FirstErrorIsKept) {
  SKIP_IF_LAUNCH_BLOCKING();
  Rig rig;
  rt::Queue& q = rig.add(0);
  Gate gate;
  q.launch(gate.kernel());
  ASSERT_TRUE(gate.wait_started());
  q.launch(failing("first_op", "first"));
  q.launch(failing("second_op", "second"));
  gate.open();
  try {
    q.synchronize();
    FAIL() << "expected an error";
  } catch (const rt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("first_op"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("second_op"), std::string::npos) << e.what();
  }
}

TEST(QueueErrors, WaitIdleDoesNotConsumeTheError) {
  Rig rig;
  rt::Queue& q = rig.add(0);
  std::atomic<int> ran{0};
  q.launch(failing("bad_op", "boom"));
  q.launch(fn("skipped", [&] { ++ran; }));
  q.wait_idle();
  EXPECT_TRUE(q.query());
  auto err = q.peek_error();
  ASSERT_NE(err, nullptr);
  EXPECT_EQ(err->op, "bad_op");
  EXPECT_EQ(err->message, "boom");
  q.wait_idle();
  EXPECT_NE(q.peek_error(), nullptr) << "wait_idle must leave the error for synchronize";
  // Still poisoned: a kernel launched now is skipped too.
  q.launch(fn("skipped_too", [&] { ++ran; }));
  EXPECT_RT_ERROR(q.synchronize(), ErrorCode::kKernelFailed, "bad_op", "boom");
  EXPECT_EQ(ran.load(), 0);
  EXPECT_EQ(q.peek_error(), nullptr);
  q.launch(fn("runs", [&] { ++ran; }));
  q.synchronize();
  EXPECT_EQ(ran.load(), 1);
}

TEST(QueueErrors, ClearErrorIfClearsOnlyThatError) {
  Rig rig;
  rt::Queue& q = rig.add(0);
  q.launch(failing("bad_op2", "boom"));
  q.wait_idle();
  q.clear_error_if(nullptr);  // not the recorded error: kept
  auto kept = q.peek_error();
  ASSERT_NE(kept, nullptr);
  q.clear_error_if(kept.get());
  EXPECT_EQ(q.peek_error(), nullptr);
  EXPECT_NO_THROW(q.synchronize());
}

TEST(QueueErrors, PoisonIsPerQueue) {
  Rig rig;
  rt::Queue& bad = rig.add(0);
  rt::Queue& good = rig.add(1);
  std::atomic<int> ran{0};
  bad.launch(failing("bad_op", "boom"));
  bad.wait_idle();
  good.launch(fn("fine", [&] { ++ran; }));
  EXPECT_NO_THROW(good.synchronize());
  EXPECT_EQ(ran.load(), 1);
  EXPECT_RT_ERROR(bad.synchronize(), ErrorCode::kKernelFailed, "bad_op");
}

// Observer: sees failed and skipped flags for kernels.
std::mutex g_obs_mu;
std::vector<rt::TaskRecord> g_obs;
void observe(const rt::TaskRecord& r) {
  std::lock_guard<std::mutex> g(g_obs_mu);
  if (r.queue_id == 4242) g_obs.push_back(r);
}

TEST(QueueErrors, ObserverSeesFailedAndSkipped) {
  {
    std::lock_guard<std::mutex> g(g_obs_mu);
    g_obs.clear();
  }
  rt::set_task_observer(&observe, [] { return uint64_t{77}; });
  {
    Rig rig(6);
    rt::Queue& q = rig.add(4242);
    q.launch(fn("ok", [] {}));
    q.launch(failing("bad", "boom"));
    q.launch(fn("after", [] {}));
    EXPECT_THROW(q.synchronize(), rt::Error);
  }
  rt::set_task_observer(nullptr);
  std::lock_guard<std::mutex> g(g_obs_mu);
  ASSERT_EQ(g_obs.size(), 3u);
  EXPECT_STREQ(g_obs[0].name, "ok");
  EXPECT_FALSE(g_obs[0].failed);
  EXPECT_FALSE(g_obs[0].skipped);
  EXPECT_STREQ(g_obs[1].name, "bad");
  EXPECT_TRUE(g_obs[1].failed);
  EXPECT_STREQ(g_obs[2].name, "after");
  EXPECT_TRUE(g_obs[2].skipped);
  EXPECT_FALSE(g_obs[2].failed);
  for (auto& r : g_obs) {
    EXPECT_EQ(r.device, 6);
    EXPECT_LE(r.start_ns, r.end_ns);
    EXPECT_GT(r.enqueue_ns, 0);
    EXPECT_LE(r.enqueue_ns, r.start_ns);
    EXPECT_EQ(r.correlation, 77u);  // the launch tag, taken on the launching thread
  }
}

TEST(QueueErrors, InlineWorkIsReportedLikeAKernel) {
  {
    std::lock_guard<std::mutex> g(g_obs_mu);
    g_obs.clear();
  }
  rt::set_task_observer(&observe, [] { return uint64_t{5}; });
  {
    Rig rig(6);
    rt::Queue& q = rig.add(4242);
    q.report_inline("host_op", 100, 250, false);
  }
  rt::set_task_observer(nullptr);
  std::lock_guard<std::mutex> g(g_obs_mu);
  ASSERT_EQ(g_obs.size(), 1u);
  EXPECT_STREQ(g_obs[0].name, "host_op");
  EXPECT_EQ(g_obs[0].start_ns, 100);
  EXPECT_EQ(g_obs[0].end_ns, 250);
  EXPECT_EQ(g_obs[0].correlation, 5u);
}

TEST(QueueErrors, AKernelMadeOfStepsReportsItsStepsInsteadOfItself) {
  {
    std::lock_guard<std::mutex> g(g_obs_mu);
    g_obs.clear();
  }
  // A compiled program: one kernel whose steps are reported, under its queue and launch tag.
  class Steps final : public rt::Kernel {
   public:
    void run() override {
      reported_steps = rt::observing();
      rt::report_step("step_a", 10, 20);
      rt::report_step("step_b", 20, 30);
    }
    const char* name() const override { return "program"; }
  };
  rt::set_task_observer(&observe, [] { return uint64_t{9}; });
  {
    Rig rig(6);
    rt::Queue& q = rig.add(4242);
    q.launch(std::make_unique<Steps>());
    q.synchronize();
  }
  rt::report_step("outside_a_kernel", 0, 1);  // not on an engine thread: ignored
  rt::set_task_observer(nullptr);
  std::lock_guard<std::mutex> g(g_obs_mu);
  ASSERT_EQ(g_obs.size(), 2u);
  EXPECT_STREQ(g_obs[0].name, "step_a");
  EXPECT_STREQ(g_obs[1].name, "step_b");
  for (auto& r : g_obs) {
    EXPECT_EQ(r.device, 6);
    EXPECT_EQ(r.correlation, 9u);
  }
  EXPECT_EQ(g_obs[1].start_ns, 20);
}

// ---------------------------------------------------------------- launch blocking

TEST(LaunchBlocking, LaunchWaitsAndThrows) {
  // config() is parsed once per process, so run in a fresh child process
  // (threadsafe style re-executes this binary for just this test).
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("NEURON_LAUNCH_BLOCKING", "1", 1);
        if (!rt::config().launch_blocking) std::_Exit(10);
        Rig rig;
        rt::Queue& q = rig.add(0);
        std::atomic<bool> done{false};
        q.launch(fn("slow", [&] {
          std::this_thread::sleep_for(20ms);
          done = true;
        }));
        if (!done.load()) std::_Exit(11);  // launch returned before the kernel finished
        try {
          q.launch(failing("aten::bad", "boom"));
          std::_Exit(12);  // the error must surface at launch
        } catch (const rt::Error& e) {
          if (e.code() != ErrorCode::kKernelFailed) std::_Exit(13);
          if (std::string(e.what()).find("aten::bad") == std::string::npos) std::_Exit(14);
        }
        std::atomic<bool> after{false};
        q.launch(fn("after", [&] { after = true; }));  // the queue works again
        if (!after.load()) std::_Exit(15);
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace

// A host that runs too far ahead blocks in launch() until the queue has
// drained to half its depth, instead of queueing without bound.
TEST(QueueBackpressure, LaunchBlocksWhenQueueIsFull) {
  SKIP_IF_LAUNCH_BLOCKING();
  Rig rig;
  rt::Queue& q = rig.add(0);
  Gate gate;
  q.launch(gate.kernel("gate"));
  ASSERT_TRUE(gate.wait_started());
  std::atomic<uint64_t> submitted{0};
  std::thread producer([&] {
    for (uint64_t i = 0; i < rt::Queue::kMaxPending + 10; ++i) {
      q.launch(fn("tiny", [] {}));
      submitted.fetch_add(1);
    }
  });
  // The engine is held by the gate: the producer must stop at the depth limit.
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(submitted.load(), rt::Queue::kMaxPending - 1) << "one slot is taken by the gated kernel";
  EXPECT_EQ(q.pending(), rt::Queue::kMaxPending);
  gate.open();
  within(5000ms, [&] { producer.join(); }, "producer after the queue drained");
  EXPECT_EQ(submitted.load(), rt::Queue::kMaxPending + 10);
  q.synchronize();
  EXPECT_TRUE(q.query());
}
