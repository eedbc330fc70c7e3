#include "compiler/graph.h"

#include <ATen/core/enum_tag.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <sstream>
#include <stdexcept>

namespace neuronx::compiler {

SymExpr::SymExpr(std::vector<std::string> postfix, const std::vector<std::string>& symbols)
    : postfix_(std::move(postfix)) {
  static const std::unordered_map<std::string, Op> binary = {
      {"+", Op::kAdd}, {"*", Op::kMul}, {"//", Op::kFloorDiv}, {"%", Op::kMod}, {"/", Op::kDiv},
      {"max", Op::kMax}, {"min", Op::kMin}, {"pow", Op::kPow}};
  int depth = 0;
  for (const auto& t : postfix_) {
    Instr in{Op::kInt};
    if (t.rfind("s:", 0) == 0) {
      const auto it = std::find(symbols.begin(), symbols.end(), t.substr(2));
      if (it == symbols.end()) throw std::runtime_error("size expression uses unbound symbol " + t.substr(2));
      in = {Op::kSymbol, it - symbols.begin()};
      constant_ = false;
      ++depth;
    } else if (t.rfind("i:", 0) == 0) {
      in = {Op::kInt, std::stoll(t.substr(2))};
      ++depth;
    } else if (t.rfind("f:", 0) == 0) {
      in = {Op::kFloat, 0, std::stod(t.substr(2))};
      fractional_ = true;
      ++depth;
    } else if (t == "neg") {
      in = {Op::kNeg};
      if (depth < 1) throw std::runtime_error("malformed size expression");
    } else {
      const auto it = binary.find(t);
      if (it == binary.end()) throw std::runtime_error("unknown size expression operator " + t);
      in = {it->second};
      fractional_ = fractional_ || it->second == Op::kDiv;
      if (depth < 2) throw std::runtime_error("malformed size expression");
      --depth;
    }
    code_.push_back(in);
  }
  if (depth != 1) throw std::runtime_error("malformed size expression");
  if (constant_) value_ = fractional_ ? static_cast<int64_t>(std::llround(run<double>({}, {}))) : run<int64_t>({}, {});
}

SymExpr SymExpr::constant(int64_t v) { return SymExpr({"i:" + std::to_string(v)}, {}); }

int64_t SymExpr::value() const {
  if (!constant_) throw std::runtime_error("size expression is not a constant");
  return value_;
}

namespace {

int64_t floor_div(int64_t a, int64_t b) {
  if (b == 0) throw std::runtime_error("size expression divides by zero");
  const int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

int64_t ipow(int64_t a, int64_t b) {
  if (b < 0) throw std::runtime_error("size expression raises to a negative power");
  int64_t r = 1;
  while (b-- > 0) r *= a;
  return r;
}

}  // namespace

template <typename T>
T SymExpr::run(const std::vector<int64_t>& ints, const std::vector<double>& floats) const {
  T st[32];  // exported expressions are shallow; deeper ones take the heap
  std::vector<T> heap;
  T* s = st;
  if (code_.size() > 32) {
    heap.resize(code_.size());
    s = heap.data();
  }
  size_t n = 0;
  for (const Instr& in : code_) {
    switch (in.op) {
      case Op::kSymbol:
        if constexpr (std::is_same_v<T, double>) s[n++] = floats.at(in.i);
        else s[n++] = ints.at(in.i);
        continue;
      case Op::kInt: s[n++] = static_cast<T>(in.i); continue;
      case Op::kFloat: s[n++] = static_cast<T>(in.f); continue;
      case Op::kNeg: s[n - 1] = -s[n - 1]; continue;
      default: break;
    }
    const T b = s[--n], a = s[n - 1];
    T& r = s[n - 1];
    switch (in.op) {
      case Op::kAdd: r = a + b; break;
      case Op::kMul: r = a * b; break;
      case Op::kMax: r = std::max(a, b); break;
      case Op::kMin: r = std::min(a, b); break;
      case Op::kFloorDiv:
        if constexpr (std::is_same_v<T, double>) r = std::floor(a / b);
        else r = floor_div(a, b);
        break;
      case Op::kMod:
        if constexpr (std::is_same_v<T, double>) r = a - b * std::floor(a / b);
        else r = a - b * floor_div(a, b);
        break;
      case Op::kPow:
        if constexpr (std::is_same_v<T, double>) r = std::pow(a, b);
        else r = ipow(a, b);
        break;
      case Op::kDiv: r = a / b; break;  // fractional expressions only
      default: break;
    }
  }
  return s[0];
}

int64_t SymExpr::eval(const std::vector<int64_t>& ints, const std::vector<double>& floats) const {
  if (constant_) return value_;
  if (fractional_) return static_cast<int64_t>(std::llround(run<double>(ints, floats)));
  return run<int64_t>(ints, floats);
}

bool TensorMeta::is_static() const {
  for (const auto& e : sizes)
    if (!e.is_constant()) return false;
  for (const auto& e : strides)
    if (!e.is_constant()) return false;
  return true;
}

bool TensorMeta::is_static_contiguous() const {
  if (!is_static()) return false;
  int64_t expected = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    const int64_t size = sizes[i].value();
    if (size != 1 && strides[i].value() != expected) return false;
    expected *= size;
  }
  return true;
}

bool TensorMeta::is_static_channels_last() const {
  if (sizes.size() != 4 || !is_static()) return false;
  int64_t expected = 1;
  for (size_t i : {1, 3, 2, 0}) {
    const int64_t size = sizes[i].value();
    if (size != 1 && strides[i].value() != expected) return false;
    expected *= size;
  }
  return true;
}

bool TensorMeta::same_sizes(const TensorMeta& other) const {
  if (sizes.size() != other.sizes.size()) return false;
  for (size_t i = 0; i < sizes.size(); ++i)
    if (sizes[i] != other.sizes[i]) return false;
  return true;
}

namespace {

std::string expr_text(const SymExpr& e) {
  std::string s;
  for (const auto& t : e.postfix()) s += (s.empty() ? "" : " ") + t;
  return e.postfix().size() == 1 ? s : "(" + s + ")";
}

void arg_text(std::ostringstream& os, const Graph& g, const Arg& a) {
  switch (a.kind) {
    case Arg::Kind::kValue:
      os << "%" << g.values[a.value].name;
      break;
    case Arg::Kind::kConstant:
      os << a.constant;
      break;
    case Arg::Kind::kList:
      os << "[";
      for (size_t i = 0; i < a.items.size(); ++i) {
        if (i) os << ", ";
        arg_text(os, g, a.items[i]);
      }
      os << "]";
      break;
  }
}

}  // namespace

std::string Graph::dump() const {
  std::ostringstream os;
  os << "inputs:";
  for (const auto& in : inputs) os << " %" << values[in.value].name;
  os << "\n";
  for (const auto& s : symbols) os << "symbol " << s.name << " = input " << s.input << " dim " << s.dim << "\n";
  for (const auto& n : nodes) {
    for (size_t i = 0; i < n.outputs.size(); ++i) os << (i ? ", %" : "%") << values[n.outputs[i]].name;
    os << " = " << n.target;
    os << "(";
    for (size_t i = 0; i < n.args.size(); ++i) {
      if (i) os << ", ";
      arg_text(os, *this, n.args[i]);
    }
    os << ")";
    if (n.fused_group >= 0) os << "  # fused group " << n.fused_group;
    for (int o : n.outputs) {
      const auto& v = values[o];
      if (v.meta) {
        os << "  : " << c10::toString(v.meta->dtype) << "[";
        for (size_t i = 0; i < v.meta->sizes.size(); ++i) os << (i ? ", " : "") << expr_text(v.meta->sizes[i]);
        os << "]";
      }
    }
    os << "\n";
  }
  os << "outputs:";
  for (int o : outputs) os << " " << (o < 0 ? std::string("None") : "%" + values[o].name);
  os << "\n";
  return os.str();
}

std::vector<int> Graph::use_counts() const {
  std::vector<int> uses(values.size(), 0);
  for (const auto& n : nodes) for_each_value(n, [&](int v) { ++uses[v]; });
  for (int o : outputs)
    if (o >= 0) ++uses[o];
  return uses;
}

bool writes_operand(const Node& n) {
  if (n.kind != Node::Kind::kAten) return false;
  for (const auto& a : n.op->schema().arguments())
    if (a.alias_info() && a.alias_info()->isWrite()) return true;
  return false;
}

bool has_effect(const Node& n) {
  return writes_operand(n) || (n.kind == Node::Kind::kAten && n.op->schema().returns().empty());
}

bool is_random(const Node& n) { return n.kind == Node::Kind::kAten && n.op->hasTag(at::Tag::nondeterministic_seeded); }

namespace {
bool is_generator(const c10::Argument& a) {
  const auto& t = a.type();
  return t->kind() == c10::TypeKind::GeneratorType ||
         (t->kind() == c10::TypeKind::OptionalType &&
          t->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType);
}
}  // namespace

std::optional<std::pair<c10::OperatorHandle, size_t>> generator_overload(const c10::OperatorHandle& op) {
  if (!op.hasTag(at::Tag::nondeterministic_seeded)) return std::nullopt;
  const auto& a = op.schema().arguments();
  for (const auto& f : a)
    if (is_generator(f)) return std::nullopt;
  for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name != op.schema().name() || name.overload_name == op.schema().overload_name()) continue;
    auto h = c10::Dispatcher::singleton().findSchema(name);
    if (!h || !h->hasTag(at::Tag::nondeterministic_seeded)) continue;
    const auto& b = h->schema().arguments();
    if (b.size() != a.size() + 1 || h->schema().returns().size() != op.schema().returns().size()) continue;
    // Same arguments, in order, with one generator inserted somewhere.
    size_t gen = b.size(), i = 0;
    bool same = true;
    for (size_t j = 0; same && j < b.size(); ++j) {
      if (gen == b.size() && is_generator(b[j])) {
        gen = j;
        continue;
      }
      same = i < a.size() && a[i].name() == b[j].name() && a[i].type()->str() == b[j].type()->str();
      ++i;
    }
    same = same && i == a.size();
    if (same && gen < b.size()) return std::make_pair(*h, gen);
  }
  return std::nullopt;
}

}  // namespace neuronx::compiler
