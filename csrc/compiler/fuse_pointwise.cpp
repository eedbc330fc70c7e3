// fuse_pointwise: pointwise chains and row groups become fused loops (code generation turns
// each group into one kernel).
#include "compiler/passes.h"

#include <ATen/core/enum_tag.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <tuple>
#include <sstream>

#include "compiler/codegen.h"

namespace neuronx::compiler {

namespace {

// Runs of lowerable pointwise nodes over one shape and dtype (single nodes included): a run's
// loop stands where its last node stood, so a node in between that is not in the run must not
// read the run's values or write anything.
std::vector<std::vector<int>> pointwise_runs(const Graph& g) {
  std::vector<std::vector<int>> runs;
  std::vector<int> cur;
  std::set<int> produced;
  const TensorMeta* shape = nullptr;
  auto close = [&] {
    if (!cur.empty()) runs.push_back(cur);
    cur.clear();
    produced.clear();
    shape = nullptr;
  };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (lowerable(g, n)) {
      const TensorMeta& m = *g.values[n.outputs[0]].meta;
      if (!shape || !shape->same_sizes(m) || shape->dtype != m.dtype) {
        close();
        shape = &m;
      }
      cur.push_back(static_cast<int>(i));
      produced.insert(n.outputs[0]);
      continue;
    }
    bool reads_run = false;
    for_each_value(n, [&](int v) { reads_run = reads_run || produced.count(v) > 0; });
    if (reads_run || writes_operand(n) || is_random(n)) close();
  }
  close();
  return runs;
}

// Whether the nodes (sorted) may all run where the last one stands: no other node between the
// first and the last reads what they produce or writes memory.
bool movable_to_last(const Graph& g, const std::vector<int>& nodes) {
  std::set<int> in(nodes.begin(), nodes.end()), produced;
  for (int k = nodes.front(); k <= nodes.back(); ++k) {
    const Node& n = g.nodes[k];
    if (in.count(k)) {
      for (int o : n.outputs) produced.insert(o);
      continue;
    }
    bool reads = false;
    for_each_value(n, [&](int v) { reads = reads || produced.count(v) > 0; });
    if (reads || writes_operand(n) || is_random(n)) return false;
  }
  return true;
}

// A row reduction with the pointwise run computing its input and the run consuming its
// result, where that is valid (both, else one of them).
std::vector<std::vector<int>> row_groups(const Graph& g, std::vector<std::vector<int>>& runs) {
  std::vector<int> run_of(g.nodes.size(), -1);
  for (size_t r = 0; r < runs.size(); ++r)
    for (int ni : runs[r]) run_of[ni] = static_cast<int>(r);
  std::vector<int> producer(g.values.size(), -1);
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (int o : g.nodes[i].outputs) producer[o] = static_cast<int>(i);
  std::vector<bool> taken(runs.size(), false);
  std::vector<std::vector<int>> rows;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& red = g.nodes[i];
    if (!lowerable_reduction(g, red)) continue;
    const int x = red.args[0].value;
    int pro = producer[x] >= 0 ? run_of[producer[x]] : -1;
    int epi = -1;
    for (size_t k = i + 1; k < g.nodes.size() && epi < 0; ++k) {
      if (run_of[k] < 0) continue;
      for_each_value(g.nodes[k], [&](int v) {
        if (v == red.outputs[0]) epi = run_of[k];
      });
    }
    if (pro >= 0 && (taken[pro] || g.values[x].meta->dtype != c10::ScalarType::Float)) pro = -1;
    if (epi >= 0 && (taken[epi] || g.values[g.nodes[runs[epi][0]].outputs[0]].meta->dtype != c10::ScalarType::Float ||
                     !g.values[g.nodes[runs[epi][0]].outputs[0]].meta->same_sizes(*g.values[x].meta)))
      epi = -1;
    // Cross-entropy: the nll_loss reading a log_softmax gathers each row's target value.
    int loss = -1;
    for (size_t k = i + 1; k < g.nodes.size() && loss < 0; ++k)
      if (lowerable_loss(g, g.nodes[k], red)) loss = static_cast<int>(k);
    auto nodes_of = [&](int p, int e, int l) {
      std::vector<int> nodes;
      if (p >= 0) nodes = runs[p];
      nodes.push_back(static_cast<int>(i));
      if (e >= 0) nodes.insert(nodes.end(), runs[e].begin(), runs[e].end());
      if (l >= 0) nodes.push_back(l);
      std::sort(nodes.begin(), nodes.end());
      return nodes;
    };
    for (auto [p, e, l] : {std::tuple{pro, epi, loss}, std::tuple{pro, -1, loss}, std::tuple{-1, epi, loss},
                           std::tuple{-1, -1, loss}, std::tuple{pro, epi, -1}, std::tuple{pro, -1, -1},
                           std::tuple{-1, epi, -1}}) {
      if (p < 0 && e < 0 && l < 0) continue;  // a reduction alone: ATen's kernel is as good
      auto nodes = nodes_of(p, e, l);
      if (!movable_to_last(g, nodes)) continue;
      if (p >= 0) taken[p] = true;
      if (e >= 0) taken[e] = true;
      rows.push_back(std::move(nodes));
      break;
    }
  }
  std::vector<std::vector<int>> rest;
  for (size_t r = 0; r < runs.size(); ++r)
    if (!taken[r]) rest.push_back(std::move(runs[r]));
  runs = std::move(rest);
  return rows;
}

// Inputs, scalars and outputs of a group from its nodes.
FusionGroup make_group(const Graph& g, std::vector<int> nodes, int reduction, const std::vector<int>& uses) {
  FusionGroup grp;
  grp.nodes = std::move(nodes);
  grp.reduction = reduction;
  std::set<int> produced;
  for (int ni : grp.nodes)
    for (int o : g.nodes[ni].outputs) produced.insert(o);
  std::map<int, int> inside_uses;
  std::set<int> seen_in, seen_scalar;
  std::vector<int> columns;  // the reduction's weight and bias
  if (reduction >= 0)
    for (size_t a = 2; a < 4 && op_info(g.nodes[reduction].id).reduction == Reduction::kLayerNorm; ++a)
      if (g.nodes[reduction].args[a].kind == Arg::Kind::kValue) columns.push_back(g.nodes[reduction].args[a].value);
  for (int ni : grp.nodes)
    for_each_value(g.nodes[ni], [&](int v) {
      if (produced.count(v)) {
        ++inside_uses[v];
      } else if (g.values[v].kind == Value::Kind::kTensor) {
        if (std::find(columns.begin(), columns.end(), v) == columns.end() && seen_in.insert(v).second)
          grp.tensor_inputs.push_back(v);
      } else if (seen_scalar.insert(v).second) {
        grp.scalar_inputs.push_back(v);
      }
    });
  for (int c : columns) grp.tensor_inputs.push_back(c);
  for (int ni : grp.nodes)
    for (int o : g.nodes[ni].outputs)
      if (uses[o] > inside_uses[o]) grp.outputs.push_back(o);
  const int shape_value = reduction >= 0 ? g.nodes[reduction].outputs[0] : g.nodes[grp.nodes[0]].outputs[0];
  grp.dtype = g.values[shape_value].meta->dtype;
  return grp;
}

}  // namespace

std::vector<FusionGroup> fuse_pointwise(Graph& g) {
  const auto uses = g.use_counts();
  auto runs = pointwise_runs(g);
  const auto rows = row_groups(g, runs);
  std::vector<FusionGroup> groups;
  for (const auto& nodes : rows) {
    int red = -1;
    for (int ni : nodes)
      if (lowerable_reduction(g, g.nodes[ni])) red = ni;
    groups.push_back(make_group(g, nodes, red, uses));
  }
  for (auto& run : runs)
    if (run.size() >= 2)  // one op alone: ATen's vectorized kernel is as good
      groups.push_back(make_group(g, std::move(run), -1, uses));
  // In the order they run (where their last node stands).
  std::sort(groups.begin(), groups.end(), [](const FusionGroup& a, const FusionGroup& b) {
    return a.nodes.back() < b.nodes.back();
  });
  for (size_t gi = 0; gi < groups.size(); ++gi)
    for (int ni : groups[gi].nodes) g.nodes[ni].fused_group = static_cast<int>(gi);
  return groups;
}

}  // namespace neuronx::compiler
