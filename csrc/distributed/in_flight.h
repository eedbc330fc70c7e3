#pragma once
// The state of one collective call, and the memory of a group's collectives
// in flight: the transport runs several collectives at once, so one on
// memory an earlier one still uses waits for it (allreduce(x) twice would
// otherwise race).
#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace neuronx::distributed {

// Shared by the Work a caller holds, the task on the collective queue and
// the completion: whether the collective finished, and how.
struct CollectiveState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  // Point-to-point: the transport operation once issued (it completes on its own).
  bool issued = false;
  c10::intrusive_ptr<c10d::Work> transport;
  std::exception_ptr error;
  std::string message;
  int source_rank = -1;

  void finish(std::exception_ptr e, std::string msg, int src) {
    {
      std::lock_guard<std::mutex> g(mu);
      done = true;
      error = std::move(e);
      message = std::move(msg);
      source_rank = src;
    }
    cv.notify_all();
  }
  bool finished() {
    std::lock_guard<std::mutex> g(mu);
    return done;
  }
  void wait_finished() {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return done; });
  }
};

// The memory of the group's collectives that have been issued and not finished.
class InFlight {
 public:
  using Ranges = std::vector<std::pair<uintptr_t, uintptr_t>>;
  // Waits for the collectives in flight on memory overlapping `ranges`, then
  // registers this one (`state`), which later ones on that memory wait for.
  void admit(const Ranges& ranges, std::shared_ptr<CollectiveState> state);
  // Waits without registering: for sends and receives, whose completion is
  // the caller's host wait (registering them would make collectives wait for it).
  void wait_overlapping(const Ranges& ranges);
  // Waits for every collective in flight (a barrier orders after all of them).
  void wait_all();

 private:
  std::vector<std::shared_ptr<CollectiveState>> overlapping(const Ranges& ranges);  // mu_ held
  std::mutex mu_;
  std::vector<std::pair<Ranges, std::shared_ptr<CollectiveState>>> entries_;
};

// The byte ranges `ts` address (from the first to the last element of each).
InFlight::Ranges memory_ranges(const std::vector<at::Tensor>& ts);

}  // namespace neuronx::distributed
