// Recycled: containers handed back keep their capacity for the next take() on the thread, their
// elements are destroyed on give(), and a thread's stash going away at exit is safe.
#include <gtest/gtest.h>

#include <memory>
#include <thread>
#include <vector>

#include "runtime/recycled.h"

namespace rt = neuronx::rt;

namespace {
using Vec = std::vector<std::shared_ptr<int>>;
using Small = rt::Recycled<Vec, 16>;
}  // namespace

TEST(Recycled, GiveKeepsCapacityAndDestroysElements) {
  Vec v = rt::Recycled<Vec>::take();
  v.reserve(100);
  auto p = std::make_shared<int>(7);
  v.push_back(p);
  const auto* data = v.data();
  rt::Recycled<Vec>::give(std::move(v));
  EXPECT_EQ(p.use_count(), 1);  // the element was destroyed when given back
  Vec again = rt::Recycled<Vec>::take();
  EXPECT_TRUE(again.empty());
  EXPECT_GE(again.capacity(), 100u);
  EXPECT_EQ(again.data(), data);  // the same buffer: no allocation
  rt::Recycled<Vec>::give(std::move(again));
}

TEST(Recycled, StashIsPerThreadAndBounded) {
  std::vector<Vec> many(40);
  for (auto& v : many) v.reserve(4);
  for (auto& v : many) Small::give(std::move(v));
  int reused = 0;
  for (int i = 0; i < 40; ++i) reused += Small::take().capacity() > 0;
  EXPECT_EQ(reused, 16);
  std::thread([] { EXPECT_EQ(Small::take().capacity(), 0u); }).join();
}

TEST(Recycled, UsableWhileThreadLocalsAreDestroyed) {
  // An object destroyed at thread exit after the stash itself: give() then frees normally.
  struct GivesAtExit {
    ~GivesAtExit() {
      Vec v;
      v.reserve(8);
      rt::Recycled<Vec>::give(std::move(v));
      EXPECT_EQ(rt::Recycled<Vec>::take().capacity(), 0u);
    }
  };
  std::thread([] {
    static thread_local GivesAtExit early;  // constructed first, destroyed last
    (void)early;
    Vec v;
    v.reserve(8);
    rt::Recycled<Vec>::give(std::move(v));  // creates the stash after `early`
  }).join();
}
