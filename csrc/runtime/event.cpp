#include "runtime/event.h"

#include <chrono>

#include "runtime/queue.h"

namespace neuronx::rt {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Event::record(Queue& q) {
  int expected = -1;
  if (!device_.compare_exchange_strong(expected, q.device()) && expected != q.device())
    throw Error(ErrorCode::kInvalidArgument,
                "event was recorded on neuron:" + std::to_string(expected) +
                    " and cannot be recorded on a stream of neuron:" + std::to_string(q.device()));
  uint64_t v = recorded_.fetch_add(1) + 1;
  q.record(shared_from_this(), v);
}

bool Event::query() const { return completed_.load(std::memory_order_acquire) >= recorded_.load(); }

void Event::synchronize() {
  const uint64_t target = recorded_.load();
  std::shared_ptr<const TaskError> err;
  Queue* q = nullptr;
  {
    BlockingScope blocking;
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return completed_.load() >= target; });
    err = error_;
    q = error_queue_;
    error_.reset();
    error_queue_ = nullptr;
  }
  if (err) {
    if (q) q->clear_error_if(err.get());
    throw Error(ErrorCode::kKernelFailed, err->describe(), err->category);
  }
}

uint64_t Event::record_external() { return recorded_.fetch_add(1) + 1; }

void Event::complete_external(uint64_t version) { complete(version, now_ns(), nullptr, nullptr); }

void Event::block(Queue& q) {
  const uint64_t v = recorded_.load();
  if (v == 0) return;  // never recorded: nothing to wait for (CUDA semantics)
  q.wait(shared_from_this(), v);
}

double Event::elapsed_ms(const Event& start, const Event& end) {
  if (!start.timing_ || !end.timing_)
    throw Error(ErrorCode::kInvalidArgument,
                "elapsed_time needs both events created with enable_timing=True");
  if (start.recorded_.load() == 0 || end.recorded_.load() == 0)
    throw Error(ErrorCode::kInvalidArgument,
                "elapsed_time needs both events recorded first (event.record())");
  if (!start.query() || !end.query())
    throw Error(ErrorCode::kInvalidArgument,
                "elapsed_time needs both events completed: call end_event.synchronize() first");
  // One lock at a time: nesting them deadlocks elapsed_ms(a, b) against a
  // concurrent elapsed_ms(b, a).
  int64_t t0, t1;
  {
    std::lock_guard<std::mutex> a(start.mu_);
    t0 = start.timestamp_ns_;
  }
  {
    std::lock_guard<std::mutex> b(end.mu_);
    t1 = end.timestamp_ns_;
  }
  return static_cast<double>(t1 - t0) / 1e6;
}

void Event::complete(uint64_t version, int64_t ts_ns, std::shared_ptr<const TaskError> err, Queue* q) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    // Only the newest record defines the event: an older record (re-recorded
    // on another queue) that completes late must not move completed_ back,
    // and a record's error (or its absence) replaces the previous record's.
    if (version > completed_.load(std::memory_order_relaxed)) {
      timestamp_ns_ = ts_ns;
      error_ = std::move(err);
      error_queue_ = error_ ? q : nullptr;
      completed_.store(version, std::memory_order_release);
    }
  }
  cv_.notify_all();
  Engine::wake_all();
}

}  // namespace neuronx::rt
