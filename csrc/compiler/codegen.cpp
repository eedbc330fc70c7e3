#include "compiler/codegen.h"

#include <functional>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>

namespace neuronx::compiler {

namespace {

bool supported_dtype(c10::ScalarType t) {
  return t == c10::ScalarType::Float || t == c10::ScalarType::BFloat16 || t == c10::ScalarType::Double;
}

const char* compute_type(c10::ScalarType t) { return t == c10::ScalarType::Double ? "double" : "float"; }

bool is_one(const SymExpr& e) { return e.is_constant() && e.value() == 1; }

// A tensor operand of the node's dtype whose sizes broadcast to the node's shape (each of its
// dims, aligned from the right, is the node's or a constant 1).
bool tensor_operand(const Graph& g, const Arg& a, const TensorMeta& out) {
  if (a.kind != Arg::Kind::kValue) return false;
  const Value& v = g.values[a.value];
  if (v.kind != Value::Kind::kTensor || !v.meta || v.meta->dtype != out.dtype || v.meta->sizes.size() > out.sizes.size())
    return false;
  const size_t lead = out.sizes.size() - v.meta->sizes.size();
  for (size_t d = 0; d < v.meta->sizes.size(); ++d)
    if (v.meta->sizes[d] != out.sizes[lead + d] && !is_one(v.meta->sizes[d])) return false;
  return true;
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
  if (n.id == OpId::kGelu)
    return tensor_operand(g, n.args[0], *out.meta) && n.args[1].kind == Arg::Kind::kConstant;
  const OpInfo& l = op_info(n.id);
  if (l.operands == 0) return false;
  bool any_tensor = false;
  for (int i = 0; i < l.operands; ++i) {
    if (!operand(g, n.args[i], *out.meta)) return false;
    any_tensor = any_tensor || tensor_operand(g, n.args[i], *out.meta);
  }
  return any_tensor;
}

std::string kernel_prelude() {
  return R"(#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>
static inline float nx_bf16_load(const uint16_t* p, int64_t i) {
  uint32_t u = static_cast<uint32_t>(p[i]) << 16; float f; std::memcpy(&f, &u, 4); return f;
}
static inline void nx_bf16_store(uint16_t* p, int64_t i, float f) {
  uint32_t u; std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) { p[i] = static_cast<uint16_t>((u >> 16) | 0x40u); return; }  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even, as c10::BFloat16
  p[i] = static_cast<uint16_t>(u >> 16);
}
static inline float nx_bf16_round(float f) {  // f rounded to bfloat16 (as a store and a load)
  uint16_t b; nx_bf16_store(&b, 0, f); return nx_bf16_load(&b, 0);
}
template <typename T> static inline T nx_max(T a, T b) { return (a != a || b != b) ? a + b : (a > b ? a : b); }
template <typename T> static inline T nx_min(T a, T b) { return (a != a || b != b) ? a + b : (a < b ? a : b); }
template <typename T> static inline T nx_relu(T a) { return a > T(0) ? a : (a != a ? a : T(0)); }
// tanh without a vector library's tanh (four times the cost of its exp): float as
// sign(x) * (|x| < 0.6 ? |x| + |x|^3 P(x^2) : 1 - 2 / (exp(2|x|) + 1)), P a degree-4 fit of
// (tanh(x) - x) / x^3 on [0, 0.6] (within 0.05 ulp); double as sign(x) * e / (e + 2),
// e = expm1(2|x|). Within 2.5 ulp of the true value (ATen's kernel: 0.5), odd by construction;
// |x| is capped at 20 (tanh is 1 there in float and double, and exp stays finite).
static inline float nx_tanh_small(float a, float t) {
  float p = std::fma(t, -0.005895153611567851f, 0.020795968197646526f);
  p = std::fma(t, p, -0.05378382936170781f);
  p = std::fma(t, p, 0.1333192411725756f);
  p = std::fma(t, p, -0.33333298001812234f);
  return std::fma(a * t, p, a);
}
static inline float nx_tanh(float x) {
  const float a = std::abs(x);
  if (a < 0.6f) return std::copysign(nx_tanh_small(a, a * a), x);
  const float b = a < 20.f ? a : (a != a ? a : 20.f);
  return std::copysign(1.f - 2.f / (std::exp(b + b) + 1.f), x);
}
static inline double nx_tanh(double x) {
  double a = std::abs(x);
  a = a < 20. ? a : (a != a ? a : 20.);
  const double e = std::expm1(a + a);
  return std::copysign(e / (e + 2.), x);
}
static inline at::vec::Vectorized<float> nx_vtanh(at::vec::Vectorized<float> x) {
  using V = at::vec::Vectorized<float>;
  const V a = x.abs(), t = a * a;
  V p = at::vec::fmadd(t, V(-0.005895153611567851f), V(0.020795968197646526f));
  p = at::vec::fmadd(t, p, V(-0.05378382936170781f));
  p = at::vec::fmadd(t, p, V(0.1333192411725756f));
  p = at::vec::fmadd(t, p, V(-0.33333298001812234f));
  const V small = at::vec::fmadd(a * t, p, a);
  const V b = at::vec::minimum(a, V(20.f));  // (NaN stays NaN)
  const V large = V(1.f) - V(2.f) / ((b + b).exp() + V(1.f));
  return V::blendv(large, small, a < V(0.6f)).copysign(x);
}
static inline at::vec::Vectorized<double> nx_vtanh(at::vec::Vectorized<double> x) {
  using V = at::vec::Vectorized<double>;
  const V a = at::vec::minimum(x.abs(), V(20.));
  const V e = (a + a).expm1();
  return (e / (e + V(2.))).copysign(x);
}
)";
}

namespace {

std::string gelu_expr(const std::string& x, bool tanh_form, bool vec, const char* ct) {
  auto c = [&](const char* v) { return vec ? "Vec((" + std::string(ct) + ")" + v + ")" : "(" + std::string(ct) + ")" + v; };
  if (tanh_form) {
    const std::string inner = c("0.79788456080286535588") + " * (" + x + " + " + c("0.044715") + " * " + x + " * " + x +
                              " * " + x + ")";
    return c("0.5") + " * " + x + " * (" + c("1") + " + " + (vec ? "nx_vtanh(" + inner + ")" : "nx_tanh(" + inner + ")") +
           ")";
  }
  const std::string inner = x + " * " + c("0.70710678118654752440");
  return c("0.5") + " * " + x + " * (" + c("1") + " + " + (vec ? "(" + inner + ").erf()" : "std::erf(" + inner + ")") + ")";
}

// A loop body: loads, the nodes' expressions, stores (at element index i).
struct Load {
  int value;
  std::string vec, scalar;  // the load, in lane and in scalar form
};
struct Body {
  std::vector<int> nodes;                          // pointwise nodes, in order
  std::vector<Load> loads;
  std::map<int, std::string> bound;                // values already computed (lane form)
  std::vector<std::pair<int, std::string>> stores; // value, pointer (element i)
};

// Emits the body; returns each value's variable. `vec`: over Vectorized lanes.
std::map<int, std::string> emit_body(std::ostringstream& os, const Graph& g, const FusionGroup& group, const Body& b,
                                     bool vec, const std::string& tag) {
  const char* ct = compute_type(group.dtype);
  const bool bf16 = group.dtype == c10::ScalarType::BFloat16;
  const std::string ty = vec ? "Vec" : ct;
  std::map<int, std::string> var = b.bound;
  for (size_t i = 0; i < group.scalar_inputs.size(); ++i)
    var[group.scalar_inputs[i]] = vec ? "Vec(sc" + std::to_string(i) + ")" : "sc" + std::to_string(i);
  for (size_t k = 0; k < b.loads.size(); ++k) {
    const std::string x = tag + "x" + std::to_string(k);
    os << "    const " << ty << " " << x << " = " << (vec ? b.loads[k].vec : b.loads[k].scalar) << ";\n";
    var[b.loads[k].value] = x;
  }
  auto operand = [&](const Arg& a) -> std::string {
    if (a.kind == Arg::Kind::kConstant) return vec ? "Vec(" + literal(a.constant, ct) + ")" : literal(a.constant, ct);
    return var.at(a.value);
  };
  int t = 0;
  for (int ni : b.nodes) {
    const Node& n = g.nodes[ni];
    std::string e;
    if (n.id == OpId::kGelu) {
      e = gelu_expr(operand(n.args[0]), n.args[1].constant.toStringRef() == "tanh", vec, ct);
    } else {
      const OpInfo& l = op_info(n.id);
      std::vector<std::string> ops;
      for (int i = 0; i < l.operands; ++i) ops.push_back(operand(n.args[i]));
      e = vec ? l.vexpr(ops) : l.expr(ops);
    }
    const std::string v = tag + "t" + std::to_string(t++);
    // Eager rounds every bfloat16 op's result to bfloat16 (group.eager_split: so do we).
    const std::string value = vec ? "Vec(" + e + ")"
                              : bf16 && group.eager_split ? "nx_bf16_round(" + e + ")"
                                                          : "static_cast<" + std::string(ct) + ">(" + e + ")";
    os << "    const " << ty << " " << v << " = " << value << ";\n";
    var[n.outputs[0]] = v;
  }
  for (const auto& [value, out] : b.stores) {
    const std::string& v = var.at(value);
    if (vec) os << "    " << v << ".store(" << out << " + i);\n";
    else if (bf16) os << "    nx_bf16_store(" << out << ", i, " << v << ");\n";
    else os << "    " << out << "[i] = " << v << ";\n";
  }
  return var;
}

// A load of pointer p at index idx (in lane form: `lanes` consecutive values, or one value
// broadcast to every lane).
Load load(int value, const std::string& p, const std::string& idx, bool broadcast, bool bf16) {
  const std::string scalar = bf16 ? "nx_bf16_load(" + p + ", " + idx + ")" : p + "[" + idx + "]";
  return {value, broadcast ? "Vec(" + scalar + ")" : "Vec::loadu(" + p + " + " + idx + ")", scalar};
}

// Pointer declarations shared by both kernel kinds: in<k>, out<k>, sc<k>.
void emit_pointers(std::ostringstream& os, const FusionGroup& group) {
  const char* ct = compute_type(group.dtype);
  const char* storage = group.dtype == c10::ScalarType::BFloat16 ? "uint16_t" : ct;
  os << "  using Vec = at::vec::Vectorized<" << ct << ">;\n";
  const char* restrict = group.may_alias ? " " : " __restrict__ ";
  for (size_t i = 0; i < group.tensor_inputs.size(); ++i)
    os << "  const " << storage << "*" << restrict << "in" << i << " = reinterpret_cast<const " << storage << "*>(ptrs[" << i
       << "]);\n";
  for (size_t i = 0; i < group.outputs.size(); ++i)
    os << "  " << storage << "*" << restrict << "out" << i << " = reinterpret_cast<" << storage << "*>(ptrs["
       << group.tensor_inputs.size() + i << "]);\n";
  for (size_t i = 0; i < group.scalar_inputs.size(); ++i)
    os << "  const " << ct << " sc" << i << " = static_cast<" << ct << ">(scalars[" << i << "]);\n";
}

// A loop over the row's elements j < n (element i = base + j): vectorized (unless bfloat16,
// whose values are converted one by one), then a scalar tail; body(vec) emits one step.
template <typename F>
void emit_row_loop(std::ostringstream& os, bool vectorize, F&& body) {
  os << "   {\n    int64_t j = 0;\n";
  if (vectorize) {
    os << "    for (; j + Vec::size() <= n; j += Vec::size()) {\n    const int64_t i = base + j;\n";
    body(true);
    os << "    }\n";
  }
  os << "    for (; j < n; ++j) {\n    const int64_t i = base + j;\n";
  body(false);
  os << "    }\n   }\n";
}

// The kernel of a group that loops over rows: a pointwise group with broadcast inputs, or a
// row group (prologue, the reduction's row statistics, the reduced values and the epilogue).
class RowKernel {
 public:
  RowKernel(const Graph& g, const FusionGroup& group)
      : g_(g),
        group_(group),
        red_(group.reduction >= 0 ? &g.nodes[group.reduction] : nullptr),
        layer_norm_(red_ && op_info(red_->id).reduction == Reduction::kLayerNorm),
        log_softmax_(red_ && op_info(red_->id).reduction == Reduction::kLogSoftmax),
        bf16_(group.dtype == c10::ScalarType::BFloat16),
        x_(red_ ? red_->args[0].value : -1),
        loss_(loss_node(g, group)),
        kinds_(operand_kinds(g, group)) {
    split_phases();
    bind_inputs();
    bind_outputs();
  }

  std::string generate(const std::string& name) {
    const char* storage = bf16_ ? "uint16_t" : compute_type(group_.dtype);
    const size_t S = group_.scalar_inputs.size();
    os_ << std::setprecision(17);
    os_ << "extern \"C\" void " << name << "(char* const* ptrs, const double* scalars, int64_t begin, int64_t end) {\n";
    emit_pointers(os_, group_);
    os_ << "  const int64_t n = static_cast<int64_t>(scalars[" << S << "]);\n";
    os_ << "  const int64_t R = static_cast<int64_t>(scalars[" << S + 1 << "]);\n";
    os_ << "  const double* sizes = scalars + " << S + 2 << ";\n  const double* strides = sizes + R;\n";
    os_ << "  (void)strides;\n";
    const bool buffered = red_ && (x_ptr_.empty() || !layer_norm_);  // softmax keeps its exponentials there
    if (buffered) os_ << "  std::vector<float> row(static_cast<size_t>(n));\n";
    os_ << "  for (int64_t r = begin; r < end; ++r) {\n    const int64_t base = r * n;\n";
    if (!strided_.empty()) emit_row_offsets(storage);
    if (red_) {
      os_ << "    float* __restrict__ xr = " << (buffered ? "row.data()" : "nullptr") << ";\n";
      os_ << "    const float* __restrict__ xin = " << (x_ptr_.empty() ? "xr" : x_ptr_) << ";\n";
    }
    if (!red_ || !pro_.nodes.empty() || !pro_.stores.empty() || x_ptr_.empty()) {
      emit_row_loop(os_, !bf16_, [&](bool vec) {
        auto var = emit_body(os_, g_, group_, pro_, vec, "p");
        if (red_ && x_ptr_.empty()) {
          if (vec) os_ << "    " << var.at(x_) << ".store(xr + j);\n";
          else os_ << "    xr[j] = " << var.at(x_) << ";\n";
        }
      });
    }
    if (red_) {
      if (layer_norm_) emit_layer_norm_statistics();
      else emit_softmax_statistics();
      emit_reduced_values();
      if (loss_ >= 0) emit_loss();
    }
    os_ << "  }\n}\n";
    return os_.str();
  }

 private:
  // Phase 1 (the prologue: what does not depend on the reduction) and phase 3 (the epilogue).
  void split_phases() {
    if (red_) after_.insert(red_->outputs.begin(), red_->outputs.end());
    for (int ni : group_.nodes) {
      if (ni == group_.reduction || ni == loss_) continue;
      bool dep = false;
      for (const auto& a : g_.nodes[ni].args) for_each_value(a, [&](int v) { dep = dep || after_.count(v); });
      if (dep) after_.insert(g_.nodes[ni].outputs[0]);
      (dep ? epi_ : pro_).nodes.push_back(ni);
    }
    // Prologue values the epilogue reads are not kept between the phases: the epilogue computes
    // them again (with what they read from the prologue), in the group's order.
    std::set<int> need, again;
    for (int ni : epi_.nodes)
      for (const auto& a : g_.nodes[ni].args) for_each_value(a, [&](int v) { need.insert(v); });
    for (auto it = pro_.nodes.rbegin(); it != pro_.nodes.rend(); ++it) {
      if (!need.count(g_.nodes[*it].outputs[0])) continue;
      again.insert(*it);
      for (const auto& a : g_.nodes[*it].args) for_each_value(a, [&](int v) { need.insert(v); });
    }
    if (again.empty()) return;
    std::vector<int> nodes;
    for (int ni : group_.nodes)
      if (again.count(ni) || std::find(epi_.nodes.begin(), epi_.nodes.end(), ni) != epi_.nodes.end())
        nodes.push_back(ni);
    epi_.nodes = std::move(nodes);
  }

  bool reads(const Body& b, int v) const {
    for (int ni : b.nodes) {
      bool r = false;
      for (const auto& a : g_.nodes[ni].args) for_each_value(a, [&](int u) { r = r || u == v; });
      if (r) return true;
    }
    return false;
  }

  // How each input is read: per element, per row (broadcast inputs, found from their leading
  // strides), as layer norm's [n] weight and bias, or as a loss's targets.
  void bind_inputs() {
    for (size_t k = 0; k < group_.tensor_inputs.size(); ++k) {
      const int v = group_.tensor_inputs[k];
      const std::string in = "in" + std::to_string(k), row = "r" + std::to_string(k);
      if (kinds_[k] == Operand::kColumn) {
        (red_->args[2].kind == Arg::Kind::kValue && red_->args[2].value == v ? weight_ : bias_) = in;
        continue;
      }
      if (kinds_[k] == Operand::kRowIndex) {
        target_ = "reinterpret_cast<const int64_t*>(ptrs[" + std::to_string(k) + "])";
        continue;
      }
      if (kinds_[k] != Operand::kElement) strided_.push_back(static_cast<int>(k));
      if (v == x_) x_ptr_ = in + " + base";
      Load l = kinds_[k] == Operand::kElement       ? load(v, in, "i", false, bf16_)
               : kinds_[k] == Operand::kRowBroadcast ? load(v, row, "0", true, bf16_)
                                                     : load(v, row, "j", false, bf16_);
      if (reads(pro_, v)) pro_.loads.push_back(l);
      if (reads(epi_, v)) epi_.loads.push_back(l);
    }
  }

  void bind_outputs() {
    for (size_t k = 0; k < group_.outputs.size(); ++k) {
      const int v = group_.outputs[k];
      const std::string out = "out" + std::to_string(k);
      if (loss_ >= 0 && (v == g_.nodes[loss_].outputs[0] || v == g_.nodes[loss_].outputs[1])) continue;  // set by the host
      if (layer_norm_ && v == red_->outputs[1]) mean_out_ = out;
      else if (layer_norm_ && v == red_->outputs[2]) rstd_out_ = out;
      else if ((red_ && v == red_->outputs[0]) || after_.count(v)) epi_.stores.emplace_back(v, out);
      else pro_.stores.emplace_back(v, out);
    }
  }

  // Rows of broadcast inputs: the leading coordinates of row r.
  void emit_row_offsets(const char* storage) {
    for (int k : strided_) os_ << "    int64_t o" << k << " = 0;\n";
    os_ << "    for (int64_t d = R - 1, rem = r; d >= 0; --d) {\n      const int64_t size = static_cast<int64_t>(sizes[d]);\n"
        << "      const int64_t c = rem % size;\n      rem /= size;\n";
    size_t pos = 0;
    for (size_t k = 0; k < group_.tensor_inputs.size(); ++k) {
      if (kinds_[k] == Operand::kColumn || kinds_[k] == Operand::kRowIndex) continue;
      if (kinds_[k] != Operand::kElement)
        os_ << "      o" << k << " += c * static_cast<int64_t>(strides[" << pos << " * R + d]);\n";
      ++pos;
    }
    os_ << "    }\n";
    for (int k : strided_)
      os_ << "    const " << storage << "* __restrict__ r" << k << " = in" << k << " + o" << k << ";\n";
  }

  // Row statistics, with Vectorized partial sums as ATen's kernels do.
  void emit_layer_norm_statistics() {
    const double eps = red_->args[4].constant.toDouble();
    os_ << "    Vec vs(0); float s = 0;\n";
    os_ << "    int64_t j = 0;\n    for (; j + Vec::size() <= n; j += Vec::size()) vs = vs + Vec::loadu(xin + j);\n";
    os_ << "    for (; j < n; ++j) s += xin[j];\n";
    os_ << "    const float mean = (at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, vs) + s) / n;\n";
    os_ << "    Vec vq(0); float q = 0;\n";
    os_ << "    for (j = 0; j + Vec::size() <= n; j += Vec::size()) { const Vec d = Vec::loadu(xin + j) - Vec(mean); vq = vq + d * d; }\n";
    os_ << "    for (; j < n; ++j) { const float d = xin[j] - mean; q += d * d; }\n";
    os_ << "    const float var = std::max((at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, vq) + q) / n, 0.0f);\n";
    os_ << "    const float rstd = 1.0f / std::sqrt(var + (float)" << eps << ");\n";
    if (!mean_out_.empty()) os_ << "    " << mean_out_ << "[r] = mean;\n";
    if (!rstd_out_.empty()) os_ << "    " << rstd_out_ << "[r] = rstd;\n";
  }

  void emit_softmax_statistics() {
    os_ << "    Vec vm(-std::numeric_limits<float>::infinity()); float m = -std::numeric_limits<float>::infinity();\n";
    os_ << "    int64_t j = 0;\n    for (; j + Vec::size() <= n; j += Vec::size()) vm = at::vec::maximum(vm, Vec::loadu(xin + j));\n";
    os_ << "    for (; j < n; ++j) m = nx_max(m, xin[j]);\n";
    os_ << "    const float mx = nx_max(m, at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, vm));\n";
    os_ << "    Vec vs(0); float s = 0;\n";
    os_ << "    for (j = 0; j + Vec::size() <= n; j += Vec::size()) { const Vec e = (Vec::loadu(xin + j) - Vec(mx)).exp(); vs = vs + e;"
        << (log_softmax_ ? "" : " e.store(xr + j);") << " }\n";
    os_ << "    for (; j < n; ++j) { const float e = std::exp(xin[j] - mx); s += e;" << (log_softmax_ ? "" : " xr[j] = e;")
        << " }\n";
    os_ << "    const float sum = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, vs) + s;\n";
    os_ << (log_softmax_ ? "    const float shift = mx + std::log(sum);\n" : "    const float inv = 1.0f / sum;\n");
  }

  // Phase 3: the reduction's result per element, then the epilogue.
  void emit_reduced_values() {
    emit_row_loop(os_, true, [&](bool vec) {
      const std::string in = vec ? "Vec::loadu(xin + j)" : "xin[j]";
      std::string y;
      if (layer_norm_) {
        y = vec ? "(" + in + " - Vec(mean)) * Vec(rstd)" : "(" + in + " - mean) * rstd";
        if (!weight_.empty()) y = "(" + y + ") * " + (vec ? "Vec::loadu(" + weight_ + " + j)" : weight_ + "[j]");
        if (!bias_.empty()) y = "(" + y + ") + " + (vec ? "Vec::loadu(" + bias_ + " + j)" : bias_ + "[j]");
      } else if (log_softmax_) {
        y = vec ? in + " - Vec(shift)" : in + " - shift";
      } else {
        y = vec ? "Vec::loadu(xr + j) * Vec(inv)" : "xr[j] * inv";
      }
      os_ << "    const " << (vec ? "Vec" : "float") << " y = " << y << ";\n";
      Body b = epi_;
      b.bound[red_->outputs[0]] = "y";
      if (layer_norm_) {
        b.bound[red_->outputs[1]] = vec ? "Vec(mean)" : "mean";
        b.bound[red_->outputs[2]] = vec ? "Vec(rstd)" : "rstd";
      }
      emit_body(os_, g_, group_, b, vec, "e");
    });
  }

  // This row's -log_softmax at its target (0, weight 0 at ignore_index).
  void emit_loss() {
    const size_t extra = group_.tensor_inputs.size() + group_.outputs.size();
    os_ << "    {\n      const int64_t t = " << target_ << "[r];\n      float l = 0, w = 0;\n";
    os_ << "      if (t != " << g_.nodes[loss_].args[4].constant.toInt() << "LL) {\n";
    os_ << "        if (t < 0 || t >= n) *reinterpret_cast<int64_t*>(ptrs[" << extra + 2 << "]) = t;\n";
    os_ << "        else { l = -(xin[t] - shift); w = 1; }\n      }\n";
    os_ << "      reinterpret_cast<float*>(ptrs[" << extra << "])[r] = l;\n";
    os_ << "      reinterpret_cast<float*>(ptrs[" << extra + 1 << "])[r] = w;\n    }\n";
  }

  const Graph& g_;
  const FusionGroup& group_;
  const Node* red_;
  const bool layer_norm_, log_softmax_, bf16_;
  const int x_, loss_;
  const std::vector<Operand> kinds_;
  std::set<int> after_;  // values that depend on the reduction
  Body pro_, epi_;
  std::string x_ptr_, weight_, bias_;  // the reduction input when read from memory; layer norm's [n] operands
  std::string target_;                 // a fused loss's targets
  std::vector<int> strided_;           // inputs found per row from their leading strides
  std::string mean_out_, rstd_out_;
  std::ostringstream os_;
};

std::string generate_row_kernel(const Graph& g, const FusionGroup& group, const std::string& name) {
  return RowKernel(g, group).generate(name);
}

}  // namespace

bool lowerable_reduction(const Graph& g, const Node& n) {
  if (n.kind != Node::Kind::kAten || n.args.empty() || n.args[0].kind != Arg::Kind::kValue) return false;
  const Value& x = g.values[n.args[0].value];
  if (x.kind != Value::Kind::kTensor || !x.meta || x.meta->dtype != c10::ScalarType::Float || x.meta->sizes.empty())
    return false;
  const int64_t rank = static_cast<int64_t>(x.meta->sizes.size());
  for (int o : n.outputs) {
    const Value& v = g.values[o];
    if (v.kind != Value::Kind::kTensor || !v.meta || v.meta->dtype != c10::ScalarType::Float) return false;
  }
  const Reduction kind = op_info(n.id).reduction;
  if (kind == Reduction::kSoftmax || kind == Reduction::kLogSoftmax) {
    if (n.args.size() != 3 || n.args[1].kind != Arg::Kind::kConstant || !n.args[1].constant.isInt() ||
        n.args[2].kind != Arg::Kind::kConstant || !n.args[2].constant.isBool() || n.args[2].constant.toBool())
      return false;
    const int64_t dim = n.args[1].constant.toInt();
    return dim == -1 || dim == rank - 1;
  }
  if (kind != Reduction::kLayerNorm || n.args.size() != 5 || n.outputs.size() != 3) return false;
  // normalized_shape: the last dim alone.
  const Arg& ns = n.args[1];
  std::vector<int64_t> shape;
  if (ns.kind == Arg::Kind::kConstant && ns.constant.isIntList()) shape = ns.constant.toIntVector();
  else if (ns.kind == Arg::Kind::kList && ns.items.size() == 1 && ns.items[0].kind == Arg::Kind::kConstant &&
           ns.items[0].constant.isInt())
    shape = {ns.items[0].constant.toInt()};
  const SymExpr& last = x.meta->sizes.back();
  if (shape.size() != 1 || !last.is_constant() || last.value() != shape[0]) return false;
  for (int a = 2; a < 4; ++a) {
    const Arg& p = n.args[a];
    if (p.kind == Arg::Kind::kConstant) {
      if (!p.constant.isNone()) return false;
      continue;
    }
    const Value& v = g.values[p.value];
    if (v.kind != Value::Kind::kTensor || !v.meta || v.meta->dtype != c10::ScalarType::Float || v.meta->sizes.size() != 1 ||
        v.meta->sizes[0] != last)
      return false;
  }
  return n.args[4].kind == Arg::Kind::kConstant && n.args[4].constant.isDouble();
}

bool lowerable_loss(const Graph& g, const Node& n, const Node& red) {
  if (n.kind != Node::Kind::kAten || !op_info(n.id).loss || n.args.size() != 5 || n.outputs.size() != 2 ||
      op_info(red.id).reduction != Reduction::kLogSoftmax || n.args[0].kind != Arg::Kind::kValue ||
      n.args[0].value != red.outputs[0] || n.args[1].kind != Arg::Kind::kValue)
    return false;
  const TensorMeta& lsm = *g.values[red.outputs[0]].meta;
  const Value& t = g.values[n.args[1].value];
  return lsm.sizes.size() == 2 && t.kind == Value::Kind::kTensor && t.meta && t.meta->dtype == c10::ScalarType::Long &&
         t.meta->sizes.size() == 1 && t.meta->sizes[0] == lsm.sizes[0] &&
         n.args[2].kind == Arg::Kind::kConstant && n.args[2].constant.isNone() && n.args[3].kind == Arg::Kind::kConstant &&
         n.args[3].constant.isInt() && n.args[3].constant.toInt() >= 0 && n.args[3].constant.toInt() <= 2 &&
         n.args[4].kind == Arg::Kind::kConstant && n.args[4].constant.isInt();
}

int loss_node(const Graph& g, const FusionGroup& grp) {
  if (grp.reduction < 0) return -1;
  for (int ni : grp.nodes)
    if (ni != grp.reduction && lowerable_loss(g, g.nodes[ni], g.nodes[grp.reduction])) return ni;
  return -1;
}

namespace {
// The group's shape (its pointwise nodes' outputs; a row group's reduction input).
const TensorMeta& group_shape(const Graph& g, const FusionGroup& grp) {
  const int v = grp.reduction >= 0 ? g.nodes[grp.reduction].args[0].value : g.nodes[grp.nodes[0]].outputs[0];
  return *g.values[v].meta;
}

}  // namespace

std::vector<Operand> operand_kinds(const Graph& g, const FusionGroup& grp) {
  const TensorMeta& shape = group_shape(g, grp);
  std::vector<Operand> kinds;
  for (int v : grp.tensor_inputs) {
    const TensorMeta& m = *g.values[v].meta;
    const bool last_broadcast =
        !shape.sizes.empty() && (m.sizes.empty() || (is_one(m.sizes.back()) && !is_one(shape.sizes.back())));
    kinds.push_back(last_broadcast ? Operand::kRowBroadcast : m.same_sizes(shape) ? Operand::kElement : Operand::kOuterBroadcast);
  }
  if (const int l = loss_node(g, grp); l >= 0)
    for (size_t k = 0; k < grp.tensor_inputs.size(); ++k)
      if (grp.tensor_inputs[k] == g.nodes[l].args[1].value) kinds[k] = Operand::kRowIndex;
  if (grp.reduction >= 0 && op_info(g.nodes[grp.reduction].id).reduction == Reduction::kLayerNorm) {
    size_t k = kinds.size();
    for (int a = 3; a >= 2; --a)
      if (g.nodes[grp.reduction].args[a].kind == Arg::Kind::kValue) kinds[--k] = Operand::kColumn;
  }
  return kinds;
}

bool loops_over_rows(const Graph& g, const FusionGroup& grp) {
  if (grp.reduction >= 0) return true;
  for (Operand k : operand_kinds(g, grp))
    if (k != Operand::kElement) return true;
  return false;
}

std::string generate_kernel(const Graph& g, const FusionGroup& group, const std::string& name) {
  if (loops_over_rows(g, group)) return generate_row_kernel(g, group, name);
  Body b;
  b.nodes = group.nodes;
  for (size_t i = 0; i < group.tensor_inputs.size(); ++i)
    b.loads.push_back(load(group.tensor_inputs[i], "in" + std::to_string(i), "i", false,
                           group.dtype == c10::ScalarType::BFloat16));
  for (size_t i = 0; i < group.outputs.size(); ++i) b.stores.emplace_back(group.outputs[i], "out" + std::to_string(i));
  std::ostringstream os;
  os << "extern \"C\" void " << name << "(char* const* ptrs, const double* scalars, int64_t begin, int64_t end) {\n";
  emit_pointers(os, group);
  os << "  int64_t i = begin;\n";
  if (group.dtype != c10::ScalarType::BFloat16) {  // ATen's vectorized math (Sleef), as eager's kernels use
    // Eager's split (group.eager_split): ATen's vectorized loop steps two vectors at a time and
    // leaves the rest of each thread's range to the scalar form.
    if (group.eager_split)
      os << "  const int64_t vend = begin + (end - begin) / (2 * Vec::size()) * (2 * Vec::size());\n"
         << "  for (; i < vend; i += Vec::size()) {\n";
    else
      os << "  for (; i + Vec::size() <= end; i += Vec::size()) {\n";
    emit_body(os, g, group, b, true, "");
    os << "  }\n";
  }
  os << "  for (; i < end; ++i) {\n";
  emit_body(os, g, group, b, false, "");
  os << "  }\n}\n";
  return os.str();
}

}  // namespace neuronx::compiler
