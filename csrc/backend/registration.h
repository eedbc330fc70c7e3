#pragma once
// What the extension registers with PyTorch when it loads, one call per
// concern (run once, from torch_neuronx._C's module init).
namespace neuronx {

void register_hooks();              // PrivateUse1 hooks, device guard, allocator (hooks.cpp)
void register_direct_fallbacks();   // ops whose every call takes the fallback's direct route (fallback.cpp)
void register_sparse_kernels();     // sparse COO/CSR kernels (sparse.cpp)
void register_quantized_kernels();  // quantized tensors (quantized.cpp)
void init_autocast_dtype();         // autocast's default dtype for neuron (autocast.cpp)

}  // namespace neuronx
