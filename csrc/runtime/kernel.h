#pragma once
// What a queue executes. The runtime sees a kernel as a named unit of work;
// the layer above subclasses it with the op and its operands, so queued work
// stays inspectable (the adaptive-eager tier reads it before it runs).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

namespace neuronx::rt {

class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual void run() = 0;
  virtual const char* name() const = 0;
  // Whether it may read or write device memory in [p, p + n) when it runs; true unless it knows.
  // (Adaptive eager asks, before a fused group skips writing a value, the kernels queued after it.)
  virtual bool may_touch(const void* p, size_t n) const {
    (void)p;
    (void)n;
    return true;
  }
  // Where the host enqueued this kernel: a token from the origin capture hook (queue.h), resolved
  // to "file.py:12" only when an error names it; 0 when unknown.
  uint64_t origin = 0;
  // Set at launch while a task observer is installed (profiling): the
  // launching host op's tag (its profiler correlation id) and the enqueue time.
  uint64_t correlation = 0;
  int64_t enqueue_ns = 0;
  // Set by a kernel that reported its steps (report_step) instead of itself.
  bool reported_steps = false;
};

// A kernel from a callable; used for copies, markers and tests.
class FunctionKernel final : public Kernel {
 public:
  // touches_memory: false for work that reads and writes no device memory (a sleep, a marker).
  FunctionKernel(const char* name, std::function<void()> fn, bool touches_memory = true)
      : name_(name), fn_(std::move(fn)), touches_memory_(touches_memory) {}
  void run() override { fn_(); }
  const char* name() const override { return name_; }
  bool may_touch(const void*, size_t) const override { return touches_memory_; }

 private:
  const char* name_;
  std::function<void()> fn_;
  bool touches_memory_;
};

}  // namespace neuronx::rt
