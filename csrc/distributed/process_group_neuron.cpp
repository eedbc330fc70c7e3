#include "distributed/process_group_neuron.h"

#include <ATen/ops/empty.h>

#include <algorithm>

#include "backend/common.h"
#include "distributed/collective_call.h"
#include "distributed/completer.h"
#include "distributed/in_flight.h"
#include "distributed/peer_access.h"
#include "distributed/peer_algorithms.h"
#include "distributed/reduce_ops.h"

namespace neuronx::distributed {

namespace {
std::mutex g_groups_mu;
std::vector<ProcessGroupNeuron*> g_groups;  // live groups
bool g_shut_down = false;
ProcessGroupNeuron::TransportFactory g_make_transports;
}  // namespace

ProcessGroupNeuron::~ProcessGroupNeuron() {
  std::lock_guard<std::mutex> g(g_groups_mu);
  g_groups.erase(std::remove(g_groups.begin(), g_groups.end(), this), g_groups.end());
}

void ProcessGroupNeuron::shutdown_all() {
  // Released after unlocking: a split group held only here unregisters
  // itself in its destructor, which takes the lock.
  std::vector<c10::intrusive_ptr<c10d::Backend>> transports;
  std::vector<c10::intrusive_ptr<c10d::Store>> stores;
  {
    std::lock_guard<std::mutex> g(g_groups_mu);
    g_shut_down = true;
    for (ProcessGroupNeuron* pg : g_groups) {
      transports.push_back(std::move(pg->transport_));
      transports.push_back(std::move(pg->control_));
      transports.push_back(std::move(pg->last_split_));
      stores.push_back(std::move(pg->last_split_store_));
    }
  }
  transports.clear();  // the caller has released the GIL
  stores.clear();
}

void ProcessGroupNeuron::set_transport_factory(TransportFactory make) {
  std::lock_guard<std::mutex> g(g_groups_mu);
  g_make_transports = std::move(make);
}

ProcessGroupNeuron::ProcessGroupNeuron(c10::intrusive_ptr<c10d::Backend> transport,
                                       c10::intrusive_ptr<c10d::Backend> control, int rank, int size,
                                       std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size),
      transport_(std::move(transport)),
      control_(std::move(control)),
      timeout_(timeout),
      completer_(std::make_shared<Completer>()),
      sequencer_(std::make_shared<Sequencer>()),
      in_flight_(std::make_shared<InFlight>()),
      buffers_(std::make_shared<BufferPool>()) {
  TORCH_CHECK_VALUE(transport_, "ProcessGroupNeuron needs a transport backend");
  TORCH_CHECK_VALUE(transport_->getRank() == rank && transport_->getSize() == size,
                    "ProcessGroupNeuron: transport is rank ", transport_->getRank(), " of ", transport_->getSize(),
                    ", expected rank ", rank, " of ", size);
  TORCH_CHECK_VALUE(control_ && control_->getRank() == rank && control_->getSize() == size,
                    "ProcessGroupNeuron: the control transport must be a backend of the same ranks");
  // Collective: every rank creates the group at the same point.
  peers_ = PeerLink::negotiate(*control_);
  // Registered last: a constructor that throws runs no destructor to unregister.
  std::lock_guard<std::mutex> g(g_groups_mu);
  TORCH_CHECK(!g_shut_down, "the neuron distributed backend was shut down (interpreter exit)");
  g_groups.push_back(this);
}

c10::intrusive_ptr<c10d::Backend::Options> ProcessGroupNeuron::getBackendOptions() {
  return c10::make_intrusive<Options>("neuron", timeout_);
}

void ProcessGroupNeuron::setTimeout(std::chrono::milliseconds timeout) {
  timeout_ = timeout;
  transport_->setTimeout(timeout);
  control_->setTimeout(timeout);
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupNeuron::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                            const std::vector<int>& ranks,
                                                            const c10::intrusive_ptr<Options>& opts) {
  // One backend serves both device types of the group (neuron and cpu), and
  // the parent's splitGroup may ask each of them: the second call for the
  // same split (same store) returns the first result instead of creating a
  // second transport on the same store keys.
  std::lock_guard<std::mutex> g(split_mu_);
  if (last_split_store_.get() == store.get() && last_split_ranks_ == ranks) return last_split_;
  const auto it = std::find(ranks.begin(), ranks.end(), getRank());
  if (it == ranks.end()) return nullptr;
  const int rank = static_cast<int>(it - ranks.begin());
  const int size = static_cast<int>(ranks.size());
  const auto timeout = opts ? opts->timeout : timeout_;
  TransportFactory make;
  {
    std::lock_guard<std::mutex> lg(g_groups_mu);
    make = g_make_transports;
  }
  TORCH_CHECK(make, "ProcessGroupNeuron::split: no transport factory (import torch_neuronx.distributed first)");
  auto [transport, control] = make(store, rank, size, timeout);
  last_split_store_ = store;
  last_split_ranks_ = ranks;
  last_split_ = c10::make_intrusive<ProcessGroupNeuron>(transport, control, rank, size, timeout);
  return last_split_;
}

// Every collective of the group goes through one queue (the collective queue
// of the first device it used), whatever the tensors' device or the calling
// thread: the transport must see them in program order.
rt::Queue& ProcessGroupNeuron::ordering_queue(c10::DeviceIndex device) {
  TORCH_CHECK(transport_, "neuron process group used after the interpreter began to exit");
  int expected = -1;
  queue_device_.compare_exchange_strong(expected, device);
  return runtime_device(static_cast<c10::DeviceIndex>(queue_device_.load())).collective_queue();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::run(CollectiveCall call) {
  rt::Queue& ordering = ordering_queue(call.where.device);
  return launch({rank_, transport_, control_, completer_, sequencer_, in_flight_, buffers_, timeout_, peers_}, ordering,
                std::move(call));
}

namespace {
// The tensors of a call with list arguments, outputs first.
std::vector<at::Tensor> joined(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  std::vector<at::Tensor> out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

// AVG's division, after the transfer, on every tensor of `ts`.
Post averaging(std::vector<at::Tensor> ts, const c10d::ReduceOp& op, int size) {
  if (op != c10d::ReduceOp::AVG) return nullptr;
  return [ts = std::move(ts), op, size]() mutable {
    for (auto& t : ts) average(op, t, size);
  };
}

c10d::ReduceScatterOptions on_transport(c10d::ReduceScatterOptions o) {
  o.reduceOp = transport_op(o.reduceOp);
  return o;
}
}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::broadcast(std::vector<at::Tensor>& tensors,
                                                             const c10d::BroadcastOptions& opts) {
  check_root("broadcast", opts.rootRank, size_);
  const Placement where = place("broadcast", tensors);
  auto h = cpu_aliases(tensors);
  return run({c10d::OpType::BROADCAST, "c10d::broadcast", where, tensors, tensors,
              fingerprint(c10d::OpType::BROADCAST, tensors, opts.rootRank),
              [h, opts](c10d::Backend& g, const DirectContext& ctx) mutable {
                if (h.size() == 1 && peer_access_applies(ctx, h[0]))
                  return peer_broadcast(ctx, h[0], static_cast<int>(opts.rootRank));
                return g.broadcast(h, opts);
              }});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::allreduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  return allreduce_impl(tensors, opts, /*coalesced=*/false);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                       const c10d::AllreduceCoalescedOptions& opts) {
  return allreduce_impl(tensors, opts, /*coalesced=*/true);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::allreduce_impl(std::vector<at::Tensor>& tensors,
                                                                  const c10d::AllreduceOptions& opts, bool coalesced) {
  const char* name = coalesced ? "allreduce_coalesced" : "allreduce";
  const auto type = coalesced ? c10d::OpType::ALLREDUCE_COALESCED : c10d::OpType::ALLREDUCE;
  const Placement where = place(name, tensors);
  check_reduce_op(name, opts.reduceOp, tensors);
  auto h = cpu_aliases(tensors);
  return run({type, coalesced ? "c10d::allreduce_coalesced" : "c10d::allreduce", where, tensors, tensors,
              fingerprint(type, tensors, -1, opts.reduceOp.op_),
              [h, opts, coalesced](c10d::Backend& g, const DirectContext& ctx) mutable {
                for (auto& t : h) premultiply(opts.reduceOp, t);
                if (coalesced) {
                  c10d::AllreduceCoalescedOptions o;
                  o.reduceOp = transport_op(opts.reduceOp);
                  o.timeout = opts.timeout;
                  return g.allreduce_coalesced(h, o);
                }
                c10d::AllreduceOptions o = opts;
                o.reduceOp = transport_op(opts.reduceOp);
                if (h.size() == 1 && reducible(h[0], o.reduceOp) && peer_access_applies(ctx, h[0]))
                  return peer_allreduce(ctx, h[0], o.reduceOp);
                if (h.size() == 1 && direct_allreduce_applies(h[0], o.reduceOp))
                  return direct_allreduce(ctx, h[0], o.reduceOp);
                return g.allreduce(h, o);
              },
              averaging(h, opts.reduceOp, size_)});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::reduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  check_root("reduce", opts.rootRank, size_);
  const Placement where = place("reduce", tensors);
  check_reduce_op("reduce", opts.reduceOp, tensors);
  auto h = cpu_aliases(tensors);
  return run({c10d::OpType::REDUCE, "c10d::reduce", where, tensors, tensors,
              fingerprint(c10d::OpType::REDUCE, tensors, opts.rootRank, opts.reduceOp.op_),
              [h, opts](c10d::Backend& g, const DirectContext&) mutable {
                for (auto& t : h) premultiply(opts.reduceOp, t);
                c10d::ReduceOptions o = opts;
                o.reduceOp = transport_op(opts.reduceOp);
                return g.reduce(h, o);
              },
              opts.rootRank == rank_ ? averaging(h, opts.reduceOp, size_) : nullptr});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllgatherOptions& opts) {
  auto all = joined(flatten(outputs), inputs);
  const Placement where = place("allgather", all);
  auto ho = cpu_aliases(outputs);
  auto hi = cpu_aliases(inputs);
  return run({c10d::OpType::ALLGATHER, "c10d::allgather", where, all, flatten(outputs),
              fingerprint(c10d::OpType::ALLGATHER, inputs),
              [ho, hi, opts](c10d::Backend& g, const DirectContext&) mutable { return g.allgather(ho, hi, opts); }});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                   const c10d::AllgatherOptions& opts) {
  std::vector<at::Tensor> all{output, input};
  const Placement where = place("all_gather_into_tensor", all);
  // Checked here, on every rank, before anything moves: the transfers would
  // otherwise fill part of the output, or fail inside the transport.
  TORCH_CHECK_VALUE(output.scalar_type() == input.scalar_type(), "all_gather_into_tensor: the output is ",
                    output.scalar_type(), " and the input ", input.scalar_type(), "; they must have the same dtype");
  TORCH_CHECK_VALUE(output.numel() == input.numel() * size_, "all_gather_into_tensor: the output has ", output.numel(),
                    " elements; it must have world size (", size_, ") x the input's ", input.numel());
  at::Tensor ho = cpu_aliases({output})[0], hi = cpu_aliases({input})[0];
  return run({c10d::OpType::_ALLGATHER_BASE, "c10d::all_gather_into_tensor", where, all, {output},
              fingerprint(c10d::OpType::_ALLGATHER_BASE, {input}),
              [ho, hi, opts](c10d::Backend& g, const DirectContext& ctx) mutable {
                if (peer_access_applies(ctx, hi)) return peer_allgather(ctx, ho, hi);
                if (direct_allgather_applies(ho, hi)) return direct_allgather(ctx, ho, hi);
                return g._allgather_base(ho, hi, opts);
              }});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  auto all = joined(flatten(outputs), inputs);
  const Placement where = place("allgather_coalesced", all);
  auto ho = cpu_aliases(outputs);
  auto hi = cpu_aliases(inputs);
  return run({c10d::OpType::ALLGATHER_COALESCED, "c10d::allgather_coalesced", where, all, flatten(outputs),
              fingerprint(c10d::OpType::ALLGATHER_COALESCED, inputs),
              [ho, hi, opts](c10d::Backend& g, const DirectContext&) mutable {
                return g.allgather_coalesced(ho, hi, opts);
              }});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  auto all = joined(outputs, inputs);
  const Placement where = place("allgather_into_tensor_coalesced", all);
  auto ho = cpu_aliases(outputs);
  auto hi = cpu_aliases(inputs);
  return run({c10d::OpType::COALESCED, "c10d::allgather_into_tensor_coalesced", where, all, outputs,
              fingerprint(c10d::OpType::COALESCED, inputs),
              [ho, hi, opts](c10d::Backend& g, const DirectContext&) mutable {
                return g.allgather_into_tensor_coalesced(ho, hi, opts);
              }});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::GatherOptions& opts) {
  auto all = joined(flatten(outputs), inputs);
  check_root("gather", opts.rootRank, size_);
  const Placement where = place("gather", all);
  auto ho = cpu_aliases(outputs);
  auto hi = cpu_aliases(inputs);
  return run({c10d::OpType::GATHER, "c10d::gather", where, all, flatten(outputs),
              fingerprint(c10d::OpType::GATHER, inputs, opts.rootRank),
              [ho, hi, opts](c10d::Backend& g, const DirectContext&) mutable { return g.gather(ho, hi, opts); }});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::scatter(std::vector<at::Tensor>& outputs,
                                                           std::vector<std::vector<at::Tensor>>& inputs,
                                                           const c10d::ScatterOptions& opts) {
  auto all = joined(flatten(inputs), outputs);
  check_root("scatter", opts.rootRank, size_);
  const Placement where = place("scatter", all);
  auto ho = cpu_aliases(outputs);
  auto hi = cpu_aliases(inputs);
  return run({c10d::OpType::SCATTER, "c10d::scatter", where, all, outputs,
              fingerprint(c10d::OpType::SCATTER, outputs, opts.rootRank),
              [ho, hi, opts](c10d::Backend& g, const DirectContext&) mutable { return g.scatter(ho, hi, opts); }});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                                  const c10d::ReduceScatterOptions& opts) {
  auto all = joined(flatten(inputs), outputs);
  const Placement where = place("reduce_scatter", all);
  check_reduce_op("reduce_scatter", opts.reduceOp, all);
  auto ho = cpu_aliases(outputs);
  auto hi = cpu_aliases(inputs);
  return run({c10d::OpType::REDUCE_SCATTER, "c10d::reduce_scatter", where, all, outputs,
              fingerprint(c10d::OpType::REDUCE_SCATTER, outputs, -1, opts.reduceOp.op_),
              [ho, hi, opts](c10d::Backend& g, const DirectContext&) mutable {
                std::vector<std::vector<at::Tensor>> in;
                for (auto& l : hi) in.push_back(premultiplied(opts.reduceOp, l));
                return g.reduce_scatter(ho, in, on_transport(opts));
              },
              averaging(ho, opts.reduceOp, size_)});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                        const c10d::ReduceScatterOptions& opts) {
  std::vector<at::Tensor> all{output, input};
  const Placement where = place("reduce_scatter_tensor", all);
  check_reduce_op("reduce_scatter_tensor", opts.reduceOp, all);
  // Checked here, on every rank, before anything moves (as all_gather_into_tensor's output).
  TORCH_CHECK_VALUE(output.scalar_type() == input.scalar_type(), "reduce_scatter_tensor: the output is ",
                    output.scalar_type(), " and the input ", input.scalar_type(), "; they must have the same dtype");
  TORCH_CHECK_VALUE(input.numel() == output.numel() * size_, "reduce_scatter_tensor: the input has ", input.numel(),
                    " elements; it must have world size (", size_, ") x the output's ", output.numel());
  at::Tensor ho = cpu_aliases({output})[0], hi = cpu_aliases({input})[0];
  return run({c10d::OpType::_REDUCE_SCATTER_BASE, "c10d::reduce_scatter_tensor", where, all, {output},
              fingerprint(c10d::OpType::_REDUCE_SCATTER_BASE, {output}, -1, opts.reduceOp.op_),
              [ho, hi, opts](c10d::Backend& g, const DirectContext& ctx) mutable {
                at::Tensor in = premultiplied(opts.reduceOp, {hi})[0];
                const c10d::ReduceScatterOptions o = on_transport(opts);
                if (reducible(ho, o.reduceOp) && peer_access_applies(ctx, ho))
                  return peer_reduce_scatter(ctx, ho, in, o.reduceOp);
                return g._reduce_scatter_base(ho, in, o);
              },
              averaging({ho}, opts.reduceOp, size_)});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  auto all = joined(outputs, inputs);
  const Placement where = place("reduce_scatter_tensor_coalesced", all);
  check_reduce_op("reduce_scatter_tensor_coalesced", opts.reduceOp, all);
  auto ho = cpu_aliases(outputs);
  auto hi = cpu_aliases(inputs);
  return run({c10d::OpType::COALESCED, "c10d::reduce_scatter_tensor_coalesced", where, all, outputs,
              fingerprint(c10d::OpType::COALESCED, outputs, -1, opts.reduceOp.op_),
              [ho, hi, opts](c10d::Backend& g, const DirectContext&) mutable {
                auto in = premultiplied(opts.reduceOp, hi);
                return g.reduce_scatter_tensor_coalesced(ho, in, on_transport(opts));
              },
              averaging(ho, opts.reduceOp, size_)});
}

namespace {
// Element counts an all_to_all_single moves per peer (splits count rows;
// none: equal parts).
std::vector<int64_t> split_counts(const at::Tensor& t, const std::vector<int64_t>& splits, int size) {
  TORCH_CHECK_VALUE(splits.empty() || static_cast<int>(splits.size()) == size, "all_to_all_single: expected ", size,
                    " split sizes, got ", splits.size());
  const int64_t rows = t.dim() > 0 ? t.size(0) : 1, row = rows > 0 ? t.numel() / rows : 0;
  std::vector<int64_t> c(size);
  int64_t total = 0;
  for (int j = 0; j < size; ++j) {
    c[j] = (splits.empty() ? rows / size : splits[j]) * row;
    total += splits.empty() ? rows / size : splits[j];
  }
  TORCH_CHECK_VALUE(splits.empty() ? rows % size == 0 : total == rows, "all_to_all_single: ",
                    splits.empty() ? "without split sizes, dim 0 (" + std::to_string(rows) +
                                         ") must divide by the world size (" + std::to_string(size) + ")"
                                   : "the split sizes add up to " + std::to_string(total) + ", not dim 0 (" +
                                         std::to_string(rows) + ")");
  return c;
}
}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                 std::vector<int64_t>& output_splits,
                                                                 std::vector<int64_t>& input_splits,
                                                                 const c10d::AllToAllOptions& opts) {
  std::vector<at::Tensor> all{output, input};
  const Placement where = place("all_to_all_single", all);
  at::Tensor ho = cpu_aliases({output})[0], hi = cpu_aliases({input})[0];
  const auto sends = split_counts(input, input_splits, size_), receives = split_counts(output, output_splits, size_);
  TORCH_CHECK_VALUE(sends[rank_] == receives[rank_], "all_to_all_single: this rank sends itself ", sends[rank_],
                    " elements but expects ", receives[rank_]);
  return run({c10d::OpType::ALLTOALL_BASE, "c10d::all_to_all_single", where, all, {output},
              split_signature(fingerprint(c10d::OpType::ALLTOALL_BASE, {input}), rank_, sends, receives),
              [ho, hi, output_splits, input_splits, opts](c10d::Backend& g, const DirectContext&) mutable {
                return g.alltoall_base(ho, hi, output_splits, input_splits, opts);
              }});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::alltoall(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllToAllOptions& opts) {
  TORCH_CHECK_VALUE(static_cast<int>(outputs.size()) == size_ && static_cast<int>(inputs.size()) == size_,
                    "all_to_all: expected one input and one output tensor per rank (", size_, "), got ", inputs.size(),
                    " inputs and ", outputs.size(), " outputs");
  auto all = joined(outputs, inputs);
  for (const auto& t : all)
    TORCH_CHECK_VALUE(t.scalar_type() == inputs[0].scalar_type(), "all_to_all: every tensor must have the dtype ",
                      inputs[0].scalar_type(), ", got one of ", t.scalar_type());
  const Placement where = place("all_to_all", all);
  auto ho = cpu_aliases(outputs);
  auto hi = cpu_aliases(inputs);
  std::vector<int64_t> sends, receives;
  for (int j = 0; j < size_; ++j) {
    sends.push_back(inputs[j].numel());
    receives.push_back(outputs[j].numel());
  }
  TORCH_CHECK_VALUE(sends[rank_] == receives[rank_], "all_to_all: this rank's input for itself has ", sends[rank_],
                    " elements, its output for itself ", receives[rank_]);
  return run({c10d::OpType::ALLTOALL, "c10d::all_to_all", where, all, outputs,
              split_signature(fingerprint(c10d::OpType::ALLTOALL, inputs), rank_, sends, receives),
              [ho, hi, opts](c10d::Backend& g, const DirectContext& ctx) mutable {
                if (direct_alltoall_applies(ho, hi)) return direct_alltoall(ctx, ho, hi);
                return g.alltoall(ho, hi, opts);
              }});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  const Placement where = place("send", tensors);
  auto h = cpu_aliases(tensors);
  return run({c10d::OpType::SEND, "c10d::send", where, tensors, tensors, std::nullopt,
              [h, dst, tag](c10d::Backend& g, const DirectContext&) mutable { return g.send(h, dst, tag); }});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  const Placement where = place("recv", tensors);
  auto h = cpu_aliases(tensors);
  return run({c10d::OpType::RECV, "c10d::recv", where, tensors, tensors, std::nullopt,
              [h, src, tag](c10d::Backend& g, const DirectContext&) mutable { return g.recv(h, src, tag); }});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  const Placement where = place("recv", tensors);
  auto h = cpu_aliases(tensors);
  return run({c10d::OpType::RECVANYSOURCE, "c10d::recv", where, tensors, tensors, std::nullopt,
              [h, tag](c10d::Backend& g, const DirectContext&) mutable {
                // Gloo's receive from any source rejects an empty buffer; an
                // empty message fits in a 1-byte one (the work holds it).
                if (h.size() == 1 && h[0].numel() == 0) {
                  std::vector<at::Tensor> scratch{at::empty({1}, at::kByte)};
                  return g.recvAnysource(scratch, tag);
                }
                return g.recvAnysource(h, tag);
              }});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::barrier(const c10d::BarrierOptions& opts) {
  // Ordered after the current stream's queued work, then every rank meets.
  return run({c10d::OpType::BARRIER, "c10d::barrier", {current_device(), /*on_host=*/true}, {}, {},
              fingerprint(c10d::OpType::BARRIER, {}),
              [opts](c10d::Backend& g, const DirectContext&) mutable {
                c10d::BarrierOptions o = opts;
                o.device_ids.clear();  // the transport's barrier is device-free
                return g.barrier(o);
              }});
}

}  // namespace neuronx::distributed
