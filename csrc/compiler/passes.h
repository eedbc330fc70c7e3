#pragma once
// Graph passes, one per file (dead_code.cpp, simplify_views.cpp,
// common_subexpressions.cpp, fuse_pointwise.cpp; epilogue_fusion.h for GEMM and
// convolution epilogues); pipeline.cpp runs them in order. Constant folding
// happens when the executable is built (it runs ops).
#include "compiler/graph.h"

namespace neuronx::compiler {

// What the passes did, listed once (exported under these names, summed by compile_metrics()):
// constants_folded by the executable, when it is built; fused_row_groups: groups around a row
// reduction; gemms: mm/addmm run as oneDNN matmuls and convolutions run with their epilogue
// (epilogue_fusion.h); epilogues: pointwise ops fused into both; flex_attention: FlexAttention
// forwards and backwards run as generated kernels (flex_attention.h).
#define NEURONX_PASS_STATS(X)                                                                                \
  X(views_simplified) X(constants_folded) X(dead_removed) X(common_removed) X(fused_groups) X(fused_nodes) \
  X(fused_row_groups) X(gemms) X(convolutions) X(epilogues) X(flex_attention)

struct PassStats {
#define NEURONX_FIELD(f) int f = 0;
  NEURONX_PASS_STATS(NEURONX_FIELD)
#undef NEURONX_FIELD
};

// A view of a view reads the first view's base directly (when the base is
// contiguous every view of it is valid); a permute of a permute becomes one
// permute. The views skipped over are left for dead-code elimination.
int simplify_views(Graph& g);
// Removes nodes whose results nothing uses and that have no effect (has_effect).
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
  // Inputs and outputs may share memory at the same element (adaptive eager: an in-place op, or
  // a block reused within the group): no __restrict__ on the pointers.
  bool may_alias = false;
  // Elements computed in vector and in scalar form exactly where eager's kernels do (a flat
  // group run over ATen's parallel ranges): ops whose two forms differ then match eager bitwise.
  bool eager_split = false;
};
// Pointwise chains and row groups; sets Node::fused_group.
std::vector<FusionGroup> fuse_pointwise(Graph& g);

}  // namespace neuronx::compiler
