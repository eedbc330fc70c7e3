// eliminate_dead_code: nodes whose results nothing reads and that have no effect go.
#include "compiler/passes.h"

namespace neuronx::compiler {

int eliminate_dead_code(Graph& g) {
  auto uses = g.use_counts();
  int removed = 0;
  for (size_t i = g.nodes.size(); i-- > 0;) {
    Node& n = g.nodes[i];
    bool used = false;
    for (int o : n.outputs) used = used || uses[o] > 0;
    if (used || has_effect(n)) continue;
    for_each_value(n, [&](int v) { --uses[v]; });
    g.nodes.erase(g.nodes.begin() + static_cast<long>(i));
    ++removed;
  }
  return removed;
}

}  // namespace neuronx::compiler
