// Convolutions on neuron: the generic eager path, entered through the
// *_overrideable ops that convolution() picks for backends other than CPU/CUDA.
#include <torch/library.h>

#include "backend/op_kernel.h"

namespace neuronx {

namespace {

// convolution() sends backends other than CPU/CUDA to the *_overrideable
// ops; on neuron they are the CPU convolution run on the queue.
void convolution_overrideable(const c10::OperatorHandle&, c10::Stack* stack) {
  static const auto conv = c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution", "");
  neuron_fallback(conv, stack);
}

void convolution_backward_overrideable(const c10::OperatorHandle&, c10::Stack* stack) {
  // (grad_output, input, weight, stride, padding, dilation, transposed,
  //  output_padding, groups, output_mask) -> convolution_backward, which also
  // takes the bias sizes after weight.
  static const auto bwd = c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution_backward", "");
  auto args = torch::jit::last(*stack, 10);
  const at::Tensor& weight = args[2].toTensor();
  const bool transposed = args[6].toBool();
  const int64_t groups = args[8].toInt();
  const int64_t out_channels = transposed ? weight.size(1) * groups : weight.size(0);
  stack->insert(stack->end() - 7, c10::IValue(std::vector<int64_t>{out_channels}));
  neuron_fallback(bwd, stack);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", torch::CppFunction::makeFromBoxedFunction<&convolution_overrideable>());
  m.impl("convolution_backward_overrideable",
         torch::CppFunction::makeFromBoxedFunction<&convolution_backward_overrideable>());
}

}  // namespace neuronx
