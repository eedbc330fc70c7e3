// Executable::launch, on the host: binds the symbols, allocates the outputs and the arena, and
// enqueues the whole program on the current stream as one task.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>

#include <cmath>

#include "backend/common.h"
#include "backend/generator.h"
#include "backend/tensor_views.h"
#include "compiler/executable.h"
#include "compiler/scalar_ops.h"
#include "runtime/queue.h"

namespace neuronx::compiler {

namespace {

class ExecKernel final : public rt::Kernel {
 public:
  ExecKernel(std::shared_ptr<const Executable> exe, std::vector<c10::IValue> env, std::vector<at::Tensor> outputs,
             char* arena_cpu, c10::DeviceIndex d)
      : exe_(std::move(exe)),
        env_(std::move(env)),
        outputs_(std::move(outputs)),
        arena_cpu_(arena_cpu),
        device_(d) {}
  void run() override {
    try {
      // Under torch.profiler each step of the program is reported as a device kernel of its own.
      reported_steps = rt::observing();
      exe_->execute(env_, outputs_, arena_cpu_, device_, reported_steps);
    } catch (const c10::Error& e) {  // raised at synchronization as the same Python type
      throw rt::KernelError(e.what_without_backtrace(), static_cast<int>(kernel_error_kind(e)));
    }
    env_.clear();
    outputs_.clear();
  }
  const char* name() const override { return "neuron::executable"; }

 private:
  std::shared_ptr<const Executable> exe_;
  std::vector<c10::IValue> env_;
  std::vector<at::Tensor> outputs_;
  // The launch's planned intermediates: device memory of the launching stream, freed by the host
  // after the launch and reused by later work on that stream only (stream order).
  char* arena_cpu_;
  c10::DeviceIndex device_;
};

}  // namespace

std::vector<c10::IValue> Executable::launch(const std::vector<c10::IValue>& inputs) const {
  const Graph& g = graph_;
  TORCH_CHECK(inputs.size() == g.inputs.size(), "compiled graph expects ", g.inputs.size(), " inputs, got ",
              inputs.size());
  std::optional<c10::DeviceIndex> dev;
  for (const auto& v : inputs)
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().device().type() == kNeuron) {
      dev = v.toTensor().device().index();
      break;
    }
  const c10::DeviceIndex d = dev ? *dev : current_device();
  // Symbols from the inputs, by index (size expressions were resolved when the graph was built).
  std::vector<int64_t> sym_ints;
  std::vector<double> sym_floats;
  sym_ints.reserve(g.symbols.size());
  sym_floats.reserve(g.symbols.size());
  for (const auto& s : g.symbols) {
    const c10::IValue& v = inputs[s.input];
    if (s.dim >= 0) {
      sym_ints.push_back(v.toTensor().size(s.dim));
      sym_floats.push_back(static_cast<double>(sym_ints.back()));
    } else {
      sym_floats.push_back(as_double(v));
      sym_ints.push_back(v.isInt() ? v.toInt() : static_cast<int64_t>(std::llround(sym_floats.back())));
    }
  }
  std::vector<c10::IValue> env(g.values.size());
  rt::Queue& queue = current_queue(d);
  AliasSet aliases(&queue);
  std::vector<int> input_of(g.values.size(), -1);
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    const c10::IValue& v = inputs[i];
    input_of[g.inputs[i].value] = static_cast<int>(i);
    if (v.isTensor() && v.toTensor().defined()) {
      const at::Tensor& t = v.toTensor();
      env[g.inputs[i].value] = t.device().type() == kNeuron ? c10::IValue(aliases.cpu(t))
                               : t.unsafeGetTensorImpl()->is_wrapped_number() ? c10::IValue(t)
                                                                               : c10::IValue(t.clone());
    } else {
      env[g.inputs[i].value] = v;
    }
  }
  for (const auto& [v, c] : constants_) env[v] = c;
  env.resize(env_size_);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    int slot = gen_slot_[i];
    if (slot < 0) continue;
    for (size_t k = 0; k < g.nodes[i].args.size(); ++k) {
      if (arg_convs_[i][k] != ArgConv::kGenerator) continue;
      const Arg& a = g.nodes[i].args[k];
      const c10::IValue& v = a.kind == Arg::Kind::kValue ? env[a.value] : a.constant;
      env[slot++] = kernel_generator(v.isNone() ? std::nullopt : std::optional<at::Generator>(v.toGenerator()), d);
    }
  }
  // Scalar ops (symbolic sizes and floats) are host work: evaluate them now.
  for (const auto& n : g.nodes) {
    if (n.kind != Node::Kind::kScalarOp) continue;
    if (n.id == OpId::kSymSize || n.id == OpId::kSymStride || n.id == OpId::kSymNumel) {
      const int tv = n.args[0].value;
      int64_t r;
      if (input_of[tv] >= 0) {
        const at::Tensor& t = inputs[input_of[tv]].toTensor();
        r = n.id == OpId::kSymNumel ? t.numel()
            : n.id == OpId::kSymSize ? t.size(n.args[1].constant.toInt())
                                      : t.stride(n.args[1].constant.toInt());
      } else {
        const TensorMeta& m = *g.values[tv].meta;
        if (n.id == OpId::kSymNumel) {
          r = 1;
          for (const auto& e : m.sizes) r *= e.eval(sym_ints, sym_floats);
        } else {
          int64_t dim = n.args[1].constant.toInt();
          const auto& es = n.id == OpId::kSymSize ? m.sizes : m.strides;
          if (dim < 0) dim += static_cast<int64_t>(es.size());
          r = es.at(dim).eval(sym_ints, sym_floats);
        }
      }
      env[n.outputs[0]] = c10::IValue(r);
      continue;
    }
    std::vector<c10::IValue> a;
    for (const auto& arg : n.args) a.push_back(arg.kind == Arg::Kind::kValue ? env[arg.value] : arg.constant);
    env[n.outputs[0]] = op_info(n.id).scalar(a);  // present: checked when the graph was built
  }
  // Outputs: device tensors allocated now, so the caller gets them before the program runs.
  std::vector<c10::IValue> results;
  std::vector<at::Tensor> out_aliases;
  for (int o : g.outputs) {
    if (o < 0) {
      results.emplace_back();
      continue;
    }
    const Value& v = g.values[o];
    if (v.kind != Value::Kind::kTensor) {
      results.push_back(input_of[o] >= 0 ? inputs[input_of[o]] : env[o]);
      continue;
    }
    if (input_of[o] >= 0 && inputs[input_of[o]].isTensor()) {  // returned unchanged
      results.push_back(inputs[input_of[o]]);
      out_aliases.emplace_back();
      continue;
    }
    const TensorMeta& m = *v.meta;
    c10::DimVector sizes, strides;
    for (const auto& e : m.sizes) sizes.push_back(e.eval(sym_ints, sym_floats));
    for (const auto& e : m.strides) strides.push_back(e.eval(sym_ints, sym_floats));
    at::Tensor t = at::empty_strided(sizes, strides, at::TensorOptions().dtype(m.dtype).device(kNeuron, d));
    out_aliases.push_back(aliases.cpu(t));
    results.emplace_back(std::move(t));
  }
  // Output aliases in graph-output order, undefined for non-tensor outputs.
  std::vector<at::Tensor> outs;
  size_t k = 0;
  for (int o : g.outputs) {
    if (o >= 0 && g.values[o].kind == Value::Kind::kTensor) outs.push_back(out_aliases[k++]);
    else outs.emplace_back();
  }
  at::Tensor arena;
  char* arena_cpu = nullptr;
  if (plan_.arena_bytes > 0) {
    arena = at::empty({plan_.arena_bytes}, at::TensorOptions().dtype(at::kByte).device(kNeuron, d));
    arena_cpu = static_cast<char*>(aliases.cpu(arena).data_ptr());
  }
  translate([&] {
    queue.launch(std::make_unique<ExecKernel>(shared_from_this(), std::move(env), std::move(outs), arena_cpu, d));
  });
  return results;
}

}  // namespace neuronx::compiler
