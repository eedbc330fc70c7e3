// histc on integer tensors. CUDA counts integer inputs directly (and
// Hugging Face's MoE routing relies on it for every non-CPU device); ATen's
// CPU kernel takes floating point only. Counting the values as double is
// exact for every int32 and for int64 up to 2^53, and the counts come back
// in the input's dtype, as on CUDA.
#include <ATen/ops/histc.h>
#include <torch/library.h>

#include "backend/common.h"
#include "backend/op_kernel.h"

namespace neuronx {

namespace {

at::Tensor integral_histc(const at::Tensor& self, int64_t bins, const c10::Scalar& min, const c10::Scalar& max) {
  return at::histc(self.to(at::kDouble), bins, min, max).to(self.scalar_type());
}

void histc(const c10::OperatorHandle& op, c10::Stack* stack) {
  const at::Tensor self = (*stack)[stack->size() - 4].toTensor();
  if (!c10::isIntegralType(self.scalar_type(), /*includeBool=*/false)) return neuron_fallback(op, stack);
  const auto bins = (*stack)[stack->size() - 3].toInt();
  const auto min = (*stack)[stack->size() - 2].toScalar();
  const auto max = (*stack)[stack->size() - 1].toScalar();
  torch::jit::drop(*stack, 4);
  stack->emplace_back(integral_histc(self, bins, min, max));
}

void histc_out(const c10::OperatorHandle& op, c10::Stack* stack) {
  const at::Tensor self = (*stack)[stack->size() - 5].toTensor();
  if (!c10::isIntegralType(self.scalar_type(), /*includeBool=*/false)) return neuron_fallback(op, stack);
  at::Tensor out = (*stack)[stack->size() - 1].toTensor();
  TORCH_CHECK(out.scalar_type() == self.scalar_type(), "torch.histc: input tensor and hist tensor should have the "
              "same dtype, but got input ", self.scalar_type(), " and hist ", out.scalar_type());
  const at::Tensor r = integral_histc(self, (*stack)[stack->size() - 4].toInt(), (*stack)[stack->size() - 3].toScalar(),
                                      (*stack)[stack->size() - 2].toScalar());
  out.resize_(r.sizes());
  out.copy_(r);
  torch::jit::drop(*stack, 5);
  stack->emplace_back(out);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("histc", torch::CppFunction::makeFromBoxedFunction<&histc>());
  m.impl("histc.out", torch::CppFunction::makeFromBoxedFunction<&histc_out>());
}

}  // namespace neuronx
