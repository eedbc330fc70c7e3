#pragma once
// c10d backend "neuron": collectives on neuron tensors. How one call runs is
// in collective_call.h; the Work it returns, in neuron_work.h.
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace neuronx::rt {
class Queue;
}

namespace neuronx::distributed {

class Completer;
class Sequencer;
class InFlight;
class PeerLink;
class BufferPool;
struct CollectiveCall;

class ProcessGroupNeuron final : public c10d::Backend {
 public:
  // `transport`: a Gloo backend over the same store, rank and size, that
  // moves the data. `control`: a second one, on its own connections, for the
  // fingerprint exchange that precedes each collective; on the data
  // connections it would queue behind the previous collective's bytes.
  ProcessGroupNeuron(c10::intrusive_ptr<c10d::Backend> transport, c10::intrusive_ptr<c10d::Backend> control,
                     int rank, int size, std::chrono::milliseconds timeout);

  const std::string getBackendName() const override { return "neuron"; }
  bool supportsCoalescing() const override { return false; }
  void setTimeout(std::chrono::milliseconds timeout) override;
  c10::intrusive_ptr<Options> getBackendOptions() override;

  // Subgroups (DeviceMesh dimensions of a group bound to a device): a new
  // backend over a new transport among `ranks` only; other ranks take no part.
  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;
  void setSequenceNumberForGroup() override { transport_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return transport_->getSequenceNumberForGroup(); }
  // The transport connects when it is created: nothing to do eagerly.
  void eagerConnectSingleDevice(at::Device device) override {}

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  ~ProcessGroupNeuron() override;
  c10::intrusive_ptr<c10d::Backend> transport() const { return transport_; }
  // Whether the ranks reach each other's device memory directly (peer_access.h).
  bool peer_access() const { return peers_ != nullptr; }

  // At interpreter exit (atexit, Python still alive): destroys every group's
  // transport, with the GIL released so its threads can drop the Python
  // objects they hold. Left to the interpreter's teardown, a transport thread
  // would take the GIL during finalization and abort the process.
  static void shutdown_all();

  // Makes the (data, control) transports of a new group over `store`: Gloo,
  // made in Python (the Gloo headers are not part of the torch wheel), so the
  // bindings set it. split() uses it.
  using TransportFactory = std::function<std::pair<c10::intrusive_ptr<c10d::Backend>, c10::intrusive_ptr<c10d::Backend>>(
      const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout)>;
  static void set_transport_factory(TransportFactory make);

 private:
  c10::intrusive_ptr<c10d::Work> allreduce_impl(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts,
                                                bool coalesced);

  // Every collective of the group goes through one queue (the collective
  // queue of the first device it used), whatever the tensors' device or the
  // calling thread: the transport must see them in program order.
  rt::Queue& ordering_queue(c10::DeviceIndex device);
  c10::intrusive_ptr<c10d::Work> run(CollectiveCall call);

  c10::intrusive_ptr<c10d::Backend> transport_;
  c10::intrusive_ptr<c10d::Backend> control_;
  std::chrono::milliseconds timeout_;
  std::mutex split_mu_;
  c10::intrusive_ptr<c10d::Store> last_split_store_;  // keeps the key's identity alive
  std::vector<int> last_split_ranks_;
  c10::intrusive_ptr<c10d::Backend> last_split_;
  std::atomic<int> queue_device_{-1};
  std::shared_ptr<Completer> completer_;
  std::shared_ptr<Sequencer> sequencer_;
  std::shared_ptr<InFlight> in_flight_;
  std::shared_ptr<BufferPool> buffers_;
  std::shared_ptr<PeerLink> peers_;
};

}  // namespace neuronx::distributed
