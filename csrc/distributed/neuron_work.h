#pragma once
// The Work a neuron collective returns. wait() makes the caller's current
// stream wait for the collective instead of blocking the host, as NCCL does
// (a failed collective fails that stream); sends, receives, barriers, CPU
// tensors and waits with a timeout block the host, as Gloo's do.
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <memory>
#include <vector>

#include "distributed/in_flight.h"

namespace neuronx::rt {
class Event;
}

namespace neuronx::distributed {

// `state`: the collective's outcome; `done`: the event completed when the
// transport has finished; `device`: whose current stream wait() orders;
// `on_host`: CPU tensors (wait() blocks until the data is there).
c10::intrusive_ptr<c10d::Work> make_work(int rank, c10d::OpType type, const char* name,
                                         std::shared_ptr<CollectiveState> state, std::shared_ptr<rt::Event> done,
                                         c10::DeviceIndex device, bool on_host, std::vector<at::Tensor> outputs,
                                         c10::intrusive_ptr<c10::ivalue::Future> future);

}  // namespace neuronx::distributed
