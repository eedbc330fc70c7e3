#pragma once
// Device events: a marker recorded on a queue, completed by the engine when
// the queue reaches it. Versioned like CUDA events: each record() bumps the
// version; query/synchronize/block refer to the latest record at call time.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

#include "runtime/error.h"

namespace neuronx::rt {

class Queue;

class Event : public std::enable_shared_from_this<Event> {
 public:
  static std::shared_ptr<Event> create(bool timing) { return std::shared_ptr<Event>(new Event(timing)); }

  void record(Queue& q);
  bool query() const;            // true when never recorded or the last record completed
  void synchronize();            // blocks; throws Error(kKernelFailed) if the covered work failed
  void block(Queue& q);          // q waits (on the device) for the last record
  // A record completed by the host instead of a queue (work the device hands
  // to another agent, e.g. a network transport): returns the version to pass
  // to complete_external() when that work is done.
  uint64_t record_external();
  void complete_external(uint64_t version);
  int device() const { return device_.load(); }
  bool timing() const { return timing_; }
  uint64_t recorded_version() const { return recorded_.load(); }
  // Milliseconds between two completed timing events.
  static double elapsed_ms(const Event& start, const Event& end);

  // Engine side.
  void complete(uint64_t version, int64_t ts_ns, std::shared_ptr<const TaskError> err, Queue* q);
  bool reached(uint64_t version) const { return completed_.load(std::memory_order_acquire) >= version; }

 private:
  explicit Event(bool timing) : timing_(timing) {}
  const bool timing_;
  std::atomic<int> device_{-1};
  std::atomic<uint64_t> recorded_{0}, completed_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int64_t timestamp_ns_ = 0;
  std::shared_ptr<const TaskError> error_;
  Queue* error_queue_ = nullptr;
};

int64_t now_ns();

}  // namespace neuronx::rt
