#include "compiler/executable.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/enum_tag.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "backend/fallback_policy.h"
#include "compiler/epilogue_fusion.h"

namespace neuronx::compiler {

namespace {

// How a functional op's results are written into memory we choose: its out= overload (the same
// arguments plus one `out` per result), or the op table's `out_as` (an op with its own out= kernel
// that computes this one: relu is CPU's clamp_min(self, 0)). ATen generates an out= overload
// for many functional ops that computes into new memory and copies (a composite kernel); for one
// result that still spares the copy at the end when the result is returned, but with several
// results only CPU kernels are taken. Only CPU kernels write a channels-last `out` (see
// destination()).
std::optional<Executable::OutCall> out_overload(const Node& n) {
  const auto& s = n.op->schema();
  const size_t k = s.returns().size();
  if (k == 0 || s.is_mutable() || op_info(n.id).reshape_view) return std::nullopt;
  for (const auto& r : s.returns())
    if (r.alias_info() || r.type()->kind() != c10::TypeKind::TensorType) return std::nullopt;
  const c10::DispatchKeySet cpu(c10::DispatchKey::CPU);
  const c10::DispatchKeySet composite({c10::DispatchKey::CompositeExplicitAutograd,
                                       c10::DispatchKey::CompositeImplicitAutograd});
  const OpInfo& info = op_info(n.id);
  if (info.out_as[0] && k == 1) {
    const std::string_view full(info.out_as);
    const auto dot = full.find('.');
    auto h = c10::Dispatcher::singleton().findSchema(
        {std::string(full.substr(0, dot)), dot == std::string_view::npos ? "" : std::string(full.substr(dot + 1))});
    if (h && h->hasKernelForAnyDispatchKey(cpu)) return Executable::OutCall{*h, c10::IValue(info.out_as_arg), true};
  }
  const std::string ov = s.overload_name();
  for (const std::string& name :
       {ov.empty() ? std::string("out") : ov + "_out", std::string("out"), std::string("grad_input")}) {
    auto h = c10::Dispatcher::singleton().findSchema({s.name(), name});
    if (!h) continue;
    const auto& a = s.arguments();
    const auto& b = h->schema().arguments();
    if (b.size() != a.size() + k || h->schema().returns().size() != k) continue;
    bool same = true;
    for (size_t i = 0; i < a.size() && same; ++i) same = a[i].name() == b[i].name() && a[i].type()->str() == b[i].type()->str();
    for (size_t i = a.size(); i < b.size() && same; ++i)
      same = b[i].alias_info() && b[i].alias_info()->isWrite() && b[i].type()->kind() == c10::TypeKind::TensorType;
    if (!same) continue;
    const bool own = h->hasKernelForAnyDispatchKey(cpu);
    if (own || (k == 1 && h->hasKernelForAnyDispatchKey(composite))) return Executable::OutCall{*h, std::nullopt, own};
  }
  return std::nullopt;
}

// Ops whose results share their first tensor operand's memory.
bool is_view(const Node& n) {
  if (n.kind != Node::Kind::kAten) return false;
  if (op_info(n.id).reshape_view) return true;  // _unsafe_view: no alias annotation, but a view
  for (const auto& r : n.op->schema().returns())
    if (r.alias_info()) return true;
  return false;
}

std::vector<int64_t> static_ints(const std::vector<SymExpr>& es) {
  std::vector<int64_t> out;
  for (const auto& e : es) out.push_back(e.value());
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
  arg_convs_.resize(graph_.nodes.size());
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    const Node& n = graph_.nodes[i];
    if (n.kind != Node::Kind::kAten) continue;
    const auto& formals = n.op->schema().arguments();
    for (size_t k = 0; k < n.args.size(); ++k) arg_convs_[i].push_back(arg_conv(formals[k], n.args[k]));
  }
  gen_slot_.assign(graph_.nodes.size(), -1);
  int slots = static_cast<int>(graph_.values.size());
  for (size_t i = 0; i < graph_.nodes.size(); ++i)
    for (ArgConv c : arg_convs_[i])
      if (c == ArgConv::kGenerator) {
        if (gen_slot_[i] < 0) gen_slot_[i] = slots;
        ++slots;
      }
  env_size_ = slots;
  out_op_.assign(graph_.nodes.size(), std::nullopt);
  out_failed_ = std::make_unique<std::atomic<bool>[]>(graph_.nodes.size());
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    const Node& n = graph_.nodes[i];
    if (n.kind == Node::Kind::kAten && n.fused_group < 0 && n.neuron_kernel == Node::NeuronKernel::kNever &&
        !n.outputs.empty() &&
        std::all_of(n.outputs.begin(), n.outputs.end(),
                    [&](int o) { return graph_.values[o].kind == Value::Kind::kTensor; }))
      out_op_[i] = out_overload(n);
  }
  device_kernel_.assign(graph_.nodes.size(), nullptr);
  device_kernel_counters_.assign(graph_.nodes.size(), nullptr);
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    const Node& n = graph_.nodes[i];
    if (n.kind != Node::Kind::kAten || n.fused_group >= 0 || n.outputs.empty()) continue;
    const auto& s = n.op->schema();
    if (std::all_of(s.returns().begin(), s.returns().end(), [](const auto& r) { return r.alias_info() == nullptr; }))
      if ((device_kernel_[i] = device_kernel(s.name(), s.overload_name())))
        device_kernel_counters_[i] = &op_counters(s.name() + (s.overload_name().empty() ? "" : "." + s.overload_name()));
  }
  promised_strides_.resize(graph_.values.size());
  for (const Node& n : graph_.nodes) {  // (a fused node runs as a library call when its group cannot)
    if (n.kind != Node::Kind::kAten) continue;
    bool fresh = true;  // no result aliases an operand
    for (const auto& r : n.op->schema().returns()) fresh = fresh && r.alias_info() == nullptr;
    if (!fresh || op_info(n.id).reshape_view) continue;
    for (int o : n.outputs) {
      const Value& v = graph_.values[o];
      if (v.kind != Value::Kind::kTensor || !v.meta || !v.meta->is_static()) continue;
      for (const auto& st : v.meta->strides) promised_strides_[o].push_back(st.value());
      if (promised_strides_[o].empty()) promised_strides_[o].push_back(0);  // 0-d: nothing to conform, but marked
    }
  }
  // A returned result lent to its op's allocation (run_node): the largest dense one of a node
  // with fresh results, the first of equal sizes (kernels allocate their results in order; below
  // 64 KiB the copy at the end costs next to nothing).
  place_value_.assign(graph_.nodes.size(), -1);
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    const Node& n = graph_.nodes[i];
    if (n.kind != Node::Kind::kAten || n.fused_group >= 0 || is_view(n)) continue;
    int64_t best = (int64_t{64} << 10) - 1;
    for (int o : n.outputs) {
      const Value& v = graph_.values[o];
      if (output_index_[o] < 0 || promised_strides_[o].empty() || !v.meta) continue;
      if (!v.meta->is_static_contiguous() && !v.meta->is_static_channels_last()) continue;
      const int64_t bytes = span_bytes(*v.meta);
      if (bytes > best) {
        best = bytes;
        place_value_[i] = o;
      }
    }
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
      if (device_kernel_[steps_[s].index])  // (its results are written where we choose too)
        for (int o : n.outputs) {
          const auto& m = graph_.values[o].meta;
          candidate[o] = m && m->is_static_contiguous();
        }
      if (out_op_[steps_[s].index])
        for (int o : n.outputs) {
          const auto& m = graph_.values[o].meta;
          // Row-major only: ATen's out= kernels do not all honour other strides (CPU's gelu.out
          // writes a transposed `out` wrongly when its input is laid out differently).
          candidate[o] = m && m->is_static_contiguous();
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

Executable::ArgConv Executable::arg_conv(const c10::Argument& formal, const Arg& a) {
  c10::TypePtr type = formal.real_type();
  if (auto o = type->cast<c10::OptionalType>()) type = o->getElementType();
  const auto kind = type->kind();
  if (kind == c10::TypeKind::GeneratorType) return ArgConv::kGenerator;
  if (a.kind == Arg::Kind::kList) {
    auto elem = type->castRaw<c10::ListType>()->getElementType();
    if (elem->kind() == c10::TypeKind::TensorType) return ArgConv::kTensorList;
    if (elem->cast<c10::OptionalType>()) return ArgConv::kOptionalTensorList;
    if (elem->kind() == c10::TypeKind::FloatType) return ArgConv::kFloatList;
    if (elem->kind() == c10::TypeKind::BoolType) return ArgConv::kBoolList;
    return ArgConv::kIntList;  // int[] / SymInt[]
  }
  if (kind == c10::TypeKind::TensorType) return ArgConv::kTensor;  // a number there is wrapped
  if (kind == c10::TypeKind::IntType) return ArgConv::kInt;        // a symbolic float rounds
  if (kind == c10::TypeKind::DeviceObjType) return ArgConv::kDevice;  // neuron runs on CPU views
  return ArgConv::kAsIs;
}

int Executable::out_calls() const {
  int n = 0;
  for (size_t i = 0; i < out_op_.size(); ++i) n += out_op_[i].has_value() && !folded_[i] && !lends(static_cast<int>(i));
  return n;
}

int Executable::output_copies() const {
  std::set<int> returned(graph_.outputs.begin(), graph_.outputs.end());
  // Written in place when its writer takes the result's layout (see destination()).
  auto copied = [&](int o, bool row_major_ok, bool channels_last_ok) -> int {
    const Value& v = graph_.values[o];
    if (!returned.count(o) || v.kind != Value::Kind::kTensor || !v.meta || !v.meta->is_static()) return 0;
    return !(row_major_ok && v.meta->is_static_contiguous()) && !(channels_last_ok && v.meta->is_static_channels_last());
  };
  int n = 0;
  for (const auto& st : steps_) {
    if (st.group) {
      for (int o : groups_[st.index].outputs) n += copied(o, true, false);
      continue;
    }
    const Node& node = graph_.nodes[st.index];
    if (node.kind != Node::Kind::kAten || is_view(node)) continue;
    const bool dk = device_kernel_[st.index] != nullptr;
    const auto& oc = out_op_[st.index];
    for (int o : node.outputs)
      if (o != place_value_[st.index]) n += copied(o, dk || oc, dk || (oc && oc->any_layout));
  }
  return n;
}

int Executable::folded() const { return static_cast<int>(std::count(folded_.begin(), folded_.end(), true)); }

std::vector<at::Tensor> Executable::result_buffers(int ni, const std::vector<at::Tensor>& outputs, char* arena,
                                                   bool channels_last_ok, bool* chosen) const {
  std::vector<at::Tensor> ts;
  for (int o : graph_.nodes[ni].outputs) {
    at::Tensor t = destination(o, outputs, arena, channels_last_ok);
    if (chosen && t.defined()) *chosen = true;
    if (!t.defined()) {
      const Value& v = graph_.values[o];
      if (v.kind != Value::Kind::kTensor || !v.meta || !v.meta->is_static()) return {};
      t = at::empty_strided(static_ints(v.meta->sizes), static_ints(v.meta->strides),
                            at::TensorOptions().dtype(v.meta->dtype));
    }
    ts.push_back(std::move(t));
  }
  return ts;
}

at::Tensor Executable::destination(int v, const std::vector<at::Tensor>& outputs, char* arena,
                                   bool channels_last_ok) const {
  if (arena && plan_.offset[v] >= 0) {
    const TensorMeta& m = *graph_.values[v].meta;
    return at::from_blob(arena + plan_.offset[v], static_ints(m.sizes), static_ints(m.strides),
                         at::TensorOptions().dtype(m.dtype));
  }
  const int oi = output_index_[v];
  if (oi < 0 || oi >= static_cast<int>(outputs.size()) || !outputs[oi].defined()) return {};
  const at::Tensor& t = outputs[oi];
  // Row-major (as arena slots), or channels-last for the writers that honour it: other layouts
  // are written by copying at the end.
  if (t.is_contiguous()) return t;
  const auto& m = graph_.values[v].meta;
  return channels_last_ok && m && m->is_static_channels_last() && t.is_contiguous(at::MemoryFormat::ChannelsLast)
             ? t
             : at::Tensor();
}

}  // namespace neuronx::compiler
