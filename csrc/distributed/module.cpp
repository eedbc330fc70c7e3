// Python bindings of the neuron c10d backend (torch_neuronx._C._distributed).
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include "backend/bindings.h"
#include "distributed/completer.h"
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
  // Subgroups' transports are made in Python, as the group's own are.
  ProcessGroupNeuron::set_transport_factory([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                               std::chrono::milliseconds timeout) {
    py::gil_scoped_acquire gil;
    py::object make = py::module::import("torch_neuronx.distributed").attr("_transports");
    return make(store, rank, size, timeout)
        .cast<std::pair<c10::intrusive_ptr<c10d::Backend>, c10::intrusive_ptr<c10d::Backend>>>();
  });
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

}  // namespace neuronx::distributed
