#pragma once
// The Python bindings' entry points, one per layer: only the binding files of
// torch_neuronx._C (module.cpp of each layer, memory_snapshot.cpp) include
// this; the layers themselves never use Python.
#include <pybind11/pybind11.h>

namespace neuronx {
void bind_memory_snapshot(pybind11::module& m);  // torch.neuron.memory._snapshot and history recording
namespace compiler {
void bind(pybind11::module& parent);  // torch_neuronx._C._compiler
}
namespace distributed {
void bind(pybind11::module& parent);  // torch_neuronx._C._distributed
}
namespace nki {
void bind(pybind11::module& parent);  // torch_neuronx._C._nki
}
}  // namespace neuronx
