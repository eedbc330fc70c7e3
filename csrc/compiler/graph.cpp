#include "compiler/graph.h"

#include <cmath>
#include <sstream>
#include <stdexcept>

namespace neuronx::compiler {

bool SymExpr::is_constant() const {
  for (const auto& t : postfix)
    if (t.rfind("s:", 0) == 0) return false;
  return true;
}

double SymExpr::eval(const std::vector<double>& symbols, const std::vector<std::string>& names) const {
  std::vector<double> st;
  auto pop = [&]() {
    if (st.empty()) throw std::runtime_error("malformed size expression");
    double v = st.back();
    st.pop_back();
    return v;
  };
  for (const auto& t : postfix) {
    if (t.rfind("s:", 0) == 0) {
      const std::string name = t.substr(2);
      size_t i = 0;
      while (i < names.size() && names[i] != name) ++i;
      if (i == names.size()) throw std::runtime_error("size expression uses unbound symbol " + name);
      st.push_back(symbols[i]);
    } else if (t.rfind("i:", 0) == 0) {
      st.push_back(static_cast<double>(std::stoll(t.substr(2))));
    } else if (t.rfind("f:", 0) == 0) {
      st.push_back(std::stod(t.substr(2)));
    } else if (t == "neg") {
      st.push_back(-pop());
    } else {
      const double b = pop(), a = pop();
      if (t == "+") st.push_back(a + b);
      else if (t == "*") st.push_back(a * b);
      else if (t == "//") st.push_back(std::floor(a / b));
      else if (t == "%") st.push_back(a - b * std::floor(a / b));
      else if (t == "/") st.push_back(a / b);
      else if (t == "max") st.push_back(std::max(a, b));
      else if (t == "min") st.push_back(std::min(a, b));
      else if (t == "pow") st.push_back(std::pow(a, b));
      else throw std::runtime_error("unknown size expression operator " + t);
    }
  }
  if (st.size() != 1) throw std::runtime_error("malformed size expression");
  return st.back();
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
  double expected = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    const double size = sizes[i].eval({}, {});
    if (size != 1 && strides[i].eval({}, {}) != expected) return false;
    expected *= size;
  }
  return true;
}

bool TensorMeta::same_sizes(const TensorMeta& other) const {
  if (sizes.size() != other.sizes.size()) return false;
  for (size_t i = 0; i < sizes.size(); ++i)
    if (sizes[i].postfix != other.sizes[i].postfix) return false;
  return true;
}

namespace {

std::string expr_text(const SymExpr& e) {
  std::string s;
  for (const auto& t : e.postfix) s += (s.empty() ? "" : " ") + t;
  return e.postfix.size() == 1 ? s : "(" + s + ")";
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

}  // namespace neuronx::compiler
