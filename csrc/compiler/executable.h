#pragma once
// A compiled program (the NEFF analogue): the graph after passes, its fused
// kernels and the launch list. launch() runs on the host: it binds symbols,
// allocates the outputs and enqueues the whole program on the current stream
// as one task; the task runs the fused loops and, for ops without a lowering,
// ATen's kernels (library calls) on CPU views of device memory.
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/metrics.h"
#include "backend/device_kernels.h"
#include "compiler/codegen.h"
#include "compiler/graph.h"
#include "compiler/kernel_cache.h"
#include "compiler/memory_plan.h"
#include "compiler/passes.h"

namespace neuronx::compiler {

class __attribute__((visibility("hidden"))) Executable : public std::enable_shared_from_this<Executable> {
 public:
  Executable(Graph g, std::vector<FusionGroup> groups, std::vector<KernelFn> kernels,
             std::vector<std::shared_ptr<SharedObject>> libraries);
  std::vector<c10::IValue> launch(const std::vector<c10::IValue>& inputs) const;
  // On the queue: runs the program over `env` (inputs filled in) and writes the outputs;
  // `arena`: the launch's device buffer of planned intermediates (CPU address);
  // `report_steps`: each step goes to the runtime's task observer (torch.profiler).
  void execute(std::vector<c10::IValue>& env, const std::vector<at::Tensor>& outputs, char* arena,
               c10::DeviceIndex d, bool report_steps) const;
  const Graph& graph() const { return graph_; }
  const MemoryPlan& memory_plan() const { return plan_; }
  int out_calls() const;
  // Returned results written elsewhere first and copied at the end of each run (a result whose
  // op is lent its memory counts as written in place: see place_value_).
  int output_copies() const;
  int folded() const;  // nodes evaluated when the executable was built
  bool is_folded(int node) const { return folded_[node]; }

 // An out= call: the overload, a scalar argument it takes before the outs (out_as), and whether
  // its CPU kernel writes any dense `out` layout (not a composite's copy).
  struct OutCall {
    c10::OperatorHandle op;
    std::optional<c10::IValue> extra;
    bool any_layout = false;
  };

 private:
  struct Step {
    bool group;
    int index;                 // node or group index
    std::vector<int> release;  // values whose last use is this step
  };
  void run_node(int ni, std::vector<c10::IValue>& env, const std::vector<at::Tensor>& outputs, char* arena,
                c10::DeviceIndex d) const;
  void run_group(int gi, std::vector<c10::IValue>& env, const std::vector<at::Tensor>& outputs, char* arena,
                 c10::DeviceIndex d) const;
  // A group whose loop runs over rows (a row reduction, broadcast inputs).
  void run_rows(int gi, std::vector<c10::IValue>& env, const std::vector<at::Tensor>& outputs, char* arena,
                c10::DeviceIndex d) const;
  // Where value v is written: its place in the arena or the caller's output, if it has one
  // (a channels-last output only for writers that honour its strides: `channels_last_ok`).
  at::Tensor destination(int v, const std::vector<at::Tensor>& outputs, char* arena,
                         bool channels_last_ok = false) const;
  // Node ni's results for a kernel writing where we choose: destination() or new tensors with
  // the meta's geometry; empty when some result's geometry is not static. `chosen`: set when
  // some result has a destination.
  std::vector<at::Tensor> result_buffers(int ni, const std::vector<at::Tensor>& outputs, char* arena,
                                         bool channels_last_ok, bool* chosen = nullptr) const;
  void plan();
  void fold_constants();
  // How run_node turns an operand into the value the op's schema takes: decided per argument
  // when the executable is built, from the schema's formal types.
  enum class ArgConv : uint8_t {
    kAsIs, kGenerator, kTensorList, kOptionalTensorList, kFloatList, kBoolList, kIntList, kTensor, kInt, kDevice
  };
  static ArgConv arg_conv(const c10::Argument& formal, const Arg& a);
  std::vector<std::vector<ArgConv>> arg_convs_;  // per node (aten nodes; empty for scalar ops)
  // Per node: the env slot of its first generator argument, or -1. The launch resolves each
  // generator to the CPU generator it draws from on the host, in program order: a later
  // manual_seed on the host must not reach a launch that is still queued.
  std::vector<int> gen_slot_;
  size_t env_size_ = 0;  // values, then the generator slots
  Graph graph_;
  std::vector<FusionGroup> groups_;
  std::vector<KernelFn> kernels_;
  std::vector<bool> row_loops_;                       // per group: loops_over_rows
  std::vector<int> loss_nodes_;                       // per group: its fused loss node, or -1
  std::vector<std::vector<Operand>> operand_kinds_;   // per group: how its loop reads each input
  std::vector<std::shared_ptr<SharedObject>> libraries_;
  std::vector<Step> steps_;
  std::vector<bool> host_value_;  // scalars the host computes before launch
  std::vector<int> output_index_;  // value -> its position among the graph outputs, or -1
  // Per value: the strides its (static) meta promises for a fresh tensor a library call returns,
  // empty when symbolic or not such a result. ATen's CPU kernels may lay a result out otherwise
  // than the meta kernels traced for neuron do (a convolution of a channels-last input returns
  // channels-last; the meta, for a non-CPU device, contiguous): such a result is copied into the
  // promised layout, so the views after it (traced on the meta's strides) read it right.
  std::vector<std::vector<int64_t>> promised_strides_;
  void conform(int ni, std::vector<c10::IValue>& env) const;
  // Per node run by its functional kernel: the returned result whose memory is lent to the op's
  // allocation of that size (kernel_scratch.h), or -1; the caller's tensor for it at run time.
  std::vector<int> place_value_;
  at::Tensor placement_destination(int ni, const std::vector<at::Tensor>& outputs) const;
  // Node ni's returned result is lent instead of passed as `out` (a composite out= computes
  // into new memory and copies).
  bool lends(int ni) const { return place_value_[ni] >= 0 && (!out_op_[ni] || !out_op_[ni]->any_layout); }
  void settle_placement(int ni, c10::Stack& stack, const at::Tensor& placed) const;
  void fill_empty_stats(int ni, std::vector<c10::IValue>& env) const;
  // Per node: the op's out= overload, when the node's results can be written into memory we
  // choose (the arena, or the caller's output) instead of memory the op allocates.
  std::vector<std::optional<OutCall>> out_op_;
  std::unique_ptr<std::atomic<bool>[]> out_failed_;  // per node: its out= call raised once
  std::vector<DeviceKernel> device_kernel_;  // per functional node: ours in place of CPU's (fallback_policy.h)
  std::vector<OpCounters*> device_kernel_counters_;  // ...counted in its op's metrics
  MemoryPlan plan_;
  std::vector<bool> folded_;             // per node: evaluated at build time
  std::vector<std::pair<int, c10::IValue>> constants_;  // folded values and their results
};

}  // namespace neuronx::compiler
