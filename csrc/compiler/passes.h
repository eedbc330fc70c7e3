#pragma once
// Graph passes, in the order the compiler runs them: dead-code and common
// subexpression elimination, then grouping of pointwise chains into fused
// kernels (the groups code generation turns into loops).
#include "compiler/graph.h"

namespace neuronx::compiler {

struct PassStats {
  int dead_removed = 0;
  int common_removed = 0;
  int groups = 0;
  int fused_nodes = 0;
};

// Removes nodes whose results nothing uses and that write no operand.
int eliminate_dead_code(Graph& g);
// Merges nodes computing the same op on the same operands (deterministic ops only).
int eliminate_common_subexpressions(Graph& g);

// A run of pointwise nodes over one shape and dtype, computed by one loop.
struct FusionGroup {
  std::vector<int> nodes;          // node indices, in order
  std::vector<int> tensor_inputs;  // value ids read from outside the group
  std::vector<int> scalar_inputs;  // runtime scalar value ids used by the group
  std::vector<int> outputs;        // value ids the group writes (used after it)
  c10::ScalarType dtype = c10::ScalarType::Float;
};
std::vector<FusionGroup> fuse_pointwise(Graph& g);

}  // namespace neuronx::compiler
