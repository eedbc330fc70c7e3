#pragma once
// The host memory ATen's CPU kernels allocate on the device's engine threads, kept and reused
// by size (kernel_scratch.cpp).

#include <cstddef>
#include <cstdint>

namespace neuronx {

struct KernelScratchStats {
  size_t idle_bytes = 0, idle_blocks = 0;
  int64_t fresh = 0, reused = 0;  // blocks served from the system / from the cache
  int64_t evicted_bytes = 0;      // idle blocks freed to make room (idle longest first)
};

// Makes the process's CPU allocator serve engine threads' blocks of 1 MiB and more from a cache
// (other threads and smaller blocks: the allocator it replaces). Idempotent.
void install_kernel_scratch_allocator();

// Returns the idle cached blocks to the system (torch.neuron.empty_cache()).
void empty_kernel_scratch();

// torch_neuronx.metrics()["kernel_scratch"].
KernelScratchStats kernel_scratch_stats();

}  // namespace neuronx
