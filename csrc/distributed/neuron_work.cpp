#include "distributed/neuron_work.h"

#include <torch/csrc/distributed/c10d/exception.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>

#include "backend/common.h"
#include "runtime/event.h"
#include "runtime/queue.h"

namespace neuronx::distributed {

namespace {

class NeuronWork final : public c10d::Work {
 public:
  NeuronWork(int rank, c10d::OpType type, const char* name, std::shared_ptr<CollectiveState> state,
             std::shared_ptr<rt::Event> done, c10::DeviceIndex device, bool on_host,
             std::vector<at::Tensor> outputs, c10::intrusive_ptr<c10::ivalue::Future> future)
      : c10d::Work(rank, type, name),
        state_(std::move(state)),
        done_(std::move(done)),
        device_(device),
        on_host_(on_host),
        outputs_(std::move(outputs)),
        future_(std::move(future)) {}

  bool isCompleted() override {
    std::lock_guard<std::mutex> g(state_->mu);
    return state_->done || (state_->issued && state_->transport->isCompleted());
  }
  bool isSuccess() const override {
    std::lock_guard<std::mutex> g(state_->mu);
    return state_->done && !state_->error;
  }
  std::exception_ptr exception() const override {
    std::lock_guard<std::mutex> g(state_->mu);
    return state_->error;
  }
  int sourceRank() const override {
    std::lock_guard<std::mutex> g(state_->mu);
    return state_->source_rank;
  }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  // The caller's current stream waits for the collective; a failed collective
  // fails that stream (its next synchronization raises the error).
  void synchronize() override {
    if (p2p()) {
      wait_p2p(kNoTimeout);
      return;
    }
    rt::Queue& q = current_queue(device_);
    translate([&] {
      done_->block(q);
      q.launch(std::make_unique<rt::FunctionKernel>("c10d::wait", [state = state_] {
        std::lock_guard<std::mutex> g(state->mu);
        if (state->error) throw std::runtime_error(state->message);
      }));
    });
  }

  bool wait(std::chrono::milliseconds timeout) override {
    if (p2p()) return wait_p2p(timeout);
    // A barrier is a host synchronization point; so is a wait with a timeout,
    // and so is a collective on CPU tensors.
    if (on_host_ || retrieveOpType() == c10d::OpType::BARRIER || timeout != kNoTimeout) host_wait(timeout);
    {
      std::lock_guard<std::mutex> g(state_->mu);
      if (state_->done && state_->error) throw_error();
    }
    if (!on_host_) synchronize();
    return true;
  }

 private:
  bool p2p() const {
    const auto t = retrieveOpType();
    return t == c10d::OpType::SEND || t == c10d::OpType::RECV || t == c10d::OpType::RECVANYSOURCE;
  }

  // Sends and receives are issued by the collective queue without blocking it
  // (a rank's send and its receive must both be posted for either to finish,
  // as in batch_isend_irecv); their wait() blocks the host like Gloo's.
  bool wait_p2p(std::chrono::milliseconds timeout) {
    // The timeout covers the whole wait: a transfer may wait to be issued
    // behind collectives still running on the queue.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    c10::intrusive_ptr<c10d::Work> transport;
    {
      rt::BlockingScope blocking;
      std::unique_lock<std::mutex> lk(state_->mu);
      auto ready = [&] { return state_->issued || state_->done; };
      if (timeout == kNoTimeout) {
        state_->cv.wait(lk, ready);
      } else if (!state_->cv.wait_until(lk, deadline, ready)) {
        lk.unlock();
        throw_timeout(timeout, " (it was still waiting to be issued behind earlier collectives)");
      }
      if (state_->done) {
        if (state_->error) throw_error();
        return true;
      }
      transport = state_->transport;
    }
    if (timeout != kNoTimeout) {
      // Gloo reads 0 as "its default timeout": never pass less than 1 ms.
      timeout = std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                          deadline - std::chrono::steady_clock::now()));
    }
    try {
      rt::BlockingScope blocking;
      transport->wait(timeout);
    } catch (const std::exception& e) {
      std::string msg = std::string("neuron ") + c10d::opTypeToString(retrieveOpType()) + " failed: " + e.what();
      auto eptr = std::make_exception_ptr(c10::DistBackendError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, msg));
      state_->finish(eptr, msg, -1);
      if (!future_->completed()) future_->setError(eptr);
      throw_error();
    }
    const int src = retrieveOpType() == c10d::OpType::SEND ? -1 : transport->sourceRank();
    state_->finish(nullptr, "", src);
    if (!future_->completed()) future_->markCompleted(c10::IValue(outputs_));
    return true;
  }

  void host_wait(std::chrono::milliseconds timeout) {
    rt::BlockingScope blocking;  // releases the GIL while we wait
    std::unique_lock<std::mutex> lk(state_->mu);
    if (timeout == kNoTimeout) {
      state_->cv.wait(lk, [&] { return state_->done; });
    } else if (!state_->cv.wait_for(lk, timeout, [&] { return state_->done; })) {
      lk.unlock();
      throw_timeout(timeout, "");
    }
  }
  [[noreturn]] void throw_error() const { C10_THROW_ERROR(DistBackendError, state_->message); }
  [[noreturn]] void throw_timeout(std::chrono::milliseconds timeout, const std::string& why) const {
    C10_THROW_ERROR(DistBackendError, "neuron " + c10d::opTypeToString(retrieveOpType()) + " did not complete within the " +
                                          std::to_string(timeout.count()) + " ms passed to wait()" + why);
  }

  std::shared_ptr<CollectiveState> state_;
  std::shared_ptr<rt::Event> done_;
  c10::DeviceIndex device_;
  const bool on_host_;  // CPU tensors: wait() blocks until the data is there
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace

c10::intrusive_ptr<c10d::Work> make_work(int rank, c10d::OpType type, const char* name,
                                         std::shared_ptr<CollectiveState> state, std::shared_ptr<rt::Event> done,
                                         c10::DeviceIndex device, bool on_host, std::vector<at::Tensor> outputs,
                                         c10::intrusive_ptr<c10::ivalue::Future> future) {
  return c10::make_intrusive<NeuronWork>(rank, type, name, std::move(state), std::move(done), device, on_host,
                                         std::move(outputs), std::move(future));
}

}  // namespace neuronx::distributed
