#pragma once
// The completion side of a group's collectives: the collective queue only
// issues them, and the transport runs several at once.
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace neuronx::distributed {

// Waits for issued transport operations, in issue order, on its own thread,
// and runs their completion (so the collective queue only issues, and the
// transport can run several collectives at once).
class Completer {
 public:
  using Done = std::function<void(const std::string* error)>;  // nullptr: success
  Completer();
  ~Completer();
  // `on_future`: the work's future is completed by the transport's worker
  // thread, and `done` runs there instead of on this thread.
  void add(c10::intrusive_ptr<c10d::Work> work, Done done, bool on_future);
  // Waits until every group's completions have run (at interpreter exit).
  static bool drain(std::chrono::milliseconds timeout);

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<c10::intrusive_ptr<c10d::Work>, Done>> pending_;
  bool stop_ = false;
  std::thread thread_;
};

// Counts a collective from the moment it is queued until its completion has
// run (or it failed, or its queue dropped it unrun), so that
// Completer::drain() also waits for collectives still on a queue.
struct QueuedCollective {
  QueuedCollective();
  ~QueuedCollective();
  QueuedCollective(const QueuedCollective&) = delete;
  QueuedCollective& operator=(const QueuedCollective&) = delete;
};

}  // namespace neuronx::distributed
