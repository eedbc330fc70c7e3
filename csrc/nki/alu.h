#pragma once
// The engines' arithmetic: ALU operators (tensor_tensor, tensor_scalar),
// activation functions (Scalar Engine) and reduce operators, by their NKI
// names. Arithmetic is fp32; bitwise operators work on integers.
#include <ATen/core/Tensor.h>

#include <string>

namespace neuronx::nki {

enum class Reduce : uint8_t { kAdd, kMax, kMin, kMul, kAbsMax };

bool is_alu_op(const std::string& name);
bool is_activation(const std::string& name);
bool is_reduce_op(const std::string& name);
Reduce reduce_op(const std::string& name);
// Python-facing lists of the names (for error messages and docs).
std::string alu_op_names();
std::string activation_names();

at::Tensor alu(const std::string& op, const at::Tensor& a, const at::Tensor& b);
at::Tensor activation(const std::string& fn, const at::Tensor& x, double alpha);
// The Scalar Engine's valid input range of an activation function (|x| for
// reciprocal); false for functions defined on every value.
bool activation_range(const std::string& fn, double& lo, double& hi, bool& magnitude);

}  // namespace neuronx::nki
