#pragma once
// A compiled program (the NEFF analogue): the graph after passes, its fused
// kernels and the launch list. launch() runs on the host: it binds symbols,
// allocates the outputs and enqueues the whole program on the current stream
// as one task; the task runs the fused loops and, for ops without a lowering,
// ATen's kernels (library calls) on CPU views of device memory.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "compiler/graph.h"
#include "compiler/kernel_cache.h"
#include "compiler/passes.h"

namespace neuronx::compiler {

struct CompileStats {
  PassStats passes;
  BuildStats build;
  int library_calls = 0;                       // nodes run as ATen kernels
  std::map<std::string, int> library_ops;      // ... by op
  double seconds = 0;
  std::string ir_hash;
};

class __attribute__((visibility("hidden"))) Executable : public std::enable_shared_from_this<Executable> {
 public:
  Executable(Graph g, std::vector<FusionGroup> groups, std::vector<KernelFn> kernels,
             std::vector<std::shared_ptr<SharedObject>> libraries);
  std::vector<c10::IValue> launch(const std::vector<c10::IValue>& inputs) const;
  // On the queue: runs the program over `env` (inputs filled in) and writes the outputs.
  void execute(std::vector<c10::IValue>& env, const std::vector<at::Tensor>& outputs, c10::DeviceIndex d) const;
  const Graph& graph() const { return graph_; }

 private:
  struct Step {
    bool group;
    int index;                 // node or group index
    std::vector<int> release;  // values whose last use is this step
  };
  void run_node(const Node& n, std::vector<c10::IValue>& env, c10::DeviceIndex d) const;
  void run_group(int gi, std::vector<c10::IValue>& env, const std::vector<at::Tensor>& outputs,
                 c10::DeviceIndex d) const;
  Graph graph_;
  std::vector<FusionGroup> groups_;
  std::vector<KernelFn> kernels_;
  std::vector<std::shared_ptr<SharedObject>> libraries_;
  std::vector<Step> steps_;
  std::vector<bool> host_value_;  // scalars the host computes before launch
  std::vector<int> output_index_;  // value -> its position among the graph outputs, or -1
};

// Runs the passes, generates and builds the kernels (or loads them from the cache).
std::shared_ptr<Executable> compile(Graph g, const std::string& debug_dir, CompileStats& stats);

}  // namespace neuronx::compiler
