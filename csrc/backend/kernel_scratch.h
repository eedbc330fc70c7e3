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
  int64_t placed = 0;             // allocations served from memory lent (ScratchPlacement)
};

// Makes the process's CPU allocator serve engine threads' blocks of 1 MiB and more from a cache
// (other threads and smaller blocks: the allocator it replaces). Idempotent.
void install_kernel_scratch_allocator();

// While one lives on a thread, the first CPU allocation there of exactly `bytes` bytes is served
// from `memory` (and not freed with its tensor): a library call without an out= overload computes
// its result straight into the memory chosen for it (a compiled graph's output). Whatever took
// it, the caller checks where the result landed.
class ScratchPlacement {
 public:
  ScratchPlacement(void* memory, size_t bytes);
  ~ScratchPlacement();
  ScratchPlacement(const ScratchPlacement&) = delete;
  ScratchPlacement& operator=(const ScratchPlacement&) = delete;
  bool taken() const { return taken_; }
  size_t bytes() const { return bytes_; }
  void* memory() const { return memory_; }
  void* take() {
    taken_ = true;
    return memory_;
  }

 private:
  void* memory_;
  size_t bytes_;
  bool taken_ = false;
  ScratchPlacement* outer_;
};

// Returns the idle cached blocks to the system (torch.neuron.empty_cache()).
void empty_kernel_scratch();

// torch_neuronx.metrics()["kernel_scratch"].
KernelScratchStats kernel_scratch_stats();

}  // namespace neuronx
