#pragma once
// Memory planning: the intermediates of an executable whose sizes are known
// at compile time live in one device buffer per launch (the arena), at
// offsets chosen so that buffers whose lifetimes do not overlap share memory.
#include <cstdint>
#include <vector>

#include "compiler/graph.h"

namespace neuronx::compiler {

struct MemoryPlan {
  int64_t arena_bytes = 0;         // the launch's device buffer
  int64_t planned_bytes = 0;       // the planned buffers' sizes added up (no reuse)
  int planned_values = 0;
  std::vector<int64_t> offset;     // per value: its byte offset in the arena, or -1
};

// The bytes a tensor with this (static) meta spans, from its first to its last element.
int64_t span_bytes(const TensorMeta& m);

// `candidate[v]`: v may live in the arena (static meta, not returned, not an input).
// `first[v]`, `last[v]`: the steps that produce v and that last read it or any view of it.
MemoryPlan plan_memory(const Graph& g, const std::vector<bool>& candidate, const std::vector<int>& first,
                       const std::vector<int>& last);

}  // namespace neuronx::compiler
