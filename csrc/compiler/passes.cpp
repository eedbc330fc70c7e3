#include "compiler/passes.h"

#include <ATen/core/enum_tag.h>

#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "compiler/codegen.h"

namespace neuronx::compiler {

namespace {

void for_each_value(const Node& n, const std::function<void(int)>& fn) {
  for (const auto& a : n.args) for_each_value(a, fn);
}

std::vector<int> use_counts(const Graph& g) {
  std::vector<int> uses(g.values.size(), 0);
  for (const auto& n : g.nodes) for_each_value(n, [&](int v) { ++uses[v]; });
  for (int o : g.outputs)
    if (o >= 0) ++uses[o];
  return uses;
}

bool writes_operand(const Node& n) {
  if (n.kind != Node::Kind::kAten) return false;
  for (const auto& a : n.op->schema().arguments())
    if (a.alias_info() && a.alias_info()->isWrite()) return true;
  return false;
}

bool random(const Node& n) {
  return n.kind == Node::Kind::kAten && n.op->hasTag(at::Tag::nondeterministic_seeded);
}

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
  auto reshaping = [](const std::string& t) { return t == "aten::view" || t == "aten::_unsafe_view"; };
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
    if (reshaping(n.target) && reshaping(p.target)) {
      const auto& m = g.values[base].meta;
      if (!m || !m->is_static_contiguous()) continue;
      n.args[0].value = base;
      ++rewritten;
    } else if (n.target == "aten::permute" && p.target == "aten::permute") {
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

int eliminate_dead_code(Graph& g) {
  auto uses = use_counts(g);
  int removed = 0;
  for (size_t i = g.nodes.size(); i-- > 0;) {
    Node& n = g.nodes[i];
    bool used = false;
    for (int o : n.outputs) used = used || uses[o] > 0;
    if (used || writes_operand(n)) continue;
    for_each_value(n, [&](int v) { --uses[v]; });
    g.nodes.erase(g.nodes.begin() + static_cast<long>(i));
    ++removed;
  }
  return removed;
}

int eliminate_common_subexpressions(Graph& g) {
  std::vector<int> to(g.values.size(), -1);
  std::map<std::string, size_t> seen;
  std::vector<Node> kept;
  int removed = 0;
  for (auto& n : g.nodes) {
    for (auto& a : n.args) rename(a, to);
    if (n.kind == Node::Kind::kScalarOp || writes_operand(n) || random(n)) {
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

std::vector<FusionGroup> fuse_pointwise(Graph& g) {
  const auto uses = use_counts(g);
  std::vector<FusionGroup> groups;
  FusionGroup cur;
  std::set<int> produced;  // values the open group defines
  const TensorMeta* shape = nullptr;

  auto close = [&]() {
    if (cur.nodes.size() >= 2) {  // one op alone: ATen's vectorized kernel is as good
      std::map<int, int> inside_uses;
      std::set<int> seen_in, seen_scalar;
      for (int ni : cur.nodes)
        for_each_value(g.nodes[ni], [&](int v) {
          if (produced.count(v)) {
            ++inside_uses[v];
          } else if (g.values[v].kind == Value::Kind::kTensor) {
            if (seen_in.insert(v).second) cur.tensor_inputs.push_back(v);
          } else if (seen_scalar.insert(v).second) {
            cur.scalar_inputs.push_back(v);
          }
        });
      for (int ni : cur.nodes)
        for (int o : g.nodes[ni].outputs)
          if (uses[o] > inside_uses[o]) cur.outputs.push_back(o);
      for (int ni : cur.nodes) g.nodes[ni].fused_group = static_cast<int>(groups.size());
      groups.push_back(std::move(cur));
    }
    cur = FusionGroup();
    produced.clear();
    shape = nullptr;
  };

  auto same_shape = [](const TensorMeta& a, const TensorMeta& b) {
    if (a.sizes.size() != b.sizes.size()) return false;
    for (size_t i = 0; i < a.sizes.size(); ++i)
      if (a.sizes[i].postfix != b.sizes[i].postfix) return false;
    return true;
  };

  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (lowerable(g, n)) {
      const TensorMeta& m = *g.values[n.outputs[0]].meta;
      if (!shape || !same_shape(*shape, m) || cur.dtype != m.dtype) {
        close();
        shape = &m;
        cur.dtype = m.dtype;
      }
      cur.nodes.push_back(static_cast<int>(i));
      produced.insert(n.outputs[0]);
      continue;
    }
    // Another node may run before the open group's loop (which runs where the group ends) when
    // it neither reads the group's values nor writes anything.
    bool reads_group = false;
    for_each_value(n, [&](int v) { reads_group = reads_group || produced.count(v) > 0; });
    if (reads_group || writes_operand(n) || random(n)) close();
  }
  close();
  return groups;
}

}  // namespace neuronx::compiler
