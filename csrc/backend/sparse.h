#pragma once
// Sparse COO tensors on neuron (see sparse.cpp).
#include "backend/common.h"

namespace neuronx {

// A neuron sparse COO tensor with the indices and values of a host one.
at::Tensor sparse_to_device(const at::Tensor& host, c10::DeviceIndex d);

}  // namespace neuronx
