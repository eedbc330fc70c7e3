// Events: record/query/synchronize, versions, cross-queue block, timing,
// error reporting through events.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "runtime/error.h"
#include "runtime/event.h"
#include "runtime/queue.h"
#include "test_util.h"

namespace rt = neuronx::rt;
using namespace neuronx::rt::testing;
using rt::ErrorCode;

namespace {

TEST(Event, NeverRecorded) {
  auto ev = rt::Event::create(false);
  EXPECT_TRUE(ev->query());
  EXPECT_EQ(ev->recorded_version(), 0u);
  EXPECT_EQ(ev->device(), -1);
  EXPECT_FALSE(ev->timing());
  EXPECT_TRUE(rt::Event::create(true)->timing());
  ev->synchronize();  // returns at once
  // Blocking on a never-recorded event is a no-op: the queue is not held.
  Rig rig;
  rt::Queue& q = rig.add(0);
  ev->block(q);
  EXPECT_EQ(q.pending(), 0u);
  std::atomic<bool> ran{false};
  q.launch(fn("k", [&] { ran = true; }));
  q.synchronize();
  EXPECT_TRUE(ran.load());
}

TEST(Event, RecordQuerySynchronize) {
  SKIP_IF_LAUNCH_BLOCKING();
  Rig rig(4);
  rt::Queue& q = rig.add(0);
  Gate gate;
  std::atomic<bool> ran{false};
  q.launch(gate.kernel());
  ASSERT_TRUE(gate.wait_started());
  q.launch(fn("work", [&] { ran = true; }));
  auto ev = rt::Event::create(false);
  ev->record(q);
  EXPECT_EQ(ev->device(), 4);
  EXPECT_EQ(ev->recorded_version(), 1u);
  EXPECT_FALSE(ev->query());
  EXPECT_FALSE(ev->reached(1));
  gate.open();
  ev->synchronize();
  EXPECT_TRUE(ran.load()) << "the event covers work submitted before record()";
  EXPECT_TRUE(ev->query());
  EXPECT_TRUE(ev->reached(1));
}

TEST(Event, RecordOnIdleQueueIsReachedAtOnce) {
  // Nothing queued: the record is complete on return, without a task for the
  // engine (as cudaEventRecord on an idle stream); a wait on it enqueues nothing.
  Rig rig;
  rt::Queue& q = rig.add(0), &other = rig.add(1);
  q.launch(fn("done first", [] {}));
  q.synchronize();
  auto ev = rt::Event::create(false);
  ev->record(q);
  EXPECT_TRUE(ev->query());
  EXPECT_EQ(q.pending(), 0u);
  ev->block(other);
  EXPECT_EQ(other.pending(), 0u);
  EXPECT_NO_THROW(ev->synchronize());
}

TEST(Event, QueryRefersToLatestRecord) {
  SKIP_IF_LAUNCH_BLOCKING();
  Rig rig;
  rt::Queue& q = rig.add(0);
  auto ev = rt::Event::create(false);
  ev->record(q);
  ev->synchronize();
  EXPECT_TRUE(ev->query());
  Gate gate;
  q.launch(gate.kernel());
  ASSERT_TRUE(gate.wait_started());
  ev->record(q);
  EXPECT_EQ(ev->recorded_version(), 2u);
  EXPECT_FALSE(ev->query()) << "re-recording makes the event pending again";
  EXPECT_TRUE(ev->reached(1));
  gate.open();
  ev->synchronize();
  EXPECT_TRUE(ev->query());
}

TEST(Event, BlockHoldsAnotherQueueUntilRecordedWorkIsReached) {
  SKIP_IF_LAUNCH_BLOCKING();
  Rig producer_rig(0, "test/producer");
  Rig consumer_rig(0, "test/consumer");
  rt::Queue& producer = producer_rig.add(1);
  rt::Queue& consumer = consumer_rig.add(2);
  Gate gate;
  std::atomic<int> produced{0};
  std::atomic<int> seen_by_consumer{-1};
  producer.launch(gate.kernel());
  ASSERT_TRUE(gate.wait_started());
  producer.launch(fn("produce", [&] { produced = 42; }));
  auto ev = rt::Event::create(false);
  ev->record(producer);
  ev->block(consumer);
  consumer.launch(fn("consume", [&] { seen_by_consumer = produced.load(); }));

  // The consumer's engine is free, but its queue waits for the event.
  std::this_thread::sleep_for(30ms);
  EXPECT_EQ(seen_by_consumer.load(), -1);
  EXPECT_FALSE(consumer.query());
  EXPECT_EQ(consumer.pending(), 2u);  // the wait and the kernel
  EXPECT_FALSE(ev->query());

  gate.open();
  within(5000ms, [&] { consumer.synchronize(); }, "consumer after event");
  EXPECT_EQ(seen_by_consumer.load(), 42);
  EXPECT_TRUE(ev->query());
}

TEST(Event, BlockOnSameEngineOnlyHoldsTheWaitingQueue) {
  SKIP_IF_LAUNCH_BLOCKING();
  // Producer, consumer and a bystander share one engine; the producer's
  // record waits (through a second event) on a gate on another engine.
  Rig rig(0, "test/shared");
  Rig gate_rig(0, "test/gate");
  rt::Queue& producer = rig.add(1);
  rt::Queue& consumer = rig.add(2);
  rt::Queue& bystander = rig.add(3);
  rt::Queue& gated = gate_rig.add(4);
  Gate gate;
  std::vector<std::string> order;  // written by the shared engine only
  gated.launch(gate.kernel());
  ASSERT_TRUE(gate.wait_started());
  auto gate_ev = rt::Event::create(false);
  gate_ev->record(gated);
  gate_ev->block(producer);
  producer.launch(fn("produce", [&] { order.push_back("produce"); }));
  auto ev = rt::Event::create(false);
  ev->record(producer);
  ev->block(consumer);
  consumer.launch(fn("consume", [&] { order.push_back("consume"); }));
  bystander.launch(fn("bystander", [&] { order.push_back("bystander"); }));

  within(5000ms, [&] { bystander.synchronize(); }, "bystander");
  EXPECT_FALSE(producer.query());
  EXPECT_FALSE(consumer.query());
  gate.open();
  within(5000ms, [&] { consumer.synchronize(); }, "consumer");
  producer.synchronize();
  EXPECT_EQ(order, (std::vector<std::string>{"bystander", "produce", "consume"}));
}

TEST(Event, BlockAfterCompletionDoesNotEnqueue) {
  Rig rig;
  rt::Queue& a = rig.add(0);
  rt::Queue& b = rig.add(1);
  auto ev = rt::Event::create(false);
  ev->record(a);
  ev->synchronize();
  ev->block(b);
  EXPECT_EQ(b.pending(), 0u) << "an already reached event adds no wait task";
}

TEST(Event, BlockUsesVersionAtCallTime) {
  SKIP_IF_LAUNCH_BLOCKING();
  Rig rig_a(0, "test/a");
  Rig rig_b(0, "test/b");
  rt::Queue& a = rig_a.add(0);
  rt::Queue& b = rig_b.add(1);
  auto ev = rt::Event::create(false);
  ev->record(a);
  ev->synchronize();  // version 1 reached
  Gate gate;
  a.launch(gate.kernel());
  ASSERT_TRUE(gate.wait_started());
  ev->record(a);  // version 2, pending behind the gate
  ev->block(b);
  std::atomic<bool> ran{false};
  b.launch(fn("k", [&] { ran = true; }));
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(ran.load()) << "b must wait for version 2, not the reached version 1";
  gate.open();
  within(5000ms, [&] { b.synchronize(); }, "b");
  EXPECT_TRUE(ran.load());
}

TEST(Event, RecordOnAnotherDeviceIsRejected) {
  Rig r0(0, "test/d0"), r1(1, "test/d1");
  rt::Queue& q0 = r0.add(0);
  rt::Queue& q1 = r1.add(0);
  auto ev = rt::Event::create(false);
  ev->record(q0);
  EXPECT_RT_ERROR(ev->record(q1), ErrorCode::kInvalidArgument, "neuron:0", "neuron:1");
  EXPECT_EQ(ev->recorded_version(), 1u) << "a rejected record does not bump the version";
  EXPECT_EQ(ev->device(), 0);
  EXPECT_NO_THROW(ev->record(q0));
  ev->synchronize();
}

TEST(Event, ElapsedTime) {
  Rig rig;
  rt::Queue& q = rig.add(0);
  auto start = rt::Event::create(true), end = rt::Event::create(true);
  start->record(q);
  q.launch(fn("sleep", [] { std::this_thread::sleep_for(25ms); }));
  end->record(q);
  end->synchronize();
  const double ms = rt::Event::elapsed_ms(*start, *end);
  EXPECT_GE(ms, 25.0);
  EXPECT_LT(ms, 5000.0);
  EXPECT_EQ(rt::Event::elapsed_ms(*start, *start), 0.0);
  EXPECT_LE(rt::Event::elapsed_ms(*end, *start), -25.0);
}

TEST(Event, ElapsedTimeErrors) {
  SKIP_IF_LAUNCH_BLOCKING();
  Rig rig;
  rt::Queue& q = rig.add(0);
  auto plain = rt::Event::create(false);
  auto t1 = rt::Event::create(true), t2 = rt::Event::create(true);
  plain->record(q);
  t1->record(q);
  plain->synchronize();
  EXPECT_RT_ERROR(rt::Event::elapsed_ms(*plain, *t1), ErrorCode::kInvalidArgument, "enable_timing");
  EXPECT_RT_ERROR(rt::Event::elapsed_ms(*t1, *t2), ErrorCode::kInvalidArgument, "recorded");
  Gate gate;
  q.launch(gate.kernel());
  ASSERT_TRUE(gate.wait_started());
  t2->record(q);
  EXPECT_RT_ERROR(rt::Event::elapsed_ms(*t1, *t2), ErrorCode::kInvalidArgument, "synchronize");
  gate.open();
  t2->synchronize();
  EXPECT_GE(rt::Event::elapsed_ms(*t1, *t2), 0.0);
}

TEST(Event, ConcurrentSynchronizers) {
  SKIP_IF_LAUNCH_BLOCKING();
  Rig rig;
  rt::Queue& q = rig.add(0);
  Gate gate;
  q.launch(gate.kernel());
  ASSERT_TRUE(gate.wait_started());
  auto ev = rt::Event::create(false);
  ev->record(q);
  std::atomic<int> woke{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i)
    ts.emplace_back([&] {
      ev->synchronize();
      ++woke;
    });
  std::this_thread::sleep_for(10ms);
  EXPECT_EQ(woke.load(), 0);
  gate.open();
  within(5000ms, [&] { for (auto& t : ts) t.join(); }, "event waiters");
  EXPECT_EQ(woke.load(), 4);
}

// ---------------------------------------------------------------- errors

TEST(EventErrors, SynchronizeReportsCoveredFailureAndUnpoisonsQueue) {
  Rig rig;
  rt::Queue& q = rig.add(0);
  std::atomic<int> ran{0};
  q.launch(failing("aten::gather", "bad index"));
  q.launch(fn("skipped", [&] { ++ran; }));
  auto ev = rt::Event::create(false);
  ev->record(q);
  EXPECT_RT_ERROR(ev->synchronize(), ErrorCode::kKernelFailed, "aten::gather", "bad index");
  EXPECT_EQ(ran.load(), 0);
  // Reported through the event: the queue no longer holds it.
  EXPECT_EQ(q.peek_error(), nullptr);
  EXPECT_NO_THROW(q.synchronize());
  EXPECT_NO_THROW(ev->synchronize()) << "reported once";
  q.launch(fn("runs", [&] { ++ran; }));
  q.synchronize();
  EXPECT_EQ(ran.load(), 1);
}

TEST(EventErrors, EventRecordedBeforeFailureIsClean) {
  Rig rig;
  rt::Queue& q = rig.add(0);
  auto ev = rt::Event::create(false);
  ev->record(q);
  q.launch(failing("later_op", "boom"));
  EXPECT_NO_THROW(ev->synchronize());
  EXPECT_RT_ERROR(q.synchronize(), ErrorCode::kKernelFailed, "later_op");
}

TEST(EventErrors, LatestCleanRecordDoesNotReportAStaleError) {
  // v1 covers a failure that the queue's synchronize() reports; v2 is recorded
  // after, on the now healthy queue. Synchronizing the event refers to v2.
  Rig rig;
  rt::Queue& q = rig.add(0);
  auto ev = rt::Event::create(false);
  q.launch(failing("old_op", "boom"));
  ev->record(q);
  EXPECT_RT_ERROR(q.synchronize(), ErrorCode::kKernelFailed, "old_op");
  q.launch(fn("ok", [] {}));
  ev->record(q);
  EXPECT_NO_THROW(ev->synchronize());
}

TEST(Event, OlderRecordCompletingLateDoesNotRegress) {
  SKIP_IF_LAUNCH_BLOCKING();
  // v1 on a blocked queue, v2 on a free one: v2 completes first. When v1
  // completes later, the event must stay complete (it refers to v2).
  Rig ra(0, "test/ra"), rb(0, "test/rb");
  rt::Queue& a = ra.add(1);
  rt::Queue& b = rb.add(2);
  Gate gate;
  a.launch(gate.kernel());
  ASSERT_TRUE(gate.wait_started());
  auto ev = rt::Event::create(true);
  ev->record(a);  // v1, behind the gate
  b.launch(fn("sleep", [] { std::this_thread::sleep_for(2ms); }));
  ev->record(b);  // v2
  b.synchronize();
  EXPECT_TRUE(ev->query());
  gate.open();
  a.synchronize();  // v1 completes now
  EXPECT_TRUE(ev->query()) << "completing an older record must not make the event pending again";
  within(2000ms, [&] { ev->synchronize(); }, "event synchronize after late older record");
  EXPECT_TRUE(ev->reached(2));
}

TEST(Event, ElapsedTimeFromConcurrentThreadsInBothOrders) {
  // elapsed_ms(a, b) and elapsed_ms(b, a) at once must not deadlock (the two
  // event locks must never be held in opposite orders).
  Rig rig;
  rt::Queue& q = rig.add(0);
  auto a = rt::Event::create(true), b = rt::Event::create(true);
  a->record(q);
  b->record(q);
  b->synchronize();
  within(10000ms, [&] {
    std::atomic<bool> go{false};
    auto spin = [&](const rt::Event& x, const rt::Event& y) {
      while (!go.load()) std::this_thread::yield();
      for (int i = 0; i < 500000; ++i) (void)rt::Event::elapsed_ms(x, y);
    };
    std::thread t1(spin, std::cref(*a), std::cref(*b));
    std::thread t2(spin, std::cref(*b), std::cref(*a));
    go = true;
    t1.join();
    t2.join();
  }, "elapsed_ms in both orders");
  EXPECT_GE(rt::Event::elapsed_ms(*a, *b), 0.0);
}

}  // namespace

TEST(Event, ExternalRecordBlocksQueuesUntilTheHostCompletesIt) {
  Rig rig(3);
  rt::Queue& q = rig.add(0);
  auto e = rt::Event::create(true);
  const uint64_t v = e->record_external();
  EXPECT_FALSE(e->query());
  std::atomic<bool> ran{false};
  e->block(q);
  q.launch(fn("after", [&] { ran = true; }));
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(ran.load());  // the queue waits for the host
  std::thread t([&] { e->complete_external(v); });
  q.synchronize();
  t.join();
  EXPECT_TRUE(ran.load());
  EXPECT_TRUE(e->query());
  EXPECT_NO_THROW(e->synchronize());
}
