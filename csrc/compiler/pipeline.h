#pragma once
// The compiler's pipeline: the passes over a graph, in order, then code
// generation and the executable.
#include <map>
#include <memory>
#include <string>

#include "compiler/executable.h"

namespace neuronx::compiler {

// out_calls: library calls writing into planned memory (out=); output_copies: returned results
// copied into the caller's tensors at the end of a run; the memory plan: arena size,
// planned buffers' sum and count. Listed once (exported under these names).
#define NEURONX_PLAN_STATS(X) X(out_calls) X(output_copies) X(arena_bytes) X(planned_bytes) X(planned_values)

struct CompileStats {
  PassStats passes;
  BuildStats build;
#define NEURONX_FIELD(f) int64_t f = 0;
  NEURONX_PLAN_STATS(NEURONX_FIELD)
#undef NEURONX_FIELD
  std::map<std::string, int> library_calls;  // nodes run as ATen kernels, by op
  double seconds = 0;
  std::string ir_hash;
};

// Every counter's name (the Python side starts its totals from these).
std::vector<std::string> compile_counter_names();

// Runs the passes, generates and builds the kernels (or loads them from the cache).
std::shared_ptr<Executable> compile(Graph g, const std::string& debug_dir, CompileStats& stats);

}  // namespace neuronx::compiler
