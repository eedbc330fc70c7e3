#include "compiler/executable.h"

#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/scalar_tensor.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <sys/stat.h>

#include "backend/common.h"
#include "backend/generator.h"
#include "backend/tensor_views.h"
#include "compiler/codegen.h"
#include "runtime/queue.h"

namespace neuronx::compiler {

namespace {

double as_double(const c10::IValue& v) {
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isBool()) return v.toBool() ? 1.0 : 0.0;
  if (v.isTensor() && v.toTensor().numel() == 1) return v.toTensor().item<double>();
  TORCH_CHECK(false, "torch_neuronx compiler: expected a number, got ", v.tagKind());
}

bool is_int(const c10::IValue& v) { return v.isInt() || v.isBool(); }

c10::IValue number(double x, bool integral) {
  return integral ? c10::IValue(static_cast<int64_t>(x)) : c10::IValue(x);
}

// The scalar ops Dynamo leaves in graphs over symbolic sizes and floats.
c10::IValue scalar_op(const std::string& op, const std::vector<c10::IValue>& a) {
  auto ints = [&] {
    for (const auto& v : a)
      if (!is_int(v)) return false;
    return true;
  };
  auto x = [&](size_t i) { return as_double(a.at(i)); };
  if (op == "add") return number(x(0) + x(1), ints());
  if (op == "sub") return number(x(0) - x(1), ints());
  if (op == "mul") return number(x(0) * x(1), ints());
  if (op == "truediv") return c10::IValue(x(0) / x(1));
  if (op == "floordiv") return number(std::floor(x(0) / x(1)), ints());
  if (op == "mod") return number(x(0) - x(1) * std::floor(x(0) / x(1)), ints());
  if (op == "neg") return number(-x(0), ints());
  if (op == "pow") return number(std::pow(x(0), x(1)), ints() && x(1) >= 0);
  if (op == "sym_float") return c10::IValue(x(0));
  if (op == "sym_int" || op == "trunc") return c10::IValue(static_cast<int64_t>(std::trunc(x(0))));
  if (op == "floor") return c10::IValue(static_cast<int64_t>(std::floor(x(0))));
  if (op == "ceil") return c10::IValue(static_cast<int64_t>(std::ceil(x(0))));
  if (op == "sqrt") return c10::IValue(std::sqrt(x(0)));
  if (op == "sym_max") return number(std::max(x(0), x(1)), ints());
  if (op == "sym_min") return number(std::min(x(0), x(1)), ints());
  if (op == "eq") return c10::IValue(x(0) == x(1));
  if (op == "ne") return c10::IValue(x(0) != x(1));
  if (op == "lt") return c10::IValue(x(0) < x(1));
  if (op == "le") return c10::IValue(x(0) <= x(1));
  if (op == "gt") return c10::IValue(x(0) > x(1));
  if (op == "ge") return c10::IValue(x(0) >= x(1));
  TORCH_CHECK(false, "torch_neuronx compiler: no runtime support for the scalar op ", op);
}

c10::IValue wrapped_number(const c10::IValue& v) {
  at::Tensor t = v.isDouble() ? at::scalar_tensor(v.toDouble(), at::kDouble)
                 : v.isBool() ? at::scalar_tensor(v.toBool(), at::kBool)
                              : at::scalar_tensor(v.toInt(), at::kLong);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return c10::IValue(t);
}

}  // namespace

Executable::Executable(Graph g, std::vector<FusionGroup> groups, std::vector<KernelFn> kernels,
                       std::vector<std::shared_ptr<SharedObject>> libraries)
    : graph_(std::move(g)), groups_(std::move(groups)), kernels_(std::move(kernels)), libraries_(std::move(libraries)) {
  host_value_.assign(graph_.values.size(), false);
  output_index_.assign(graph_.values.size(), -1);
  for (size_t i = 0; i < graph_.outputs.size(); ++i)
    if (graph_.outputs[i] >= 0 && output_index_[graph_.outputs[i]] < 0) output_index_[graph_.outputs[i]] = static_cast<int>(i);
  // Launch list: a group runs where its last node stood.
  std::vector<int> last_of_group(groups_.size());
  for (size_t gi = 0; gi < groups_.size(); ++gi) last_of_group[gi] = groups_[gi].nodes.back();
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    const Node& n = graph_.nodes[i];
    if (n.kind == Node::Kind::kScalarOp) {
      for (int o : n.outputs) host_value_[o] = true;
      continue;
    }
    if (n.fused_group >= 0) {
      if (last_of_group[n.fused_group] == static_cast<int>(i)) steps_.push_back({true, n.fused_group, {}});
      continue;
    }
    steps_.push_back({false, static_cast<int>(i), {}});
  }
  // Release each intermediate after its last use (graph outputs and inputs are kept).
  std::vector<int> last(graph_.values.size(), -1);
  for (size_t s = 0; s < steps_.size(); ++s) {
    auto mark = [&](int v) { last[v] = static_cast<int>(s); };
    if (steps_[s].group) {
      for (int v : groups_[steps_[s].index].tensor_inputs) mark(v);
      for (int ni : groups_[steps_[s].index].nodes) for (const auto& a : graph_.nodes[ni].args) for_each_value(a, mark);
    } else {
      for (const auto& a : graph_.nodes[steps_[s].index].args) for_each_value(a, mark);
    }
  }
  std::set<int> keep(graph_.outputs.begin(), graph_.outputs.end());
  for (const auto& in : graph_.inputs) keep.insert(in.value);
  for (size_t v = 0; v < last.size(); ++v)
    if (last[v] >= 0 && !keep.count(static_cast<int>(v)) && !host_value_[v]) steps_[last[v]].release.push_back(static_cast<int>(v));
}

namespace {

class ExecKernel final : public rt::Kernel {
 public:
  ExecKernel(std::shared_ptr<const Executable> exe, std::vector<c10::IValue> env, std::vector<at::Tensor> outputs,
             c10::DeviceIndex d)
      : exe_(std::move(exe)), env_(std::move(env)), outputs_(std::move(outputs)), device_(d) {}
  void run() override {
    try {
      exe_->execute(env_, outputs_, device_);
    } catch (const c10::Error& e) {
      throw std::runtime_error(e.what_without_backtrace());
    }
    env_.clear();
    outputs_.clear();
  }
  const char* name() const override { return "neuron::executable"; }

 private:
  std::shared_ptr<const Executable> exe_;
  std::vector<c10::IValue> env_;
  std::vector<at::Tensor> outputs_;
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
  // Symbols from the inputs.
  std::vector<double> sym_values;
  std::vector<std::string> sym_names;
  for (const auto& s : g.symbols) {
    const c10::IValue& v = inputs[s.input];
    sym_names.push_back(s.name);
    sym_values.push_back(s.dim < 0 ? as_double(v) : static_cast<double>(v.toTensor().size(s.dim)));
  }
  std::vector<c10::IValue> env(g.values.size());
  AliasSet aliases;
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
  // Scalar ops (symbolic sizes and floats) are host work: evaluate them now.
  for (const auto& n : g.nodes) {
    if (n.kind != Node::Kind::kScalarOp) continue;
    if (n.target == "sym_size" || n.target == "sym_stride" || n.target == "sym_numel") {
      const int tv = n.args[0].value;
      int64_t r;
      if (input_of[tv] >= 0) {
        const at::Tensor& t = inputs[input_of[tv]].toTensor();
        r = n.target == "sym_numel" ? t.numel()
            : n.target == "sym_size" ? t.size(n.args[1].constant.toInt())
                                      : t.stride(n.args[1].constant.toInt());
      } else {
        const TensorMeta& m = *g.values[tv].meta;
        if (n.target == "sym_numel") {
          double p = 1;
          for (const auto& e : m.sizes) p *= e.eval(sym_values, sym_names);
          r = static_cast<int64_t>(p);
        } else {
          int64_t dim = n.args[1].constant.toInt();
          const auto& es = n.target == "sym_size" ? m.sizes : m.strides;
          if (dim < 0) dim += static_cast<int64_t>(es.size());
          r = static_cast<int64_t>(es.at(dim).eval(sym_values, sym_names));
        }
      }
      env[n.outputs[0]] = c10::IValue(r);
      continue;
    }
    std::vector<c10::IValue> a;
    for (const auto& arg : n.args) a.push_back(arg.kind == Arg::Kind::kValue ? env[arg.value] : arg.constant);
    env[n.outputs[0]] = scalar_op(n.target, a);
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
    std::vector<int64_t> sizes, strides;
    for (const auto& e : m.sizes) sizes.push_back(static_cast<int64_t>(std::llround(e.eval(sym_values, sym_names))));
    for (const auto& e : m.strides)
      strides.push_back(static_cast<int64_t>(std::llround(e.eval(sym_values, sym_names))));
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
  translate([&] { current_queue(d).launch(std::make_unique<ExecKernel>(shared_from_this(), std::move(env), std::move(outs), d)); });
  return results;
}

void Executable::run_node(const Node& n, std::vector<c10::IValue>& env, c10::DeviceIndex d) const {
  const auto& schema = n.op->schema();
  const auto& formals = schema.arguments();
  c10::Stack stack;
  stack.reserve(n.args.size());
  for (size_t i = 0; i < n.args.size(); ++i) {
    const Arg& a = n.args[i];
    c10::TypePtr type = formals[i].real_type();
    if (auto o = type->cast<c10::OptionalType>()) type = o->getElementType();
    const auto kind = type->kind();
    if (kind == c10::TypeKind::GeneratorType) {
      const c10::IValue v = a.kind == Arg::Kind::kValue ? env[a.value] : a.constant;
      stack.emplace_back(kernel_generator(v.isNone() ? std::nullopt : std::optional<at::Generator>(v.toGenerator()), d));
      continue;
    }
    if (a.kind == Arg::Kind::kList) {
      auto elem = type->castRaw<c10::ListType>()->getElementType();
      auto item = [&](const Arg& x) { return x.kind == Arg::Kind::kValue ? env[x.value] : x.constant; };
      if (elem->kind() == c10::TypeKind::TensorType) {
        c10::List<at::Tensor> l;
        for (const auto& x : a.items) l.push_back(item(x).toTensor());
        stack.emplace_back(std::move(l));
      } else if (elem->cast<c10::OptionalType>()) {
        c10::List<std::optional<at::Tensor>> l;
        for (const auto& x : a.items) {
          c10::IValue v = item(x);
          l.push_back(v.isNone() ? std::nullopt : std::optional<at::Tensor>(v.toTensor()));
        }
        stack.emplace_back(std::move(l));
      } else if (elem->kind() == c10::TypeKind::FloatType) {
        c10::List<double> l;
        for (const auto& x : a.items) l.push_back(as_double(item(x)));
        stack.emplace_back(std::move(l));
      } else if (elem->kind() == c10::TypeKind::BoolType) {
        c10::List<bool> l;
        for (const auto& x : a.items) l.push_back(item(x).toBool());
        stack.emplace_back(std::move(l));
      } else {  // int[] / SymInt[]
        c10::List<int64_t> l;
        for (const auto& x : a.items) l.push_back(static_cast<int64_t>(std::llround(as_double(item(x)))));
        stack.emplace_back(std::move(l));
      }
      continue;
    }
    c10::IValue v = a.kind == Arg::Kind::kValue ? env[a.value] : a.constant;
    if (kind == c10::TypeKind::TensorType && (v.isDouble() || v.isInt() || v.isBool())) v = wrapped_number(v);
    if (v.isDevice() && v.toDevice().type() == kNeuron) v = c10::IValue(c10::Device(c10::kCPU));
    if (kind == c10::TypeKind::IntType && v.isDouble()) v = c10::IValue(static_cast<int64_t>(std::llround(v.toDouble())));
    stack.push_back(std::move(v));
  }
  // Node::neuron_kernel (decided once, when the graph is built): our kernel instead of CPU's.
  const auto& h = *n.op;
  const bool integral_histc = n.neuron_kernel == Node::NeuronKernel::kIntegralInput && stack[0].isTensor() &&
                              c10::isIntegralType(stack[0].toTensor().scalar_type(), false);
  if (n.neuron_kernel == Node::NeuronKernel::kAlways || integral_histc)
    h.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), &stack);
  else
    h.callBoxed(stack);
  const auto& returns = schema.returns();
  if (returns.size() == 1 && returns[0].type()->kind() == c10::TypeKind::ListType && stack.size() == 1 &&
      stack[0].isTensorList()) {  // split, unbind, ...: one value per element
    auto list = stack[0].toTensorVector();
    for (size_t r = 0; r < n.outputs.size() && r < list.size(); ++r) env[n.outputs[r]] = list[r];
    return;
  }
  for (size_t r = 0; r < n.outputs.size() && r < stack.size(); ++r) env[n.outputs[r]] = std::move(stack[r]);
}

void Executable::run_group(int gi, std::vector<c10::IValue>& env, const std::vector<at::Tensor>& outputs,
                           c10::DeviceIndex d) const {
  const FusionGroup& grp = groups_[gi];
  // The loop indexes every operand by the same flat index: it needs dense operands of one shape.
  const at::Tensor& first = env[grp.tensor_inputs.at(0)].toTensor();
  bool dense = true;
  for (int v : grp.tensor_inputs) {
    const at::Tensor& t = env[v].toTensor();
    dense = dense && t.is_contiguous() && t.sizes() == first.sizes() && t.scalar_type() == grp.dtype;
  }
  if (!dense) {  // e.g. a transposed view as operand: run the group's ops as library calls
    for (int ni : grp.nodes) run_node(graph_.nodes[ni], env, d);
    return;
  }
  std::vector<char*> ptrs;
  for (int v : grp.tensor_inputs) ptrs.push_back(static_cast<char*>(env[v].toTensor().data_ptr()));
  for (int o : grp.outputs) {
    // A graph output is written straight into the device buffer returned to the caller.
    const int oi = output_index_[o];
    if (oi >= 0 && outputs[oi].defined() && outputs[oi].is_contiguous() && outputs[oi].sizes() == first.sizes() &&
        outputs[oi].scalar_type() == first.scalar_type()) {
      ptrs.push_back(static_cast<char*>(outputs[oi].data_ptr()));
      env[o] = outputs[oi];
      continue;
    }
    at::Tensor t = at::empty(first.sizes(), first.options());
    ptrs.push_back(static_cast<char*>(t.data_ptr()));
    env[o] = std::move(t);
  }
  std::vector<double> scalars;
  for (int v : grp.scalar_inputs) scalars.push_back(as_double(env[v]));
  const KernelFn fn = kernels_[gi];
  const int64_t n = first.numel();
  at::parallel_for(0, n, 32768, [&](int64_t b, int64_t e) { fn(ptrs.data(), scalars.data(), b, e); });
}

void Executable::execute(std::vector<c10::IValue>& env, const std::vector<at::Tensor>& outputs, c10::DeviceIndex d) const {
  // The program's inputs and results are plain CPU views: no autograd on the queue.
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  for (const auto& s : steps_) {
    if (s.group) run_group(s.index, env, outputs, d);
    else run_node(graph_.nodes[s.index], env, d);
    for (int v : s.release) env[v] = c10::IValue();
  }
  for (size_t i = 0; i < graph_.outputs.size(); ++i) {
    if (!outputs[i].defined() || !env[graph_.outputs[i]].isTensor()) continue;
    const at::Tensor& r = env[graph_.outputs[i]].toTensor();
    if (!r.defined()) continue;
    if (r.data_ptr() == outputs[i].data_ptr() && r.strides() == outputs[i].strides()) continue;
    // An output the graph returns expanded (stride 0, e.g. a broadcast buffer) shares memory
    // between elements: write each location once, from the first index along those dims.
    at::Tensor dst = outputs[i], src = r;
    for (int64_t d = 0; d < dst.dim(); ++d)
      if (dst.stride(d) == 0 && dst.size(d) > 1) {
        dst = dst.narrow(d, 0, 1);
        src = src.narrow(d, 0, 1);
      }
    dst.copy_(src);
  }
}

namespace {

void dump(const std::string& dir, const std::string& name, const std::string& text) {
  if (dir.empty()) return;
  ::mkdir(dir.c_str(), 0700);
  std::ofstream(dir + "/" + name) << text;
}

}  // namespace

std::shared_ptr<Executable> compile(Graph g, const std::string& debug_dir, CompileStats& stats) {
  const auto t0 = std::chrono::steady_clock::now();
  KernelCache& cache = KernelCache::instance();
  const std::string before = g.dump();
  stats.ir_hash = cache.hash(before);
  const std::string tag = stats.ir_hash.substr(0, 12);
  dump(debug_dir, tag + ".ir_before.txt", before);
  stats.passes.common_removed = eliminate_common_subexpressions(g);
  stats.passes.dead_removed = eliminate_dead_code(g);
  auto groups = fuse_pointwise(g);
  stats.passes.groups = static_cast<int>(groups.size());
  for (const auto& grp : groups) stats.passes.fused_nodes += static_cast<int>(grp.nodes.size());
  for (const auto& n : g.nodes)
    if (n.kind == Node::Kind::kAten && n.fused_group < 0) {
      stats.library_calls++;
      stats.library_ops[n.target]++;
    }
  dump(debug_dir, tag + ".ir_after.txt", g.dump());
  // One translation unit per group: they build in parallel and are cached one by one.
  std::vector<std::string> sources;
  std::vector<std::vector<std::string>> names;
  for (size_t i = 0; i < groups.size(); ++i) {
    const std::string fn = "nx_fused";
    sources.push_back(kernel_prelude() + generate_kernel(g, groups[i], fn));
    names.push_back({fn});
    dump(debug_dir, tag + ".kernel" + std::to_string(i) + ".cpp", sources.back());
  }
  std::vector<std::shared_ptr<SharedObject>> libs;
  auto fns = cache.load(sources, names, libs, stats.build);
  std::vector<KernelFn> kernels;
  for (auto& f : fns) kernels.push_back(f.at(0));
  auto exe = std::make_shared<Executable>(std::move(g), std::move(groups), std::move(kernels), std::move(libs));
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return exe;
}

}  // namespace neuronx::compiler
