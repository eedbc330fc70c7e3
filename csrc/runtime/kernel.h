#pragma once
// What a queue executes. The runtime sees a kernel as a named unit of work;
// the layer above subclasses it with the op and its operands, so queued work
// stays inspectable (the adaptive-eager tier reads it before it runs).
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
  FunctionKernel(const char* name, std::function<void()> fn) : name_(name), fn_(std::move(fn)) {}
  void run() override { fn_(); }
  const char* name() const override { return name_; }

 private:
  const char* name_;
  std::function<void()> fn_;
};

}  // namespace neuronx::rt
