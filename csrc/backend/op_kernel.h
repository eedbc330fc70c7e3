#pragma once
// A queued ATen op: the operator and its operands (CPU aliases of device
// buffers, captured at enqueue). Kept as data, not a closure, so queued work
// can be inspected (and later fused) before it runs.
#include <mutex>
#include <stdexcept>
#include <optional>
#include <unordered_set>
#include <string>
#include <vector>

#include "backend/common.h"
#include "backend/meta_cache.h"
#include "backend/metrics.h"
#include "backend/device_kernels.h"
#include "runtime/recycled.h"
#include "backend/tensor_views.h"
#include "runtime/kernel.h"

namespace neuronx {

// The argument that return r of schema s aliases (its alias set), or -1.
int aliased_argument(const c10::FunctionSchema& s, size_t r);

// What the fallback learned about an operator's schema and its policy
// (fallback_policy.h), computed once.
struct OpAnalysis {
  c10::OperatorHandle op;
  std::string name;                        // "aten::add.Tensor"
  size_t num_args = 0, num_returns = 0;
  std::vector<bool> arg_written;           // argument is mutated (Tensor(a!))
  std::vector<bool> arg_out;               // ...as an out= argument (not self of an in-place op)
  std::vector<int> ret_arg;                // return aliases this argument, or -1 (new)
  std::vector<bool> ret_view;              // ...as a view (not a mutated argument)
  std::vector<int> generator_args;         // Generator? arguments
  std::vector<int> dtype_args;             // ScalarType? arguments
  bool any_written = false;
  bool any_new = false;                    // some return is a fresh tensor
  bool allow_cpu_operands = false;         // CUDA also accepts host tensors here (indices)
  bool float_values_shape = false;         // float scalars decide output shapes (arange, linspace, ...)
  enum class Indexing : uint8_t { kNone, kGet, kPut };
  Indexing indexing = Indexing::kNone;     // advanced indexing (self, indices, ...): host checks first
  bool fills = false;                      // fill_: the host sees the value written (seen_values.h)
  bool eval_stats_empty = false;           // batch norm: CPU returns empty saved stats in eval
  uint32_t policy = 0;                     // its fallback_policy.h flags
  DeviceKernel device_kernel = nullptr;    // ours in place of the CPU kernel (fallback_policy.h)
  std::optional<c10::OperatorHandle> out_op;  // out= form for purely functional ops
  mutable std::atomic<bool> sync_only{false};  // no (reliable) meta kernel: always the synchronous path
  mutable std::atomic<bool> out_form_resizes{false};  // out= kernel reallocates: use the functional form
  // Its CPU kernel chose another output layout than its meta kernel for some
  // signature: the first call of every signature runs inline (to learn it).
  mutable std::atomic<bool> layout_varies{false};
  OpCounters* counters = nullptr;
  MetaCache meta_cache;
  // Dtype signatures whose first call ran inline: the CPU kernel accepted
  // them, so later calls can be queued (dtype errors then raise at the op).
  bool validated(const std::string& dtype_key);
  void mark_validated(const std::string& dtype_key);

 private:
  std::mutex validated_mu_;
  std::unordered_set<std::string> validated_;

 public:

  explicit OpAnalysis(const c10::OperatorHandle& h);
};

// The CPU kernel produced outputs of other shapes than the meta kernel
// predicted: the op is moved to the synchronous path.
struct MetaMismatch : std::runtime_error {
  explicit MetaMismatch(const std::string& what, bool dtype = false) : std::runtime_error(what), dtype(dtype) {}
  bool dtype;  // the dtype differs (the meta kernel's promotion is wrong for these operand dtypes)
};

class OpKernel final : public rt::Kernel {
 public:
  enum class Mode : uint8_t {
    kDirect,          // run the op itself on aliases (in-place / out= / mutating ops)
    kOut,             // run its out= form writing straight into the new outputs
    kFunctionalCopy,  // run the functional op, copy results into the new outputs
  };
  OpKernel(const OpAnalysis* a, Mode m)
      : op_(a),
        mode_(m),
        args_(rt::Recycled<c10::Stack>::take()),
        outs_(rt::Recycled<c10::Stack>::take()),
        made_(rt::Recycled<c10::Stack>::take()) {}
  ~OpKernel() override {
    rt::Recycled<c10::Stack>::give(std::move(args_));
    rt::Recycled<c10::Stack>::give(std::move(outs_));
    rt::Recycled<c10::Stack>::give(std::move(made_));
  }
  void run() override;      // on the queue: errors become plain messages (no C++ backtrace)
  void execute();           // the kernel itself; also run inline to validate a first call
  const char* name() const override { return op_->name.c_str(); }
  // Its neuron operands' storages (while queued; materialized operands are host views).
  bool may_touch(const void* p, size_t n) const override;

  const OpAnalysis& op() const { return *op_; }
  Mode mode() const { return mode_; }
  c10::Stack& args() { return args_; }
  const c10::Stack& args() const { return args_; }
  // One entry per return: aliases of the new outputs (None for other returns).
  std::vector<c10::IValue>& outs() { return outs_; }
  // The outputs' geometry, to restore them if an out= kernel fails half-way.
  void set_geometry(std::shared_ptr<const MetaResult> g) { geometry_ = std::move(g); }
  // A first call run inline: also check that the CPU kernel's output strides
  // are the ones the meta kernel predicted (they differ for some linalg/fft ops).
  void set_validating(bool v) { validating_ = v; }
  void set_mode(Mode m) { mode_ = m; }
  // A neuron operand whose CPU alias is made when the kernel runs, on the engine's thread (which
  // then also destroys it): the host's per-op cost is a snapshot. It goes to args()[arg] (outs()
  // [-1 - arg] for outputs), or to position pos of the list there; the slot holds an undefined
  // placeholder until then.
  void defer(const AliasSet& snapshots, const at::Tensor& t, int arg, int pos) {
    Deferred& d = deferred_.emplace_back();
    snapshots.snapshot_into(t, d.snapshot);
    d.arg = arg;
    d.pos = pos;
    if (arg < 0 && track_output_liveness()) d.released.emplace(t.storage().getWeakStorageImpl());
  }
  struct Deferred {
    TensorSnapshot snapshot;
    int arg = 0, pos = -1;
    // A new output's storage, held weakly while the kernel is queued (set_track_output_liveness):
    // expired once nothing references the output any more, so a fused group need not write it.
    std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> released;
  };
  // Adaptive eager turns this on: kernels launched from then on watch their new outputs.
  static void set_track_output_liveness(bool on);
  static bool track_output_liveness() { return track_liveness_.load(std::memory_order_relaxed); }
  // The neuron operands not yet materialized (all of them while the kernel is queued): what the
  // adaptive-eager tier reads to fuse queued kernels without running them.
  c10::ArrayRef<Deferred> deferred() const { return deferred_; }

 private:
  void materialize();
  void restore_restrided_outputs();
  static std::atomic<bool> track_liveness_;
  c10::SmallVector<Deferred, 3> deferred_;
  std::vector<c10::Storage> keep_;  // storages of operands the stream order does not cover
  const OpAnalysis* op_;
  Mode mode_;
  c10::Stack args_;
  std::vector<c10::IValue> outs_;
  c10::Stack made_;  // the CPU aliases materialize() made, recycled once the kernel ran
  std::shared_ptr<const MetaResult> geometry_;
  bool validating_ = false;
};

// The boxed kernel every aten op without a neuron kernel of its own goes
// through: the CPU kernel run on the device's queue over device memory.
void neuron_fallback(const c10::OperatorHandle& op, c10::Stack* stack);

// The fallback's analysis of op (made once, kept for the process).
OpAnalysis& op_analysis(const c10::OperatorHandle& op);
// The fallback's work for one call of a's op, for entry points that hold the arguments
// themselves (the boxed fallback; unboxed entry points, fast_ops.cpp). Returns that are one
// of the arguments (in-place self, out=) are left None: the caller returns its argument
// (fill_aliased_returns does, for a boxed caller).
void run_fallback(OpAnalysis& a, c10::ArrayRef<c10::IValue> args, std::vector<c10::IValue>& results);
void fill_aliased_returns(const OpAnalysis& a, c10::ArrayRef<c10::IValue> args, std::vector<c10::IValue>& results);

}  // namespace neuronx
