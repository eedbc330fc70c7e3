// simplify_views: a view of a view reads the first view's base directly.
#include "compiler/passes.h"

#include <vector>

namespace neuronx::compiler {

namespace {

// An int[] operand known at compile time (one constant list, or a list of constants).
bool constant_ints(const Arg& a, std::vector<int64_t>& out) {
  out.clear();
  if (a.kind == Arg::Kind::kConstant && a.constant.isIntList()) {
    out = a.constant.toIntVector();
    return true;
  }
  if (a.kind != Arg::Kind::kList) return false;
  for (const auto& x : a.items) {
    if (x.kind != Arg::Kind::kConstant || !x.constant.isInt()) return false;
    out.push_back(x.constant.toInt());
  }
  return true;
}
}  // namespace

int simplify_views(Graph& g) {
  std::vector<int> producer(g.values.size(), -1);
  int rewritten = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& n = g.nodes[i];
    for (int o : n.outputs) producer[o] = static_cast<int>(i);
    if (n.kind != Node::Kind::kAten || n.args.size() < 2 || n.args[0].kind != Arg::Kind::kValue) continue;
    const int pi = producer[n.args[0].value];
    if (pi < 0) continue;
    const Node& p = g.nodes[pi];
    if (p.kind != Node::Kind::kAten || p.args.size() < 2 || p.args[0].kind != Arg::Kind::kValue) continue;
    const int base = p.args[0].value;
    if (op_info(n.id).reshape_view && op_info(p.id).reshape_view) {
      const auto& m = g.values[base].meta;
      if (!m || !m->is_static_contiguous()) continue;
      n.args[0].value = base;
      ++rewritten;
    } else if (n.id == OpId::kPermute && p.id == OpId::kPermute) {
      std::vector<int64_t> outer, inner;
      if (!constant_ints(n.args[1], outer) || !constant_ints(p.args[1], inner) || outer.size() != inner.size())
        continue;
      const auto rank = static_cast<int64_t>(inner.size());
      auto dim = [&](int64_t d) { return ((d % rank) + rank) % rank; };
      std::vector<int64_t> composed;  // out[i] = x[inner[outer[i]]]
      for (int64_t o : outer) composed.push_back(dim(inner[dim(o)]));
      n.args[0].value = base;
      n.args[1] = Arg();
      n.args[1].constant = c10::IValue(composed);
      ++rewritten;
    }
  }
  return rewritten;
}

}  // namespace neuronx::compiler
