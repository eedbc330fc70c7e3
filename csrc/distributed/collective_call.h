#pragma once
// One collective call of the neuron c10d backend, and how it runs: a task
// on the device's collective queue (served by its own engine, so
// communication overlaps compute) that waits for the work queued so far on
// the caller's current stream, checks the call against the other ranks'
// (fingerprint.h), waits for collectives in flight on the same memory
// (in_flight.h), then issues it to the transport (Gloo, handed CPU aliases
// of the device buffers: zero copy, device memory is host-addressable in
// the simulator) or to an algorithm of our own; the completer finishes it.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "distributed/direct_algorithms.h"
#include "distributed/fingerprint.h"

namespace neuronx::rt {
class Queue;
}

namespace neuronx::distributed {

class Completer;
class InFlight;
class PeerLink;

// What every collective of a group uses: rank, transports, completion
// thread, the fingerprint sequence and the memory in flight.
struct GroupContext {
  int rank;
  c10::intrusive_ptr<c10d::Backend> transport, control;
  std::shared_ptr<Completer> completer;
  std::shared_ptr<Sequencer> sequencer;
  std::shared_ptr<InFlight> in_flight;
  std::shared_ptr<BufferPool> buffers;
  std::chrono::milliseconds timeout;
  std::shared_ptr<PeerLink> peers;  // peer access (peer_access.h); null where Gloo moves every byte
};

// Where a call runs: the neuron device of its tensors, or (CPU tensors) the
// current device's collective queue with a host wait.
struct Placement {
  c10::DeviceIndex device;
  bool on_host;
};

// Checks what every tensor of one call must satisfy, on the calling thread,
// so that a bad call raises there, on the rank that made it (`name`: the
// collective as the user called it).
Placement place(const char* name, const std::vector<at::Tensor>& ts);
// A root rank outside the group raises at the call (Gloo would raise on the collective queue,
// where the error surfaces only at the next synchronization).
void check_root(const char* name, int64_t root, int size);

// CPU aliases of device tensors (the transport's view of them).
std::vector<at::Tensor> cpu_aliases(const std::vector<at::Tensor>& ts);
std::vector<std::vector<at::Tensor>> cpu_aliases(const std::vector<std::vector<at::Tensor>>& lists);
std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& lists);

// Starts the data movement, on the collective queue: the transport's
// operation or one of our own algorithms.
using Issue = std::function<c10::intrusive_ptr<c10d::Work>(c10d::Backend& transport, const DirectContext& ctx)>;
// Runs after the data has moved, on the completing thread (AVG's scaling).
using Post = std::function<void()>;

struct CollectiveCall {
  c10d::OpType type;
  const char* name;  // the queue task's and the Work's ("c10d::broadcast")
  Placement where;
  std::vector<at::Tensor> tensors;  // all it touches: kept alive until it completes; their memory orders it
  std::vector<at::Tensor> outputs;  // Work::result()
  std::optional<Fingerprint> fingerprint;  // none: point-to-point, not checked against other ranks
  Issue issue;
  Post post = nullptr;
};

// Queues `call` on `ordering` (the group's collective queue) after the work
// queued so far on the caller's current stream.
c10::intrusive_ptr<c10d::Work> launch(const GroupContext& group, rt::Queue& ordering, CollectiveCall call);

}  // namespace neuronx::distributed
