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

namespace {
bool is_int(const c10::IValue& v) { return v.isInt() || v.isBool(); }

c10::IValue number(double x, bool integral) {
  return integral ? c10::IValue(static_cast<int64_t>(x)) : c10::IValue(x);
}
}  // namespace

// The scalar ops Dynamo leaves in graphs over symbolic sizes and floats.
c10::IValue scalar_op(const std::string& op, const std::vector<c10::IValue>& a) {
  auto ints = [&] {
    for (const auto& v : a)
      if (!is_int(v)) return false;
    return true;
  };
  auto x = [&](size_t i) { return as_double(a.at(i)); };
  if (op == "add") return number(x(0) + x(1), ints());
  if (op == "sub") return number(x(0) - x(1), ints());
  if (op == "mul") return number(x(0) * x(1), ints());
  if (op == "truediv") return c10::IValue(x(0) / x(1));
  if (op == "floordiv") return number(std::floor(x(0) / x(1)), ints());
  if (op == "mod") return number(x(0) - x(1) * std::floor(x(0) / x(1)), ints());
  if (op == "neg") return number(-x(0), ints());
  if (op == "pow") return number(std::pow(x(0), x(1)), ints() && x(1) >= 0);
  if (op == "sym_float") return c10::IValue(x(0));
  if (op == "sym_int" || op == "trunc") return c10::IValue(static_cast<int64_t>(std::trunc(x(0))));
  if (op == "floor") return c10::IValue(static_cast<int64_t>(std::floor(x(0))));
  if (op == "ceil") return c10::IValue(static_cast<int64_t>(std::ceil(x(0))));
  if (op == "sqrt") return c10::IValue(std::sqrt(x(0)));
  if (op == "sym_max") return number(std::max(x(0), x(1)), ints());
  if (op == "sym_min") return number(std::min(x(0), x(1)), ints());
  if (op == "eq") return c10::IValue(x(0) == x(1));
  if (op == "ne") return c10::IValue(x(0) != x(1));
  if (op == "lt") return c10::IValue(x(0) < x(1));
  if (op == "le") return c10::IValue(x(0) <= x(1));
  if (op == "gt") return c10::IValue(x(0) > x(1));
  if (op == "ge") return c10::IValue(x(0) >= x(1));
  TORCH_CHECK(false, "torch_neuronx compiler: no runtime support for the scalar op ", op);
}

c10::IValue wrapped_number(const c10::IValue& v) {
  at::Tensor t = v.isDouble() ? at::scalar_tensor(v.toDouble(), at::kDouble)
                 : v.isBool() ? at::scalar_tensor(v.toBool(), at::kBool)
                              : at::scalar_tensor(v.toInt(), at::kLong);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return c10::IValue(t);
}

}  // namespace neuronx::compiler
