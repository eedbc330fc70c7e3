#pragma once
// Helpers shared by the runtime gtest files (not a test source: the CMake glob
// only picks up *.cpp).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/config.h"
#include "runtime/error.h"
#include "runtime/event.h"
#include "runtime/kernel.h"
#include "runtime/queue.h"

namespace neuronx::rt::testing {

using namespace std::chrono_literals;

inline std::unique_ptr<Kernel> fn(const char* name, std::function<void()> f) {
  return std::make_unique<FunctionKernel>(name, std::move(f));
}

inline std::unique_ptr<Kernel> failing(const char* name, const std::string& msg, uint64_t origin = 0) {
  auto k = std::make_unique<FunctionKernel>(name, [msg] { throw std::runtime_error(msg); });
  k->origin = origin;
  return k;
}

// A host-controlled barrier a kernel can block on. Copies share state, so a
// kernel may capture one by value; the last Gate object opens it on
// destruction so a failing test never leaves a worker blocked forever.
class Gate {
 public:
  Gate() : state_(std::make_shared<State>()) {}
  ~Gate() { open(); }
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  void open() {
    std::call_once(state_->once, [&] { state_->opened.set_value(); });
  }
  // Kernel that signals it started, then blocks until open().
  std::unique_ptr<Kernel> kernel(const char* name = "gate") {
    auto s = state_;
    return fn(name, [s] {
      std::call_once(s->started_once, [&] { s->started.set_value(); });
      s->opened_f.wait();
    });
  }
  // Waits (bounded) until the gate kernel is running on the engine.
  bool wait_started(std::chrono::milliseconds timeout = 5000ms) {
    return state_->started_f.wait_for(timeout) == std::future_status::ready;
  }

 private:
  struct State {
    std::promise<void> opened, started;
    std::shared_future<void> opened_f{opened.get_future().share()};
    std::shared_future<void> started_f{started.get_future().share()};
    std::once_flag once, started_once;
  };
  std::shared_ptr<State> state_;
};

// One engine and the queues it serves. The engine is destroyed (its worker
// joined) before the queues, since the worker walks its queue list. Declare a
// Rig before any Gate its kernels block on, so the Gate opens first.
class Rig {
 public:
  explicit Rig(int device = 0, const char* name = "test/compute", int64_t spin_ns = Engine::kDefaultSpinNs)
      : device_(device), engine_(std::make_unique<Engine>(device, name, spin_ns)) {}
  ~Rig() { engine_.reset(); }
  Rig(const Rig&) = delete;
  Rig& operator=(const Rig&) = delete;

  Queue& add(uint64_t id, int priority = 0) {
    queues_.push_back(std::make_unique<Queue>(engine_.get(), device_, id, priority));
    return *queues_.back();
  }
  Engine& engine() { return *engine_; }

 private:
  int device_;
  std::unique_ptr<Engine> engine_;
  std::vector<std::unique_ptr<Queue>> queues_;
};

// Runs f on a helper thread and fails the process (instead of hanging ctest)
// if it does not finish within `limit`.
inline void within(std::chrono::milliseconds limit, const std::function<void()>& f,
                   const char* what = "operation") {
  auto task = std::make_shared<std::packaged_task<void()>>(f);
  auto fut = task->get_future();
  std::thread t([task] { (*task)(); });
  if (fut.wait_for(limit) != std::future_status::ready) {
    std::fprintf(stderr, "FATAL: %s did not finish within %lld ms (deadlock?)\n", what,
                 static_cast<long long>(limit.count()));
    std::fflush(stderr);
    std::_Exit(3);
  }
  t.join();
  fut.get();  // rethrows
}

// Tests that block the engine on a gate need asynchronous launches.
#define SKIP_IF_LAUNCH_BLOCKING()                                               \
  do {                                                                          \
    if (::neuronx::rt::config().launch_blocking)                                \
      GTEST_SKIP() << "NEURON_LAUNCH_BLOCKING=1 in the environment";            \
  } while (0)

// EXPECT that `stmt` throws rt::Error with `code` and a message containing
// every string in `parts`.
#define EXPECT_RT_ERROR(stmt, code_, ...)                                                   \
  do {                                                                                      \
    bool thrown_ = false;                                                                   \
    try {                                                                                   \
      stmt;                                                                                 \
    } catch (const ::neuronx::rt::Error& e_) {                                              \
      thrown_ = true;                                                                       \
      EXPECT_EQ(static_cast<int>(e_.code()), static_cast<int>(code_)) << e_.what();         \
      for (const std::string& part_ : std::vector<std::string>{__VA_ARGS__})                \
        EXPECT_NE(std::string(e_.what()).find(part_), std::string::npos)                    \
            << "message lacks '" << part_ << "': " << e_.what();                            \
    } catch (const std::exception& e_) {                                                    \
      ADD_FAILURE() << "expected rt::Error, got std::exception: " << e_.what();             \
      thrown_ = true;                                                                       \
    }                                                                                       \
    EXPECT_TRUE(thrown_) << "expected rt::Error from: " #stmt;                              \
  } while (0)

}  // namespace neuronx::rt::testing
