#include "compiler/memory_plan.h"

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cmath>

namespace neuronx::compiler {

namespace {
constexpr int64_t kAlign = 64;  // a cache line (and the widest vector) per buffer

int64_t constant(const SymExpr& e) { return e.value(); }
}  // namespace

int64_t span_bytes(const TensorMeta& m) {
  int64_t extent = 1;
  for (size_t i = 0; i < m.sizes.size(); ++i) {
    const int64_t n = constant(m.sizes[i]);
    if (n == 0) return 0;
    extent += (n - 1) * std::abs(constant(m.strides[i]));
  }
  return extent * static_cast<int64_t>(c10::elementSize(m.dtype));
}

MemoryPlan plan_memory(const Graph& g, const std::vector<bool>& candidate, const std::vector<int>& first,
                       const std::vector<int>& last) {
  MemoryPlan plan;
  plan.offset.assign(g.values.size(), -1);
  struct Buffer {
    int value;
    int64_t bytes;
    int begin, end;  // steps, inclusive
  };
  std::vector<Buffer> buffers;
  for (size_t v = 0; v < g.values.size(); ++v) {
    if (!candidate[v] || first[v] < 0) continue;
    const int64_t bytes = (span_bytes(*g.values[v].meta) + kAlign - 1) / kAlign * kAlign;
    if (bytes == 0) continue;
    buffers.push_back({static_cast<int>(v), bytes, first[v], std::max(first[v], last[v])});
  }
  // Largest first, each at the lowest offset free for its whole lifetime (first fit).
  std::stable_sort(buffers.begin(), buffers.end(), [](const Buffer& a, const Buffer& b) { return a.bytes > b.bytes; });
  std::vector<const Buffer*> placed;
  for (const Buffer& b : buffers) {
    std::vector<std::pair<int64_t, int64_t>> busy;  // byte ranges of live, placed buffers
    for (const Buffer* p : placed)
      if (p->begin <= b.end && b.begin <= p->end) busy.emplace_back(plan.offset[p->value], plan.offset[p->value] + p->bytes);
    std::sort(busy.begin(), busy.end());
    int64_t at = 0;
    for (const auto& r : busy) {
      if (at + b.bytes <= r.first) break;
      at = std::max(at, r.second);
    }
    plan.offset[b.value] = at;
    plan.arena_bytes = std::max(plan.arena_bytes, at + b.bytes);
    plan.planned_bytes += b.bytes;
    ++plan.planned_values;
    placed.push_back(&b);
  }
  return plan;
}

}  // namespace neuronx::compiler
