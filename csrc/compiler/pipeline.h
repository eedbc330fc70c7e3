#pragma once
// The compiler's pipeline: the passes over a graph, in order, then code
// generation and the executable.
#include <map>
#include <memory>
#include <string>

#include "compiler/executable.h"

namespace neuronx::compiler {

struct CompileStats {
  PassStats passes;
  BuildStats build;
  int library_calls = 0;                       // nodes run as ATen kernels
  std::map<std::string, int> library_ops;      // ... by op
  int out_calls = 0;                           // library calls writing into planned memory (out=)
  int64_t arena_bytes = 0, planned_bytes = 0;  // memory plan: arena size, planned buffers' sum
  int planned_values = 0;
  double seconds = 0;
  std::string ir_hash;
};

// Runs the passes, generates and builds the kernels (or loads them from the cache).
std::shared_ptr<Executable> compile(Graph g, const std::string& debug_dir, CompileStats& stats);

}  // namespace neuronx::compiler
