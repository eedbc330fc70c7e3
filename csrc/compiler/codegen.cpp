#include "compiler/codegen.h"

#include <functional>
#include <iomanip>
#include <map>
#include <sstream>

namespace neuronx::compiler {

namespace {

bool same_sizes(const TensorMeta& a, const TensorMeta& b) {
  if (a.sizes.size() != b.sizes.size()) return false;
  for (size_t i = 0; i < a.sizes.size(); ++i)
    if (a.sizes[i].postfix != b.sizes[i].postfix) return false;
  return true;
}

bool supported_dtype(c10::ScalarType t) {
  return t == c10::ScalarType::Float || t == c10::ScalarType::BFloat16 || t == c10::ScalarType::Double;
}

const char* compute_type(c10::ScalarType t) { return t == c10::ScalarType::Double ? "double" : "float"; }

// A tensor operand of the node's shape and dtype.
bool tensor_operand(const Graph& g, const Arg& a, const TensorMeta& out) {
  if (a.kind != Arg::Kind::kValue) return false;
  const Value& v = g.values[a.value];
  return v.kind == Value::Kind::kTensor && v.meta && v.meta->dtype == out.dtype && same_sizes(*v.meta, out);
}

// A number: a constant, or a runtime scalar (a symbolic float or int input).
bool scalar_operand(const Graph& g, const Arg& a) {
  if (a.kind == Arg::Kind::kConstant)
    return a.constant.isDouble() || a.constant.isInt() || a.constant.isBool();
  return a.kind == Arg::Kind::kValue && g.values[a.value].kind == Value::Kind::kScalar;
}

bool operand(const Graph& g, const Arg& a, const TensorMeta& out) {
  return tensor_operand(g, a, out) || scalar_operand(g, a);
}

using Expr = std::function<std::string(const std::vector<std::string>&)>;

struct Lowering {
  int operands;  // leading args that are tensors or numbers
  Expr expr;     // scalar C++ over the operand expressions
  Expr vexpr;    // the same over at::vec::Vectorized operands (ATen's own vectorized math)
};

std::string call(const char* f, const std::string& x) { return std::string(f) + "(" + x + ")"; }

const std::map<std::string, Lowering>& table() {
  auto bin = [](const char* op) {
    return Expr([op](auto& o) { return "(" + o[0] + " " + op + " " + o[1] + ")"; });
  };
  auto alpha = [](const char* op) {
    return Expr([op](auto& o) { return "(" + o[0] + " " + op + " " + o[2] + " * " + o[1] + ")"; });
  };
  auto method = [](const char* m) {
    return Expr([m](auto& o) { return "(" + o[0] + ")." + m + "()"; });
  };
  static const auto* t = new std::map<std::string, Lowering>{
      {"aten::add.Tensor", {3, alpha("+"), alpha("+")}},
      {"aten::sub.Tensor", {3, alpha("-"), alpha("-")}},
      {"aten::add.Scalar", {3, alpha("+"), alpha("+")}},
      {"aten::sub.Scalar", {3, alpha("-"), alpha("-")}},
      {"aten::mul.Tensor", {2, bin("*"), bin("*")}},
      {"aten::mul.Scalar", {2, bin("*"), bin("*")}},
      {"aten::div.Tensor", {2, bin("/"), bin("/")}},
      {"aten::div.Scalar", {2, bin("/"), bin("/")}},
      {"aten::maximum", {2, [](auto& o) { return "nx_max(" + o[0] + ", " + o[1] + ")"; },
                         [](auto& o) { return "at::vec::maximum(" + o[0] + ", " + o[1] + ")"; }}},
      {"aten::minimum", {2, [](auto& o) { return "nx_min(" + o[0] + ", " + o[1] + ")"; },
                         [](auto& o) { return "at::vec::minimum(" + o[0] + ", " + o[1] + ")"; }}},
      {"aten::pow.Tensor_Scalar", {2, [](auto& o) { return "std::pow(" + o[0] + ", " + o[1] + ")"; },
                                   [](auto& o) { return "(" + o[0] + ").pow(" + o[1] + ")"; }}},
      {"aten::neg", {1, [](auto& o) { return "(-" + o[0] + ")"; }, method("neg")}},
      {"aten::abs", {1, [](auto& o) { return call("std::abs", o[0]); }, method("abs")}},
      {"aten::exp", {1, [](auto& o) { return call("std::exp", o[0]); }, method("exp")}},
      {"aten::log", {1, [](auto& o) { return call("std::log", o[0]); }, method("log")}},
      {"aten::sqrt", {1, [](auto& o) { return call("std::sqrt", o[0]); }, method("sqrt")}},
      {"aten::rsqrt", {1, [](auto& o) { return "(1 / std::sqrt(" + o[0] + "))"; }, method("rsqrt")}},
      {"aten::reciprocal", {1, [](auto& o) { return "(1 / " + o[0] + ")"; }, method("reciprocal")}},
      {"aten::sin", {1, [](auto& o) { return call("std::sin", o[0]); }, method("sin")}},
      {"aten::cos", {1, [](auto& o) { return call("std::cos", o[0]); }, method("cos")}},
      {"aten::tanh", {1, [](auto& o) { return call("std::tanh", o[0]); }, method("tanh")}},
      {"aten::erf", {1, [](auto& o) { return call("std::erf", o[0]); }, method("erf")}},
      {"aten::log1p", {1, [](auto& o) { return call("std::log1p", o[0]); }, method("log1p")}},
      {"aten::expm1", {1, [](auto& o) { return call("std::expm1", o[0]); }, method("expm1")}},
      {"aten::sigmoid", {1, [](auto& o) { return "(1 / (1 + std::exp(-" + o[0] + ")))"; },
                         [](auto& o) { return "(Vec(1) / (Vec(1) + (" + o[0] + ").neg().exp()))"; }}},
      {"aten::silu", {1, [](auto& o) { return "(" + o[0] + " / (1 + std::exp(-" + o[0] + ")))"; },
                      [](auto& o) { return "(" + o[0] + " / (Vec(1) + (" + o[0] + ").neg().exp()))"; }}},
      {"aten::relu", {1, [](auto& o) { return "nx_relu(" + o[0] + ")"; },
                      [](auto& o) { return "at::vec::clamp_min(" + o[0] + ", Vec(0))"; }}},
  };
  return *t;
}

std::string literal(const c10::IValue& v, const char* ct) {
  std::ostringstream os;
  os << std::setprecision(17);
  if (v.isDouble()) os << "(" << ct << ")" << v.toDouble();
  else if (v.isInt()) os << "(" << ct << ")" << v.toInt();
  else os << "(" << ct << ")" << (v.toBool() ? 1 : 0);
  return os.str();
}

}  // namespace

bool lowerable(const Graph& g, const Node& n) {
  if (n.kind != Node::Kind::kAten || n.outputs.size() != 1) return false;
  const Value& out = g.values[n.outputs[0]];
  if (out.kind != Value::Kind::kTensor || !out.meta || !supported_dtype(out.meta->dtype)) return false;
  if (n.target == "aten::gelu")
    return tensor_operand(g, n.args[0], *out.meta) && n.args[1].kind == Arg::Kind::kConstant;
  auto it = table().find(n.target);
  if (it == table().end()) return false;
  bool any_tensor = false;
  for (int i = 0; i < it->second.operands; ++i) {
    if (!operand(g, n.args[i], *out.meta)) return false;
    any_tensor = any_tensor || tensor_operand(g, n.args[i], *out.meta);
  }
  return any_tensor;
}

std::string kernel_prelude() {
  return R"(#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <cmath>
#include <cstdint>
#include <cstring>
static inline float nx_bf16_load(const uint16_t* p, int64_t i) {
  uint32_t u = static_cast<uint32_t>(p[i]) << 16; float f; std::memcpy(&f, &u, 4); return f;
}
static inline void nx_bf16_store(uint16_t* p, int64_t i, float f) {
  uint32_t u; std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) { p[i] = static_cast<uint16_t>((u >> 16) | 0x40u); return; }  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even, as c10::BFloat16
  p[i] = static_cast<uint16_t>(u >> 16);
}
template <typename T> static inline T nx_max(T a, T b) { return (a != a || b != b) ? a + b : (a > b ? a : b); }
template <typename T> static inline T nx_min(T a, T b) { return (a != a || b != b) ? a + b : (a < b ? a : b); }
template <typename T> static inline T nx_relu(T a) { return a > T(0) ? a : (a != a ? a : T(0)); }
)";
}

namespace {

std::string gelu_expr(const std::string& x, bool tanh_form, bool vec, const char* ct) {
  auto c = [&](const char* v) { return vec ? "Vec((" + std::string(ct) + ")" + v + ")" : "(" + std::string(ct) + ")" + v; };
  if (tanh_form) {
    const std::string inner = c("0.79788456080286535588") + " * (" + x + " + " + c("0.044715") + " * " + x + " * " + x +
                              " * " + x + ")";
    return c("0.5") + " * " + x + " * (" + c("1") + " + " + (vec ? "(" + inner + ").tanh()" : "std::tanh(" + inner + ")") +
           ")";
  }
  const std::string inner = x + " * " + c("0.70710678118654752440");
  return c("0.5") + " * " + x + " * (" + c("1") + " + " + (vec ? "(" + inner + ").erf()" : "std::erf(" + inner + ")") + ")";
}

// The loop body: loads, the group's expressions, stores. `vec`: over Vectorized lanes.
void emit_body(std::ostringstream& os, const Graph& g, const FusionGroup& group, bool vec, c10::ScalarType dtype) {
  const char* ct = compute_type(dtype);
  const bool bf16 = dtype == c10::ScalarType::BFloat16;
  const std::string ty = vec ? "Vec" : ct;
  std::map<int, std::string> var;
  for (size_t i = 0; i < group.scalar_inputs.size(); ++i)
    var[group.scalar_inputs[i]] = vec ? "Vec(sc" + std::to_string(i) + ")" : "sc" + std::to_string(i);
  for (size_t i = 0; i < group.tensor_inputs.size(); ++i) {
    const std::string in = "in" + std::to_string(i);
    const std::string load = vec ? "Vec::loadu(" + in + " + i)" : bf16 ? "nx_bf16_load(" + in + ", i)" : in + "[i]";
    os << "    const " << ty << " x" << i << " = " << load << ";\n";
    var[group.tensor_inputs[i]] = "x" + std::to_string(i);
  }
  auto operand = [&](const Arg& a) -> std::string {
    if (a.kind == Arg::Kind::kConstant) return vec ? "Vec(" + literal(a.constant, ct) + ")" : literal(a.constant, ct);
    return var.at(a.value);
  };
  int t = 0;
  for (int ni : group.nodes) {
    const Node& n = g.nodes[ni];
    std::string e;
    if (n.target == "aten::gelu") {
      e = gelu_expr(operand(n.args[0]), n.args[1].constant.toStringRef() == "tanh", vec, ct);
    } else {
      const Lowering& l = table().at(n.target);
      std::vector<std::string> ops;
      for (int i = 0; i < l.operands; ++i) ops.push_back(operand(n.args[i]));
      e = vec ? l.vexpr(ops) : l.expr(ops);
    }
    const std::string v = "t" + std::to_string(t++);
    os << "    const " << ty << " " << v << " = " << (vec ? "Vec(" + e + ")" : "static_cast<" + std::string(ct) + ">(" + e + ")")
       << ";\n";
    var[n.outputs[0]] = v;
  }
  for (size_t i = 0; i < group.outputs.size(); ++i) {
    const std::string& v = var.at(group.outputs[i]);
    if (vec) os << "    " << v << ".store(out" << i << " + i);\n";
    else if (bf16) os << "    nx_bf16_store(out" << i << ", i, " << v << ");\n";
    else os << "    out" << i << "[i] = " << v << ";\n";
  }
}

}  // namespace

std::string generate_kernel(const Graph& g, const FusionGroup& group, const std::string& name) {
  const char* ct = compute_type(group.dtype);
  const bool bf16 = group.dtype == c10::ScalarType::BFloat16;
  const char* storage = bf16 ? "uint16_t" : ct;
  std::ostringstream os;
  os << "extern \"C\" void " << name << "(char* const* ptrs, const double* scalars, int64_t begin, int64_t end) {\n";
  os << "  using Vec = at::vec::Vectorized<" << ct << ">;\n";
  for (size_t i = 0; i < group.tensor_inputs.size(); ++i)
    os << "  const " << storage << "* __restrict__ in" << i << " = reinterpret_cast<const " << storage << "*>(ptrs[" << i
       << "]);\n";
  for (size_t i = 0; i < group.outputs.size(); ++i)
    os << "  " << storage << "* __restrict__ out" << i << " = reinterpret_cast<" << storage << "*>(ptrs["
       << group.tensor_inputs.size() + i << "]);\n";
  for (size_t i = 0; i < group.scalar_inputs.size(); ++i)
    os << "  const " << ct << " sc" << i << " = static_cast<" << ct << ">(scalars[" << i << "]);\n";
  os << "  int64_t i = begin;\n";
  if (!bf16) {  // ATen's vectorized math (Sleef), as eager's kernels use
    os << "  for (; i + Vec::size() <= end; i += Vec::size()) {\n";
    emit_body(os, g, group, true, group.dtype);
    os << "  }\n";
  }
  os << "  for (; i < end; ++i) {\n";
  emit_body(os, g, group, false, group.dtype);
  os << "  }\n}\n";
  return os.str();
}

}  // namespace neuronx::compiler
