#pragma once
// Graph passes, in the order the compiler runs them: view simplification,
// common subexpression and dead-code elimination, then grouping of pointwise
// chains into fused kernels (the groups code generation turns into loops).
// Constant folding happens when the executable is built (it runs ops).
#include "compiler/graph.h"

namespace neuronx::compiler {

struct PassStats {
  int views_simplified = 0;
  int constants_folded = 0;  // by the executable, when it is built
  int dead_removed = 0;
  int common_removed = 0;
  int groups = 0;
  int fused_nodes = 0;
  int row_groups = 0;  // groups around a row reduction
  int gemms = 0;         // mm/addmm run as oneDNN matmuls (epilogue_fusion.h)
  int convolutions = 0;  // convolutions run with their epilogue
  int epilogues = 0;     // pointwise ops fused into GEMMs and convolutions
};

// A view of a view reads the first view's base directly (when the base is
// contiguous every view of it is valid); a permute of a permute becomes one
// permute. The views skipped over are left for dead-code elimination.
int simplify_views(Graph& g);
// Removes nodes whose results nothing uses and that write no operand.
int eliminate_dead_code(Graph& g);
// Merges nodes computing the same op on the same operands (deterministic ops only).
int eliminate_common_subexpressions(Graph& g);

// A run of pointwise nodes over one shape and dtype, computed by one loop; or a row group:
// a reduction over the last dimension (softmax, log_softmax, layer norm) with the pointwise
// nodes computing its input (prologue) and those consuming its result (epilogue), computed by
// one loop over rows that reads each row once and writes only values used after the group.
struct FusionGroup {
  std::vector<int> nodes;          // node indices, in order
  std::vector<int> tensor_inputs;  // value ids read from outside the group (a row group: the
                                   // full-shape ones first, then the reduction's [N] weight/bias)
  std::vector<int> scalar_inputs;  // runtime scalar value ids used by the group
  std::vector<int> outputs;        // value ids the group writes (used after it)
  c10::ScalarType dtype = c10::ScalarType::Float;
  int reduction = -1;              // a row group: its reduction node
};
// Pointwise chains and row groups; sets Node::fused_group.
std::vector<FusionGroup> fuse_pointwise(Graph& g);

}  // namespace neuronx::compiler
