#pragma once
// A traced program as a torch op: nki::launch(Tensor(a!)[] hbm, int program)
// has a CPU kernel that runs the program over its HBM tensors, so on neuron
// tensors it is one task on the current stream (the fallback queues it like
// any op, in stream order, visible to the profiler).
#include <cstdint>
#include <memory>

#include "nki/program.h"

namespace neuronx::nki {

// Registers p for launches; the id stays valid for the process (programs are
// cached per kernel signature, so this set is bounded by those).
int64_t register_program(std::shared_ptr<const Program> p);
std::shared_ptr<const Program> registered_program(int64_t id);

}  // namespace neuronx::nki
