#include "nki/alu.h"

#include "nki/fp8.h"

#include <cmath>

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <c10/util/Exception.h>

#include <functional>
#include <map>

namespace neuronx::nki {

namespace {

using Binary = std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>;
using Unary = std::function<at::Tensor(const at::Tensor&, double)>;

at::Tensor f32(const at::Tensor& t) { return to_f32(t); }
at::Tensor i64(const at::Tensor& t) {
  return t.to(at::kLong);
}
at::Tensor as_float(const at::Tensor& b) { return b.to(at::kFloat); }

const std::map<std::string, Binary>& alu_table() {
  static const std::map<std::string, Binary> t = {
      {"add", [](auto& a, auto& b) { return f32(a) + f32(b); }},
      {"subtract", [](auto& a, auto& b) { return f32(a) - f32(b); }},
      {"multiply", [](auto& a, auto& b) { return f32(a) * f32(b); }},
      {"divide", [](auto& a, auto& b) { return f32(a) / f32(b); }},
      {"maximum", [](auto& a, auto& b) { return at::maximum(f32(a), f32(b)); }},
      {"minimum", [](auto& a, auto& b) { return at::minimum(f32(a), f32(b)); }},
      {"power", [](auto& a, auto& b) { return at::pow(f32(a), f32(b)); }},
      {"mod", [](auto& a, auto& b) { return at::remainder(f32(a), f32(b)); }},
      {"fmod", [](auto& a, auto& b) { return at::fmod(f32(a), f32(b)); }},
      // |a| vs |b|, the signed value of the larger (smaller) magnitude
      {"abs_max", [](auto& a, auto& b) { return at::where(f32(a).abs() >= f32(b).abs(), f32(a), f32(b)); }},
      {"abs_min", [](auto& a, auto& b) { return at::where(f32(a).abs() <= f32(b).abs(), f32(a), f32(b)); }},
      {"bypass", [](auto& a, auto& b) { return f32(a); }},
      {"equal", [](auto& a, auto& b) { return as_float(at::eq(f32(a), f32(b))); }},
      {"not_equal", [](auto& a, auto& b) { return as_float(at::ne(f32(a), f32(b))); }},
      {"greater", [](auto& a, auto& b) { return as_float(at::gt(f32(a), f32(b))); }},
      {"greater_equal", [](auto& a, auto& b) { return as_float(at::ge(f32(a), f32(b))); }},
      {"less", [](auto& a, auto& b) { return as_float(at::lt(f32(a), f32(b))); }},
      {"less_equal", [](auto& a, auto& b) { return as_float(at::le(f32(a), f32(b))); }},
      {"logical_and", [](auto& a, auto& b) { return as_float(at::logical_and(f32(a), f32(b))); }},
      {"logical_or", [](auto& a, auto& b) { return as_float(at::logical_or(f32(a), f32(b))); }},
      {"logical_xor", [](auto& a, auto& b) { return as_float(at::logical_xor(f32(a), f32(b))); }},
      {"bitwise_and", [](auto& a, auto& b) { return at::bitwise_and(i64(a), i64(b)); }},
      {"bitwise_or", [](auto& a, auto& b) { return at::bitwise_or(i64(a), i64(b)); }},
      {"bitwise_xor", [](auto& a, auto& b) { return at::bitwise_xor(i64(a), i64(b)); }},
      {"left_shift", [](auto& a, auto& b) { return at::bitwise_left_shift(i64(a), i64(b)); }},
      {"right_shift", [](auto& a, auto& b) { return at::bitwise_right_shift(i64(a), i64(b)); }},
      // unary arithmetic operators: the operand is ignored (tensor_scalar(op0=nl.abs, operand0=0.0))
      {"abs", [](auto& a, auto&) { return at::abs(f32(a)); }},
      {"square", [](auto& a, auto&) { return at::square(f32(a)); }},
      {"relu", [](auto& a, auto&) { return at::relu(f32(a)); }},
      {"rsqrt", [](auto& a, auto&) { return at::rsqrt(f32(a)); }},
      {"reciprocal", [](auto& a, auto&) { return at::reciprocal(f32(a)); }},
      {"invert", [](auto& a, auto&) { return at::bitwise_not(i64(a)); }},
      {"bitwise_not", [](auto& a, auto&) { return at::bitwise_not(i64(a)); }},
  };
  return t;
}

at::Tensor gelu_tanh(const at::Tensor& x) { return at::gelu(x, "tanh"); }

const std::map<std::string, Unary>& activation_table() {
  static const std::map<std::string, Unary> t = {
      {"copy", [](auto& x, double) { return x; }},
      {"identity", [](auto& x, double) { return x; }},
      {"exp", [](auto& x, double) { return at::exp(x); }},
      {"log", [](auto& x, double) { return at::log(x); }},
      {"tanh", [](auto& x, double) { return at::tanh(x); }},
      {"sigmoid", [](auto& x, double) { return at::sigmoid(x); }},
      {"relu", [](auto& x, double) { return at::relu(x); }},
      {"leaky_relu", [](auto& x, double a) { return at::where(x >= 0, x, x * (a == 0.0 ? 0.01 : a)); }},
      {"prelu", [](auto& x, double a) { return at::where(x >= 0, x, x * a); }},
      {"gelu", [](auto& x, double) { return at::gelu(x); }},
      {"gelu_apprx_tanh", [](auto& x, double) { return gelu_tanh(x); }},
      {"gelu_apprx_sigmoid", [](auto& x, double) { return x * at::sigmoid(1.702 * x); }},
      {"gelu_apprx_sigmoid_dx", [](auto& x, double) {
         auto s = at::sigmoid(1.702 * x);
         return s + 1.702 * x * s * (1 - s);
       }},
      {"gelu_dx", [](auto& x, double) {
         return 0.5 * (1 + at::erf(x * M_SQRT1_2)) + x * at::exp(-0.5 * x * x) * (0.5 * M_2_SQRTPI * M_SQRT1_2);
       }},
      {"silu", [](auto& x, double) { return at::silu(x); }},
      {"silu_dx", [](auto& x, double) {
         auto s = at::sigmoid(x);
         return s * (1 + x * (1 - s));
       }},
      {"softplus", [](auto& x, double) { return at::softplus(x); }},
      {"mish", [](auto& x, double) { return x * at::tanh(at::softplus(x)); }},
      {"elu", [](auto& x, double a) { return at::elu(x, a == 0.0 ? 1.0 : a); }},
      {"rsqrt", [](auto& x, double) { return at::rsqrt(x); }},
      {"sqrt", [](auto& x, double) { return at::sqrt(x); }},
      {"square", [](auto& x, double) { return at::square(x); }},
      {"abs", [](auto& x, double) { return at::abs(x); }},
      {"negative", [](auto& x, double) { return at::neg(x); }},
      {"reciprocal", [](auto& x, double) { return at::reciprocal(x); }},
      {"sin", [](auto& x, double) { return at::sin(x); }},
      {"cos", [](auto& x, double) { return at::cos(x); }},
      {"tan", [](auto& x, double) { return at::tan(x); }},
      {"arctan", [](auto& x, double) { return at::atan(x); }},
      {"erf", [](auto& x, double) { return at::erf(x); }},
      {"erf_dx", [](auto& x, double) { return at::exp(-x * x) * M_2_SQRTPI; }},
      {"sign", [](auto& x, double) { return at::sign(x); }},
      {"ceil", [](auto& x, double) { return at::ceil(x); }},
      {"floor", [](auto& x, double) { return at::floor(x); }},
      {"trunc", [](auto& x, double) { return at::trunc(x); }},
      {"rint", [](auto& x, double) { return at::round(x); }},
      {"logical_not", [](auto& x, double) { return (x == 0).to(at::kFloat); }},
      {"bitwise_not", [](auto& x, double) { return at::bitwise_not(x.to(at::kLong)); }},
  };
  return t;
}

template <typename Map>
std::string names(const Map& m) {
  std::string s;
  for (const auto& [k, v] : m) s += (s.empty() ? "" : ", ") + k;
  return s;
}

}  // namespace

bool is_alu_op(const std::string& name) { return alu_table().count(name) != 0; }
bool is_activation(const std::string& name) { return activation_table().count(name) != 0; }
std::string alu_op_names() { return names(alu_table()); }
std::string activation_names() { return names(activation_table()); }

bool is_reduce_op(const std::string& name) {
  return name == "add" || name == "maximum" || name == "minimum" || name == "multiply" || name == "abs_max";
}

Reduce reduce_op(const std::string& name) {
  if (name == "add") return Reduce::kAdd;
  if (name == "maximum") return Reduce::kMax;
  if (name == "minimum") return Reduce::kMin;
  if (name == "multiply") return Reduce::kMul;
  if (name == "abs_max") return Reduce::kAbsMax;
  TORCH_CHECK(false, "'", name, "' is not a reduce operator (add, maximum, minimum, multiply, abs_max)");
}

at::Tensor alu(const std::string& op, const at::Tensor& a, const at::Tensor& b) {
  auto it = alu_table().find(op);
  TORCH_CHECK(it != alu_table().end(), "'", op, "' is not an ALU operator");
  return it->second(a, b);
}

at::Tensor activation(const std::string& fn, const at::Tensor& x, double alpha) {
  auto it = activation_table().find(fn);
  TORCH_CHECK(it != activation_table().end(), "'", fn, "' is not an activation function");
  return it->second(x, alpha);
}

bool activation_range(const std::string& fn, double& lo, double& hi, bool& magnitude) {
  // The NKI documentation's table of Scalar Engine input ranges.
  static const double kPi = 3.14159265358979323846;
  magnitude = false;
  if (fn == "log") {
    lo = std::ldexp(1.0, -64), hi = std::ldexp(1.0, 64);
  } else if (fn == "sin") {
    lo = -kPi, hi = kPi;
  } else if (fn == "arctan") {
    lo = -kPi / 2, hi = kPi / 2;
  } else if (fn == "sqrt") {
    lo = std::ldexp(1.0, -116), hi = std::ldexp(1.0, 118);
  } else if (fn == "rsqrt") {
    lo = std::ldexp(1.0, -87), hi = std::ldexp(1.0, 97);
  } else if (fn == "reciprocal") {
    lo = std::ldexp(1.0, -42), hi = std::ldexp(1.0, 42), magnitude = true;
  } else {
    return false;
  }
  return true;
}

}  // namespace neuronx::nki
