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

// The group's kernel: extern "C" void <name>(char* const* ptrs, const double* scalars,
// int64_t begin, int64_t end); ptrs are the group's tensor inputs then its outputs; [begin,
// end) are flat indices, or rows for a row group (whose row length is the scalar after the
// group's own).
std::string generate_kernel(const Graph& g, const FusionGroup& group, const std::string& name);

// Helpers every generated translation unit starts with (bfloat16 conversions).
std::string kernel_prelude();

}  // namespace neuronx::compiler
