#pragma once
// Device kernels that run in place of an op's CPU kernel and give its exact results (the same
// values, the same bits), faster: named in the fallback's policy table (fallback_policy.h), run by
// the eager fallback (op_kernel.cpp) and by compiled graphs' library calls (executable_run.cpp).
// Each checks itself once per process against ATen's CPU kernel on a probe and steps aside for
// good if they differ (ATen's CPU kernels take other algorithms on some CPUs).
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

namespace neuronx {

// Writes the op's results into `outs` (self for an in-place op; the new outputs of a functional
// one, allocated with the geometry the meta kernel gives) from the op's arguments (CPU aliases, a
// generator resolved to the CPU generator). False when it does not apply (a layout, a dtype or an
// argument it does not take): then ATen's CPU kernel runs.
using DeviceKernel = bool (*)(c10::ArrayRef<at::Tensor> outs, c10::ArrayRef<c10::IValue> args);

// random_kernels.cpp. bernoulli_(p) / bernoulli(self, p) with a float p: element i is 1 when the
// i-th 53-bit uniform of the mt19937 stream (two 32-bit draws) is below p, as ATen's CPU kernel
// computes it, but generating the stream 624 words at a time instead of one call per draw.
bool bernoulli_scalar_kernel(c10::ArrayRef<at::Tensor> outs, c10::ArrayRef<c10::IValue> args);

// pooling_kernels.cpp. max_pool2d_with_indices over a contiguous (N)CHW float input: ATen's NCHW
// kernel walks every window with generic index arithmetic (4 ns per input element here).
bool max_pool2d_kernel(c10::ArrayRef<at::Tensor> outs, c10::ArrayRef<c10::IValue> args);

// max_pool2d_with_indices_backward over disjoint windows (stride = kernel: 2x2 pooling), (N)CHW
// or channels-last: ATen's kernel zero-fills the gradient and then scatters into it; here each
// element is written once, gathered from its window. Steps aside when an index lies outside its
// window (indices not from the forward).
bool max_pool2d_backward_kernel(c10::ArrayRef<at::Tensor> outs, c10::ArrayRef<c10::IValue> args);

}  // namespace neuronx
