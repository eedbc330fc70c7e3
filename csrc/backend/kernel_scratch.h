#pragma once
// The host memory ATen's CPU kernels allocate on the device's engine threads, kept and reused
// by size (kernel_scratch.cpp).

namespace neuronx {

// Makes the process's CPU allocator serve engine threads' blocks of 1 MiB and more from a cache
// (other threads and smaller blocks: the allocator it replaces). Idempotent.
void install_kernel_scratch_allocator();

// Returns the idle cached blocks to the system (torch.neuron.empty_cache()).
void empty_kernel_scratch();

}  // namespace neuronx
