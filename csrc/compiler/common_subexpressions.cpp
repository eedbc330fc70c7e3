// eliminate_common_subexpressions: a node computing what an earlier one computed (same op,
// same operands; deterministic ops that write nothing) reads the earlier one's results.
#include "compiler/passes.h"

#include <map>
#include <sstream>

namespace neuronx::compiler {

namespace {

void rename(Arg& a, const std::vector<int>& to) {
  if (a.kind == Arg::Kind::kValue && to[a.value] >= 0) a.value = to[a.value];
  for (auto& i : a.items) rename(i, to);
}

void key_of(std::ostringstream& os, const Arg& a) {
  switch (a.kind) {
    case Arg::Kind::kValue:
      os << "%" << a.value;
      break;
    case Arg::Kind::kConstant:
      os << a.constant.tagKind() << ":" << a.constant;
      break;
    case Arg::Kind::kList:
      os << "[";
      for (const auto& i : a.items) {
        key_of(os, i);
        os << ",";
      }
      os << "]";
      break;
  }
}

}  // namespace

int eliminate_common_subexpressions(Graph& g) {
  std::vector<int> to(g.values.size(), -1);
  std::map<std::string, size_t> seen;
  std::vector<Node> kept;
  int removed = 0;
  for (auto& n : g.nodes) {
    for (auto& a : n.args) rename(a, to);
    if (n.kind == Node::Kind::kScalarOp || has_effect(n) || is_random(n)) {
      kept.push_back(std::move(n));
      continue;
    }
    std::ostringstream key;
    key << n.target << "(";
    for (const auto& a : n.args) {
      key_of(key, a);
      key << ";";
    }
    auto [it, fresh] = seen.emplace(key.str(), kept.size());
    if (!fresh && kept[it->second].outputs.size() == n.outputs.size()) {
      for (size_t i = 0; i < n.outputs.size(); ++i) to[n.outputs[i]] = kept[it->second].outputs[i];
      ++removed;
      continue;
    }
    kept.push_back(std::move(n));
  }
  g.nodes = std::move(kept);
  for (auto& o : g.outputs)
    if (o >= 0 && to[o] >= 0) o = to[o];
  return removed;
}

}  // namespace neuronx::compiler
