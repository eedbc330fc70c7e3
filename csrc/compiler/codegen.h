#pragma once
// C++ source for fused groups: one loop per pointwise group over the flat
// index, or per row group over rows, reading its inputs once and writing only
// values used after it.
// Math follows eager (no fast-math; float accumulation for bfloat16).
#include <string>

#include "compiler/graph.h"
#include "compiler/passes.h"

namespace neuronx::compiler {

// Whether code generation has a lowering for this node (op, dtypes, operands).
bool lowerable(const Graph& g, const Node& n);
// Whether this node is a row reduction code generation lowers (float32 softmax / log_softmax
// over the last dim, layer norm over the last dim with optional [N] weight and bias).
bool lowerable_reduction(const Graph& g, const Node& n);
// Whether n is an nll_loss_forward over the result of the log_softmax `red` (a row reduction of
// [rows, classes]) with int64 [rows] targets and no class weights: fused as a per-row gather.
bool lowerable_loss(const Graph& g, const Node& n, const Node& red);
// The fused loss node of a row group, or -1.
int loss_node(const Graph& g, const FusionGroup& grp);

// How a fused loop reads a tensor input: at the element's index (kElement), broadcast over
// leading dims (kOuterBroadcast: a row of the group's last dim, found per row from its
// strides), one value per row (kRowBroadcast: its last dim broadcast), or at the element's
// column (kColumn: a row group's [N] layer-norm weight or bias).
// kRowIndex: a fused loss's int64 target, one per row.
enum class Operand : uint8_t { kElement, kOuterBroadcast, kRowBroadcast, kColumn, kRowIndex };
std::vector<Operand> operand_kinds(const Graph& g, const FusionGroup& grp);
// Whether the group's loop runs over rows of its last dim: a row reduction, or an input that
// is broadcast. Otherwise it runs over the flat index.
bool loops_over_rows(const Graph& g, const FusionGroup& grp);

// The group's kernel: extern "C" void <name>(char* const* ptrs, const double* scalars,
// int64_t begin, int64_t end); ptrs are the group's tensor inputs then its outputs. Over the
// flat index, [begin, end) are element indices; over rows they are rows, and the group's own
// scalars are followed by the row length n, the number R of leading dims, their sizes, and
// per element or broadcast input its R leading strides (elements; 0 where broadcast). A row
// group with a loss gets three more pointers after its outputs: per-row losses and weights
// (float[rows]) and a slot (int64) where a target out of range is written.
std::string generate_kernel(const Graph& g, const FusionGroup& group, const std::string& name);

// Helpers every generated translation unit starts with (bfloat16 conversions).
std::string kernel_prelude();

}  // namespace neuronx::compiler
