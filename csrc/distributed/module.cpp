// Python bindings of the neuron c10d backend (torch_neuronx._C._distributed).
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>

#include "distributed/process_group_neuron.h"

namespace py = pybind11;

namespace neuronx::distributed {

void bind(py::module& parent) {
  // The base class is torch's binding of c10d::Backend: make sure it is loaded.
  py::module::import("torch._C._distributed_c10d");
  py::module m = parent.def_submodule("_distributed", "c10d backend 'neuron'");
  m.def("_drain", [](double seconds) {
    return Completer::drain(std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
  }, py::call_guard<py::gil_scoped_release>());
  m.def("_shutdown", &ProcessGroupNeuron::shutdown_all, py::call_guard<py::gil_scoped_release>());
  py::class_<ProcessGroupNeuron, c10d::Backend, c10::intrusive_ptr<ProcessGroupNeuron>>(m, "ProcessGroupNeuron")
      .def(py::init([](const c10::intrusive_ptr<c10d::Backend>& transport,
                       const c10::intrusive_ptr<c10d::Backend>& control, int rank, int size,
                       std::chrono::milliseconds timeout) {
             return c10::make_intrusive<ProcessGroupNeuron>(transport, control, rank, size, timeout);
           }),
           py::arg("transport"), py::arg("control"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("transport", &ProcessGroupNeuron::transport)
      .def_property_readonly("peer_access", &ProcessGroupNeuron::peer_access,
                             "Whether the ranks move data straight between each other's device memory (one host)")
      // NCCL's split needs every parent rank; a new transport needs only the members.
      .def("perform_nocolor_split", [](ProcessGroupNeuron&, const c10::Device&) {})
      // split_group copies the parent's Python-side options; ours has none beyond
      // the timeout, which split() takes from getBackendOptions().
      .def_property_readonly("options", [](ProcessGroupNeuron&) { return py::none(); });
}

// Creates the transport of a subgroup (Gloo, made in Python as for the
// group itself: the Gloo headers are not part of the torch wheel).
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
  c10::intrusive_ptr<c10d::Backend> transport, control;
  {
    py::gil_scoped_acquire gil;
    py::object make = py::module::import("torch_neuronx.distributed").attr("_transports");
    auto pair = make(store, rank, size, timeout).cast<std::pair<c10::intrusive_ptr<c10d::Backend>,
                                                                c10::intrusive_ptr<c10d::Backend>>>();
    transport = pair.first;
    control = pair.second;
  }
  last_split_store_ = store;
  last_split_ranks_ = ranks;
  last_split_ = c10::make_intrusive<ProcessGroupNeuron>(transport, control, rank, size, timeout);
  return last_split_;
}

}  // namespace neuronx::distributed
