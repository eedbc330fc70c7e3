#pragma once
// Device kernels for random ops that draw exactly what ATen's CPU kernels draw (the same mt19937
// stream, in the same order, so neuron and CPU give the same values for the same seed) at a
// fraction of their cost: ATen's kernel advances the generator one call per draw; these generate
// the stream in blocks.
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

namespace neuronx {

// Writes the op's result into `out` (self for an in-place op; the new output for a functional
// one) from the op's arguments (CPU aliases, the CPU generator resolved). False when it does not
// apply (a layout, a dtype or an argument it does not take): then ATen's CPU kernel runs.
using DeviceKernel = bool (*)(const at::Tensor& out, c10::ArrayRef<c10::IValue> args);

// bernoulli_(p) / bernoulli(self, p) with a float p: element i is 1 when the i-th 53-bit uniform
// of the stream (two 32-bit draws) is below p, as ATen's CPU kernel computes it.
bool bernoulli_scalar_kernel(const at::Tensor& out, c10::ArrayRef<c10::IValue> args);

}  // namespace neuronx
