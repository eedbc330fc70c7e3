#include "compiler/executable.h"

#include <ATen/ExpandUtils.h>
#include <ATen/Parallel.h>
#include <ATen/core/enum_tag.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/full.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/scalar_tensor.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <numeric>
#include <set>
#include <sstream>
#include <sys/stat.h>

#include "backend/common.h"
#include "backend/generator.h"
#include "backend/tensor_views.h"
#include "compiler/codegen.h"
#include "compiler/epilogue_fusion.h"
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

// The out= overload of a functional op that returns one fresh tensor: the same
// arguments plus `out`, with a CPU (or composite) kernel.
std::optional<c10::OperatorHandle> out_overload(const c10::OperatorHandle& op) {
  const auto& s = op.schema();
  if (s.returns().size() != 1 || s.returns()[0].alias_info() || s.is_mutable() ||
      s.returns()[0].type()->kind() != c10::TypeKind::TensorType || s.name() == "aten::_unsafe_view")
    return std::nullopt;
  const std::string ov = s.overload_name();
  for (const std::string& name : {ov.empty() ? std::string("out") : ov + "_out", std::string("out")}) {
    auto h = c10::Dispatcher::singleton().findSchema({s.name(), name});
    if (!h) continue;
    const auto& a = s.arguments();
    const auto& b = h->schema().arguments();
    if (b.size() != a.size() + 1 || h->schema().returns().size() != 1) continue;
    bool same = true;
    for (size_t i = 0; i < a.size() && same; ++i) same = a[i].name() == b[i].name() && a[i].type()->str() == b[i].type()->str();
    const auto& out = b.back();
    if (!same || !out.alias_info() || !out.alias_info()->isWrite() || out.type()->kind() != c10::TypeKind::TensorType)
      continue;
    const c10::DispatchKeySet kernels({c10::DispatchKey::CPU, c10::DispatchKey::CompositeExplicitAutograd,
                                       c10::DispatchKey::CompositeImplicitAutograd});
    if (h->hasKernelForAnyDispatchKey(kernels)) return h;
  }
  return std::nullopt;
}

// Ops whose results share their first tensor operand's memory.
bool is_view(const Node& n) {
  if (n.kind != Node::Kind::kAten) return false;
  const auto& s = n.op->schema();
  if (s.name() == "aten::_unsafe_view") return true;  // no alias annotation, but a view
  for (const auto& r : s.returns())
    if (r.alias_info()) return true;
  return false;
}

std::vector<int64_t> static_ints(const std::vector<SymExpr>& es) {
  std::vector<int64_t> out;
  for (const auto& e : es) out.push_back(static_cast<int64_t>(std::llround(e.eval({}, {}))));
  return out;
}

}  // namespace

Executable::Executable(Graph g, std::vector<FusionGroup> groups, std::vector<KernelFn> kernels,
                       std::vector<std::shared_ptr<SharedObject>> libraries)
    : graph_(std::move(g)), groups_(std::move(groups)), kernels_(std::move(kernels)), libraries_(std::move(libraries)) {
  for (const auto& grp : groups_) {
    row_loops_.push_back(loops_over_rows(graph_, grp));
    loss_nodes_.push_back(loss_node(graph_, grp));
    operand_kinds_.push_back(operand_kinds(graph_, grp));
  }
  host_value_.assign(graph_.values.size(), false);
  output_index_.assign(graph_.values.size(), -1);
  for (size_t i = 0; i < graph_.outputs.size(); ++i)
    if (graph_.outputs[i] >= 0 && output_index_[graph_.outputs[i]] < 0) output_index_[graph_.outputs[i]] = static_cast<int>(i);
  out_op_.assign(graph_.nodes.size(), std::nullopt);
  out_failed_ = std::make_unique<std::atomic<bool>[]>(graph_.nodes.size());
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    const Node& n = graph_.nodes[i];
    if (n.kind == Node::Kind::kAten && n.fused_group < 0 && n.neuron_kernel == Node::NeuronKernel::kNever &&
        n.outputs.size() == 1 && graph_.values[n.outputs[0]].kind == Value::Kind::kTensor)
      out_op_[i] = out_overload(*n.op);
  }
  fold_constants();
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
    if (!folded_[i]) steps_.push_back({false, static_cast<int>(i), {}});
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
  plan();
}

// Constant folding: nodes computed from constants only (arange, full, ... and what follows
// from them alone) run once, now; their results (up to kFoldBytes) are bound at every launch.
void Executable::fold_constants() {
  constexpr int64_t kFoldBytes = 1 << 20;
  const size_t nv = graph_.values.size();
  folded_.assign(graph_.nodes.size(), false);
  std::vector<bool> known(nv, false);
  std::vector<c10::IValue> env(nv);
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  // The compiler may be called while a Python dispatch mode is active (AOTAutograd's fake
  // mode): folded constants are real tensors.
  c10::impl::ExcludeDispatchKeyGuard no_python(
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    const Node& n = graph_.nodes[i];
    if (n.kind != Node::Kind::kAten || n.fused_group >= 0 || n.neuron_kernel != Node::NeuronKernel::kNever ||
        n.op->hasTag(at::Tag::nondeterministic_seeded) || n.op->schema().is_mutable() || n.outputs.empty())
      continue;
    bool inputs_known = true, generator = false;
    for (const auto& a : n.args) for_each_value(a, [&](int v) { inputs_known = inputs_known && known[v]; });
    for (const auto& f : n.op->schema().arguments())
      generator = generator || f.type()->kind() == c10::TypeKind::GeneratorType ||
                  (f.type()->cast<c10::OptionalType>() &&
                   f.type()->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType);
    bool tensors = true;
    for (int o : n.outputs) tensors = tensors && graph_.values[o].kind == Value::Kind::kTensor;
    if (!inputs_known || generator || !tensors) continue;
    try {
      run_node(static_cast<int>(i), env, {}, nullptr, 0);
    } catch (const std::exception&) {
      continue;  // left to run at launch, where its error (if any) is the program's
    }
    int64_t bytes = 0;
    bool ok = true;
    for (int o : n.outputs) {
      ok = ok && env[o].isTensor() && env[o].toTensor().defined();
      if (ok) bytes += env[o].toTensor().numel() * static_cast<int64_t>(env[o].toTensor().element_size());
    }
    if (!ok || bytes > kFoldBytes) continue;
    folded_[i] = true;
    for (int o : n.outputs) {
      known[o] = true;
      constants_.emplace_back(o, env[o]);
    }
  }
}

// Which intermediates live in the launch's arena.
void Executable::plan() {
  const size_t nv = graph_.values.size();
  // A view keeps the memory of what it views alive: lifetimes are those of the viewed base.
  std::vector<int> root(nv);
  std::iota(root.begin(), root.end(), 0);
  for (const auto& n : graph_.nodes) {
    if (!is_view(n)) continue;
    int base = -1;
    for (const auto& a : n.args)
      for_each_value(a, [&](int v) {
        if (base < 0 && graph_.values[v].kind == Value::Kind::kTensor) base = v;
      });
    if (base >= 0)
      for (int o : n.outputs) root[o] = root[base];
  }
  std::vector<int> first(nv, -1), last(nv, -1);
  std::vector<bool> candidate(nv, false);
  for (size_t s = 0; s < steps_.size(); ++s) {
    const int step = static_cast<int>(s);  // (folded nodes have no step: nothing to plan)
    auto read = [&](int v) { last[root[v]] = std::max(last[root[v]], step); };
    if (steps_[s].group) {
      const FusionGroup& grp = groups_[steps_[s].index];
      for (int ni : grp.nodes) for (const auto& a : graph_.nodes[ni].args) for_each_value(a, read);
      for (int o : grp.outputs) {
        first[o] = step;
        const auto& m = graph_.values[o].meta;
        candidate[o] = m && m->is_static_contiguous();
      }
    } else {
      const Node& n = graph_.nodes[steps_[s].index];
      for (const auto& a : n.args) for_each_value(a, read);
      for (int o : n.outputs) first[o] = step;
      if (out_op_[steps_[s].index]) {
        const auto& m = graph_.values[n.outputs[0]].meta;
        // Row-major only: ATen's out= kernels do not all honour other strides (CPU's gelu.out
        // writes a transposed `out` wrongly when its input is laid out differently).
        candidate[n.outputs[0]] = m && m->is_static_contiguous();
      }
    }
  }
  // Memory the caller gets back is not the arena's (nor is any view of it).
  for (int o : graph_.outputs)
    if (o >= 0) candidate[root[o]] = false;
  for (const auto& in : graph_.inputs) candidate[in.value] = false;
  for (size_t v = 0; v < nv; ++v)
    if (root[v] != static_cast<int>(v)) candidate[v] = false;
  plan_ = plan_memory(graph_, candidate, first, last);
}

int Executable::out_calls() const {
  int n = 0;
  for (size_t i = 0; i < out_op_.size(); ++i) n += out_op_[i].has_value() && !folded_[i];
  return n;
}

int Executable::folded() const { return static_cast<int>(std::count(folded_.begin(), folded_.end(), true)); }

at::Tensor Executable::destination(int v, const std::vector<at::Tensor>& outputs, char* arena) const {
  if (arena && plan_.offset[v] >= 0) {
    const TensorMeta& m = *graph_.values[v].meta;
    return at::from_blob(arena + plan_.offset[v], static_ints(m.sizes), static_ints(m.strides),
                         at::TensorOptions().dtype(m.dtype));
  }
  const int oi = output_index_[v];
  if (oi < 0 || oi >= static_cast<int>(outputs.size()) || !outputs[oi].defined()) return {};
  const at::Tensor& t = outputs[oi];
  // Row-major only (as arena slots): other layouts are written by copying at the end.
  return t.is_contiguous() ? t : at::Tensor();
}

namespace {

class ExecKernel final : public rt::Kernel {
 public:
  ExecKernel(std::shared_ptr<const Executable> exe, std::vector<c10::IValue> env, std::vector<at::Tensor> outputs,
             at::Tensor arena, char* arena_cpu, c10::DeviceIndex d)
      : exe_(std::move(exe)),
        env_(std::move(env)),
        outputs_(std::move(outputs)),
        arena_(std::move(arena)),
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
    arena_ = at::Tensor();
  }
  const char* name() const override { return "neuron::executable"; }

 private:
  std::shared_ptr<const Executable> exe_;
  std::vector<c10::IValue> env_;
  std::vector<at::Tensor> outputs_;
  at::Tensor arena_;  // the launch's planned intermediates (device memory), kept until the task ran
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
  for (const auto& [v, c] : constants_) env[v] = c;
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
  at::Tensor arena;
  char* arena_cpu = nullptr;
  if (plan_.arena_bytes > 0) {
    arena = at::empty({plan_.arena_bytes}, at::TensorOptions().dtype(at::kByte).device(kNeuron, d));
    arena_cpu = static_cast<char*>(aliases.cpu(arena).data_ptr());
  }
  translate([&] {
    current_queue(d).launch(
        std::make_unique<ExecKernel>(shared_from_this(), std::move(env), std::move(outs), std::move(arena), arena_cpu, d));
  });
  return results;
}

void Executable::run_node(int ni, std::vector<c10::IValue>& env, const std::vector<at::Tensor>& outputs, char* arena,
                          c10::DeviceIndex d) const {
  const Node& n = graph_.nodes[ni];
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
  // Written where we choose (the arena, the caller's output) through the op's out= overload.
  if (out_op_[ni] && !out_failed_[ni].load(std::memory_order_relaxed)) {
    at::Tensor dst = destination(n.outputs[0], outputs, arena);
    if (dst.defined()) {
      stack.emplace_back(dst);
      try {
        out_op_[ni]->callBoxed(stack);
        env[n.outputs[0]] = std::move(dst);
        return;
      } catch (const c10::Error&) {
        // Some out= kernels use `out` as scratch of another shape (mse_loss's resizes it): the
        // memory we chose cannot grow, so this op allocates its own from now on.
        out_failed_[ni].store(true, std::memory_order_relaxed);
        return run_node(ni, env, outputs, arena, d);
      }
    }
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

void Executable::run_rows(int gi, std::vector<c10::IValue>& env, const std::vector<at::Tensor>& outputs, char* arena,
                          c10::DeviceIndex d) const {
  const FusionGroup& grp = groups_[gi];
  const std::vector<Operand>& kinds = operand_kinds_[gi];
  auto library_calls = [&] {  // e.g. a transposed view as operand: the group's ops one by one
    for (int ni : grp.nodes) run_node(ni, env, {}, nullptr, d);
  };
  // The group's shape: its inputs broadcast together.
  c10::DimVector shape;
  bool first = true, dense = true;
  for (size_t k = 0; k < grp.tensor_inputs.size() && dense; ++k) {
    if (kinds[k] == Operand::kColumn || kinds[k] == Operand::kRowIndex) continue;
    const at::IntArrayRef sizes = env[grp.tensor_inputs[k]].toTensor().sizes();
    try {
      shape = first ? c10::DimVector(sizes) : at::infer_size_dimvector(shape, sizes);
    } catch (const c10::Error&) {
      dense = false;  // sizes that do not broadcast: the ops raise their own error
    }
    first = false;
  }
  const int64_t n = shape.empty() ? 1 : shape.back();
  const int64_t numel = c10::multiply_integers(shape);
  // The loop reads rows of n elements: full-shape inputs dense in the group's shape, broadcast
  // ones dense in their own (their last dim read contiguously, or one value per row), a layer
  // norm's weight and bias dense [n].
  const int64_t R = shape.empty() ? 0 : static_cast<int64_t>(shape.size()) - 1;
  std::vector<double> strides;
  for (size_t k = 0; k < grp.tensor_inputs.size() && dense; ++k) {
    const at::Tensor& t = env[grp.tensor_inputs[k]].toTensor();
    if (kinds[k] == Operand::kRowIndex) {  // a loss's targets
      dense = t.is_contiguous() && t.scalar_type() == at::kLong && t.dim() == 1 && t.numel() * n == numel;
      continue;
    }
    dense = t.is_contiguous() && t.scalar_type() == grp.dtype;
    if (!dense || kinds[k] == Operand::kColumn) {
      dense = dense && t.numel() == n;
      continue;
    }
    if (!at::is_expandable_to(t.sizes(), shape)) {
      dense = false;
      break;
    }
    const at::Tensor e = t.expand(shape);
    const int64_t last = e.dim() ? e.stride(-1) : 0;
    dense = kinds[k] == Operand::kElement        ? t.sizes() == at::IntArrayRef(shape)
            : kinds[k] == Operand::kRowBroadcast ? (last == 0 || n <= 1)
                                                 : (last == 1 || n <= 1);
    for (int64_t i = 0; i < R; ++i) strides.push_back(static_cast<double>(e.stride(i)));
  }
  if (!dense || numel == 0) return library_calls();
  const Node* red = grp.reduction >= 0 ? &graph_.nodes[grp.reduction] : nullptr;
  c10::DimVector row_shape = shape;
  if (!row_shape.empty()) row_shape.back() = 1;  // layer norm's mean and rstd
  const int loss = loss_nodes_[gi];
  const int64_t rows = numel / n;
  std::vector<char*> ptrs;
  for (int v : grp.tensor_inputs) ptrs.push_back(static_cast<char*>(env[v].toTensor().data_ptr()));
  for (int o : grp.outputs) {
    const bool per_row = red && red->outputs.size() == 3 && (o == red->outputs[1] || o == red->outputs[2]);
    const bool loss_value = loss >= 0 && (o == graph_.nodes[loss].outputs[0] || o == graph_.nodes[loss].outputs[1]);
    const bool per_row_loss = loss_value && o == graph_.nodes[loss].outputs[0] && graph_.nodes[loss].args[3].constant.toInt() == 0;
    const c10::DimVector rows_only{rows};
    const at::IntArrayRef sizes = per_row_loss ? at::IntArrayRef(rows_only)
                                  : loss_value ? at::IntArrayRef()
                                  : per_row    ? at::IntArrayRef(row_shape)
                                               : at::IntArrayRef(shape);
    at::Tensor t = destination(o, outputs, arena);
    if (!t.defined() || !t.is_contiguous() || t.sizes() != sizes) t = at::empty(sizes, at::TensorOptions().dtype(grp.dtype));
    ptrs.push_back(static_cast<char*>(t.data_ptr()));
    env[o] = std::move(t);
  }
  std::vector<double> scalars;
  for (int v : grp.scalar_inputs) scalars.push_back(as_double(env[v]));
  scalars.push_back(static_cast<double>(n));
  scalars.push_back(static_cast<double>(R));
  for (int64_t i = 0; i < R; ++i) scalars.push_back(static_cast<double>(shape[i]));
  scalars.insert(scalars.end(), strides.begin(), strides.end());
  // A fused loss: each row's loss and weight, and a slot for a target out of range.
  at::Tensor losses, weights, bad;
  if (loss >= 0) {
    losses = at::empty({rows}, at::kFloat);
    weights = at::empty({rows}, at::kFloat);
    bad = at::full({1}, std::numeric_limits<int64_t>::min(), at::kLong);
    for (const at::Tensor* t : {&losses, &weights, &bad}) ptrs.push_back(static_cast<char*>(t->data_ptr()));
  }
  const KernelFn fn = kernels_[gi];
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / n),
                   [&](int64_t b, int64_t e) { fn(ptrs.data(), scalars.data(), b, e); });
  if (loss < 0) return;
  const int64_t target = bad.item<int64_t>();
  TORCH_CHECK_INDEX(target == std::numeric_limits<int64_t>::min(), "Target ", target, " is out of bounds.");
  // As nll_loss_forward: per-row losses (reduction none, total weight 0), or their sum and the
  // number of rows counted (sum), or the sum divided by that number (mean).
  const Node& l = graph_.nodes[loss];
  const int64_t reduction = l.args[3].constant.toInt();
  const double total = reduction == 0 ? 0.0 : losses.sum(at::kDouble).item<double>();
  const double count = reduction == 0 ? 0.0 : weights.sum(at::kDouble).item<double>();
  for (int o : grp.outputs) {
    if (o == l.outputs[0]) {
      at::Tensor& t = env[o].toTensor();
      if (reduction == 0) t.copy_(losses);
      else t.fill_(reduction == 1 ? total / count : total);
    } else if (o == l.outputs[1]) {
      env[o].toTensor().fill_(count);
    }
  }
}

void Executable::run_group(int gi, std::vector<c10::IValue>& env, const std::vector<at::Tensor>& outputs, char* arena,
                           c10::DeviceIndex d) const {
  const FusionGroup& grp = groups_[gi];
  if (row_loops_[gi]) return run_rows(gi, env, outputs, arena, d);
  // The loop indexes every operand by the same flat index: it needs dense operands of one shape.
  const at::Tensor& first = env[grp.tensor_inputs.at(0)].toTensor();
  bool dense = true;
  for (int v : grp.tensor_inputs) {
    const at::Tensor& t = env[v].toTensor();
    dense = dense && t.is_contiguous() && t.sizes() == first.sizes() && t.scalar_type() == grp.dtype;
  }
  if (!dense) {  // e.g. a transposed view as operand: run the group's ops as library calls
    for (int ni : grp.nodes) run_node(ni, env, {}, nullptr, d);
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
    at::Tensor t = destination(o, {}, arena);  // its arena slot, if planned
    if (!t.defined()) t = at::empty(first.sizes(), first.options());
    ptrs.push_back(static_cast<char*>(t.data_ptr()));
    env[o] = std::move(t);
  }
  std::vector<double> scalars;
  for (int v : grp.scalar_inputs) scalars.push_back(as_double(env[v]));
  const KernelFn fn = kernels_[gi];
  const int64_t n = first.numel();
  at::parallel_for(0, n, 32768, [&](int64_t b, int64_t e) { fn(ptrs.data(), scalars.data(), b, e); });
}

void Executable::execute(std::vector<c10::IValue>& env, const std::vector<at::Tensor>& outputs, char* arena,
                         c10::DeviceIndex d, bool report_steps) const {
  // The program's inputs and results are plain CPU views: no autograd on the queue.
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  for (const auto& s : steps_) {
    const int64_t start = report_steps ? rt::now_ns() : 0;
    if (s.group) run_group(s.index, env, outputs, arena, d);
    else run_node(s.index, env, outputs, arena, d);
    if (report_steps)
      rt::report_step(s.group ? "neuron::fused_loop" : graph_.nodes[s.index].target.c_str(), start, rt::now_ns());
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
  // Epilogues first, on exact reader counts (after dead code is gone); the weight views it
  // adds compose with the graph's own in simplify_views.
  stats.passes.dead_removed = eliminate_dead_code(g);
  const EpilogueStats epi = fuse_epilogues(g);
  stats.passes.gemms = epi.gemms;
  stats.passes.convolutions = epi.convolutions;
  stats.passes.epilogues = epi.epilogues;
  stats.passes.views_simplified = simplify_views(g);
  stats.passes.common_removed = eliminate_common_subexpressions(g);
  stats.passes.dead_removed += eliminate_dead_code(g);
  auto groups = fuse_pointwise(g);
  stats.passes.groups = static_cast<int>(groups.size());
  for (const auto& grp : groups) {
    stats.passes.fused_nodes += static_cast<int>(grp.nodes.size());
    stats.passes.row_groups += grp.reduction >= 0;
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
  stats.out_calls = exe->out_calls();
  stats.passes.constants_folded = exe->folded();
  for (size_t i = 0; i < exe->graph().nodes.size(); ++i) {
    const Node& n = exe->graph().nodes[i];
    if (n.kind == Node::Kind::kAten && n.fused_group < 0 && !exe->is_folded(static_cast<int>(i))) {
      stats.library_calls++;
      stats.library_ops[n.target]++;
    }
  }
  stats.arena_bytes = exe->memory_plan().arena_bytes;
  stats.planned_bytes = exe->memory_plan().planned_bytes;
  stats.planned_values = exe->memory_plan().planned_values;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return exe;
}

}  // namespace neuronx::compiler
