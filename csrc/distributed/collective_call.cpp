#include "distributed/collective_call.h"

#include <c10/core/InferenceMode.h>
#include <torch/csrc/distributed/c10d/exception.h>

#include "backend/common.h"
#include "backend/tensor_views.h"
#include "distributed/completer.h"
#include "distributed/neuron_work.h"
#include "runtime/event.h"
#include "runtime/queue.h"

namespace neuronx::distributed {

namespace {
bool on_neuron(const at::Tensor& t) { return t.defined() && t.device().type() == kNeuron; }

// A transport's error in words: c10::Error's message without the C++ backtrace it carries.
std::string message_of(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}
}  // namespace

void check_root(const char* name, int64_t root, int size) {
  TORCH_CHECK(root >= 0 && root < size, name, ": invalid root rank ", root, " (the group has ", size,
              " ranks, 0 to ", size - 1, ")");
}

std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<at::Tensor> out;
  for (const auto& l : lists) out.insert(out.end(), l.begin(), l.end());
  return out;
}

std::vector<at::Tensor> cpu_aliases(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  // Fresh TensorImpls (no Python object): the transport may drop its last
  // reference on its own threads, even while the interpreter shuts down.
  // Normal tensors even when the caller is in inference mode: the transport
  // and the completer update them in place on threads that are not.
  c10::InferenceMode normal(false);
  for (const auto& t : ts) out.push_back(cpu_alias(t));
  return out;
}

std::vector<std::vector<at::Tensor>> cpu_aliases(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<std::vector<at::Tensor>> out;
  out.reserve(lists.size());
  for (const auto& l : lists) out.push_back(cpu_aliases(l));
  return out;
}

// What every tensor of one collective call must satisfy, checked on the
// calling thread so a bad call raises there, on the rank that made it.
Placement place(const char* name, const std::vector<at::Tensor>& ts) {
  bool any_neuron = false, any_cpu = false;
  for (const auto& t : ts) {
    TORCH_CHECK_VALUE(t.defined(), name, ": got an undefined tensor");
    if (on_neuron(t)) any_neuron = true;
    else if (t.is_cpu()) any_cpu = true;
    else TORCH_CHECK_VALUE(false, name, ": the neuron backend takes neuron (or CPU) tensors, got one on ", t.device());
  }
  TORCH_CHECK_VALUE(!(any_neuron && any_cpu), name,
                    ": got a mix of neuron and CPU tensors; move them to one device first");
  // CPU tensors take the same path (the same queue, so every collective of
  // the group reaches the transport in program order); their wait() blocks.
  if (!any_neuron) return {current_device(), /*on_host=*/true};
  c10::DeviceIndex device = -1;
  for (const auto& t : ts) {
    TORCH_CHECK_VALUE(t.layout() == c10::kStrided, name, ": sparse neuron tensors are not supported by collectives");
    TORCH_CHECK_VALUE(t.is_non_overlapping_and_dense(), name,
                      ": neuron collectives need dense tensors; call .contiguous() first");
    if (device < 0) device = t.device().index();
    TORCH_CHECK_VALUE(t.device().index() == device, name, ": tensors are on neuron:", device, " and ", t.device(),
                      "; one collective runs on one device");
  }
  return {device, /*on_host=*/false};
}

namespace {

// One collective from the queue task that issues it to the completion that
// finishes it (on the completer's thread, or the transport's).
// It holds no reference to the group: the completion may be the last to go,
// on the completer's own thread.
struct QueuedCall {
  c10d::OpType type;
  const char* name;
  uint64_t seq;
  bool checked;  // has a fingerprint to check (point-to-point has none)
  InFlight::Ranges ranges;
  Issue start;
  Post post;
  std::shared_ptr<CollectiveState> state;
  c10::intrusive_ptr<c10::ivalue::Future> future;
  std::vector<at::Tensor> outputs, keep;
  // Completed by the host when the transport has finished (not when the
  // queue passes it): the collective queue only *issues* collectives, in
  // program order, and the transport runs several at once.
  std::shared_ptr<rt::Event> done;
  uint64_t done_version;
  std::shared_ptr<QueuedCollective> queued;

  bool p2p() const {
    return type == c10d::OpType::SEND || type == c10d::OpType::RECV || type == c10d::OpType::RECVANYSOURCE;
  }

  // A failure is the collective's result, raised by wait() and on the
  // streams that wait for it.
  void fail(const std::string& what) const {
    std::string msg = std::string("neuron collective ") + name + " failed: " + what;
    auto eptr =
        std::make_exception_ptr(c10::DistBackendError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, msg));
    state->finish(eptr, msg, -1);
    if (!future->completed()) future->setError(eptr);
    done->complete_external(done_version);
  }

  // On the collective queue. Never throws: the queue stays usable for the
  // collectives that follow.
  static void issue(const std::shared_ptr<QueuedCall>& self, const GroupContext& group) {
    QueuedCall& c = *self;
    // Released when this returns, whatever the path: by then the collective
    // failed, is a host-waited transfer, or is the completer's.
    const auto queued_until_return = std::move(c.queued);
    const Issue start = std::move(c.start);  // its CPU aliases go with this thread's return
    c10::intrusive_ptr<c10d::Work> w;
    try {
      if (c.checked) group.sequencer->check(c.seq, *group.control);
      if (c.type == c10d::OpType::BARRIER) group.in_flight->wait_all();  // as a stream-ordered barrier would
      if (c.p2p()) {
        group.in_flight->wait_overlapping(c.ranges);
      } else if (!c.ranges.empty()) {
        group.in_flight->admit(c.ranges, c.state);
      }
      w = start(*group.transport, DirectContext{group.control.get(), group.buffers, c.seq, group.rank,
                                                    group.control->getSize(), group.timeout, group.peers});
    } catch (const std::exception& e) {
      return c.fail(message_of(e));
    }
    if (c.p2p()) {
      {
        std::lock_guard<std::mutex> g(c.state->mu);
        c.state->transport = w;
        c.state->issued = true;
      }
      c.state->cv.notify_all();
      c.done->complete_external(c.done_version);  // p2p waits are host waits (NeuronWork::wait_p2p)
      return;
    }
    // Gloo's allreduce completes its future when the data is in place. Not
    // every Gloo work does: reduce_scatter_tensor's does its last copy in
    // wait() and never completes a future, so the others are waited for on
    // the completer's thread.
    const bool on_future = c.type == c10d::OpType::ALLREDUCE;
    try {
      group.completer->add(std::move(w), [self](const std::string* error) { self->complete(error); }, on_future);
    } catch (const std::exception& e) {  // the queue must go on with the collectives after it
      return c.fail(message_of(e));
    }
  }

  // The scaling step (AVG), then the work's state, its future and the
  // device-side event. The caller's tensors (with their Python objects) are
  // released here, before the caller can see completion, never afterwards
  // by the thread running this (possibly during interpreter exit).
  void complete(const std::string* error) {
    std::string what = error ? *error : "";
    if (!error) {
      try {
        if (post) post();
      } catch (const std::exception& e) {
        what = message_of(e);
        error = &what;
      }
    }
    post = nullptr;
    keep.clear();
    if (error) {
      outputs.clear();
      return fail(what);
    }
    future->markCompleted(c10::IValue(std::move(outputs)));
    outputs.clear();
    state->finish(nullptr, "", -1);
    done->complete_external(done_version);
  }
};

}  // namespace

c10::intrusive_ptr<c10d::Work> launch(const GroupContext& group, rt::Queue& coll, CollectiveCall call) {
  auto c = std::make_shared<QueuedCall>();
    c->type = call.type;
  c->name = call.name;
  c->checked = call.fingerprint.has_value();
  c->ranges = memory_ranges(call.tensors);
  c->start = std::move(call.issue);
  c->post = std::move(call.post);
  c->state = std::make_shared<CollectiveState>();
  c->future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  c->outputs = call.outputs;
  c->keep = std::move(call.tensors);
  c->done = rt::Event::create(/*timing=*/false);
  c->done_version = c->done->record_external();
  c->queued = std::make_shared<QueuedCollective>();
  rt::Queue& compute = current_queue(call.where.device);
  // Sequence numbers are taken in the order the collectives reach the queue.
  std::lock_guard<std::mutex> order(group.sequencer->order_mu);
  c->seq = call.fingerprint ? group.sequencer->add(*call.fingerprint) : 0;
  translate([&] {
    auto ready = rt::Event::create(false);
    ready->record(compute);
    ready->block(coll);
    coll.launch(std::make_unique<rt::FunctionKernel>(call.name, [c, group] { QueuedCall::issue(c, group); }));
  });
  return make_work(group.rank, call.type, call.name, c->state, c->done, call.where.device, call.where.on_host,
                   std::move(call.outputs), c->future);
}

}  // namespace neuronx::distributed
