#include "compiler/scalar_ops.h"

#include <ATen/ops/scalar_tensor.h>

#include <algorithm>
#include <cmath>

namespace neuronx::compiler {

double as_double(const c10::IValue& v) {
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isBool()) return v.toBool() ? 1.0 : 0.0;
  if (v.isTensor() && v.toTensor().numel() == 1) return v.toTensor().item<double>();
  TORCH_CHECK(false, "torch_neuronx compiler: expected a number, got ", v.tagKind());
}

c10::IValue wrapped_number(const c10::IValue& v) {
  at::Tensor t = v.isDouble() ? at::scalar_tensor(v.toDouble(), at::kDouble)
                 : v.isBool() ? at::scalar_tensor(v.toBool(), at::kBool)
                              : at::scalar_tensor(v.toInt(), at::kLong);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return c10::IValue(t);
}

}  // namespace neuronx::compiler
