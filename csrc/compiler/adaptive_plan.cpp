#include "compiler/adaptive_plan.h"

#include <algorithm>
#include <optional>
#include <unordered_map>

#include <c10/util/accumulate.h>

#include "backend/op_kernel.h"

namespace neuronx::compiler::adaptive {

namespace {

// What the tier knows about an op: the functional op it computes, whether in place.
struct OpFacts {
  OpId id = OpId::kOther;  // kOther: does not fuse
  bool inplace = false;
};

const OpFacts& facts(const OpAnalysis& a) {
  thread_local std::unordered_map<const OpAnalysis*, OpFacts> cache;  // (engine threads only)
  auto it = cache.find(&a);
  if (it != cache.end()) return it->second;
  OpFacts f;
  OpId id = op_id(a.name);
  bool inplace = false;
  if (id == OpId::kOther) {
    id = inplace_op_id(a.name);
    // An in-place op returns its self.
    inplace = id != OpId::kOther && a.num_returns == 1 && !a.ret_arg.empty() && a.ret_arg[0] == 0;
    if (!inplace) id = OpId::kOther;
  }
  const OpInfo& info = op_info(id);
  if (id != OpId::kOther && info.eager_exact && info.pointwise() && a.num_returns == 1 && a.generator_args.empty()) {
    f.id = id;
    f.inplace = inplace;
  }
  return cache.emplace(&a, f).first->second;
}

const OpKernel* op_kernel(const rt::Kernel& k) { return dynamic_cast<const OpKernel*>(&k); }

bool runs_as_planned(const OpKernel& k, const OpFacts& f) {
  if (f.id == OpId::kOther) return false;
  return f.inplace ? k.mode() == OpKernel::Mode::kDirect : k.mode() != OpKernel::Mode::kDirect;
}

// The dtypes the tier fuses: float32, and bfloat16 (each op's result rounded, as eager's are).
bool fused_dtype(c10::ScalarType t) { return t == c10::ScalarType::Float || t == c10::ScalarType::BFloat16; }

bool dense(const Geometry& g, int64_t numel) {
  if (!fused_dtype(g.dtype) || g.conj || g.neg || !g.defined) return false;
  int64_t expected = 1, n = 1;
  for (size_t d = g.sizes.size(); d-- > 0;) {
    if (g.sizes[d] != 1 && g.strides[d] != expected) return false;
    expected *= g.sizes[d];
    n *= g.sizes[d];
  }
  return numel < 0 ? n > 0 : n == numel;
}

// A wrapped Python number (what `x * 2.0` passes): its value.
bool wrapped_number(const c10::IValue& v, double& out) {
  if (!v.isTensor()) return false;
  const at::Tensor& t = v.toTensor();
  if (!t.defined() || !t.unsafeGetTensorImpl()->is_wrapped_number() || !t.is_cpu()) return false;
  switch (t.scalar_type()) {
    case c10::ScalarType::Double: out = *static_cast<const double*>(t.const_data_ptr()); return true;
    case c10::ScalarType::Float: out = *static_cast<const float*>(t.const_data_ptr()); return true;
    case c10::ScalarType::Long: out = static_cast<double>(*static_cast<const int64_t*>(t.const_data_ptr())); return true;
    case c10::ScalarType::Bool: out = *static_cast<const bool*>(t.const_data_ptr()) ? 1 : 0; return true;
    default: return false;
  }
}

class Builder {
 public:
  explicit Builder(Plan& p) : p_(p) {}

  // Adds k to the plan, or leaves the plan as it was and returns why not.
  std::optional<End> add(const rt::Kernel& kernel) {
    const OpKernel* k = op_kernel(kernel);
    if (!k) return End::k_not_an_op;
    const OpFacts& f = facts(k->op());
    if (!runs_as_planned(*k, f)) return End::k_not_lowered;
    const OpInfo& info = op_info(f.id);
    const size_t slots0 = p_.slots.size(), values0 = p_.value_slot.size(), scalars0 = p_.scalars.size();
    const size_t key0 = p_.key.size();
    auto fail = [&](End e) {
      p_.slots.resize(slots0);
      p_.value_slot.resize(values0);
      p_.value_dead.resize(values0);
      p_.scalars.resize(scalars0);
      p_.key.resize(key0);
      return e;
    };
    // The neuron operands by argument position; the output.
    const OpKernel::Deferred* by_arg[8] = {};
    const OpKernel::Deferred* out = nullptr;
    for (const auto& d : k->deferred()) {
      if (d.pos >= 0) return End::k_layout;
      if (d.arg >= 0 && d.arg < 8) by_arg[d.arg] = &d;
      else if (d.arg == -1) out = &d;
    }
    if (f.inplace) out = by_arg[0];
    if (!out) return End::k_not_lowered;
    const bool first = p_.nodes.empty();
    const c10::ScalarType dtype = out->snapshot.geometry.dtype;
    if (!fused_dtype(dtype) || (!first && dtype != p_.dtype)) return End::k_dtype;
    if (dtype == c10::ScalarType::BFloat16 && !info.eager_exact_bf16) return End::k_not_lowered;
    if (!dense(out->snapshot.geometry, first ? -1 : p_.numel)) return End::k_layout;
    if (first) {
      p_.sizes.assign(out->snapshot.geometry.sizes.begin(), out->snapshot.geometry.sizes.end());
      p_.numel = c10::multiply_integers(p_.sizes);
      p_.dtype = dtype;
      p_.item = static_cast<int64_t>(c10::elementSize(dtype));
      p_.key += dtype == c10::ScalarType::BFloat16 ? "b:" : "f:";
    }
    Plan::Member m;
    m.id = f.id;
    m.op = k->op().op;
    p_.key += static_cast<char>('A' + static_cast<int>(f.id) % 58);
    p_.key += std::to_string(static_cast<int>(f.id));
    const c10::Stack& args = k->args();
    // gelu's one operand is followed by its form (a string): a constant of the structure.
    const int operands = info.operands > 0 ? info.operands : 1;
    for (int i = 0; i < operands; ++i) {
      Plan::Operand o;
      double number = 0;
      if (const OpKernel::Deferred* d = i < 8 ? by_arg[i] : nullptr) {
        const Geometry& g = d->snapshot.geometry;
        if (g.dtype != p_.dtype) return fail(End::k_dtype);
        if (!dense(g, p_.numel) || g.sizes.size() != p_.sizes.size() ||
            !std::equal(g.sizes.begin(), g.sizes.end(), out->snapshot.geometry.sizes.begin()))
          return fail(End::k_layout);
        const int slot = find_slot(address(d->snapshot));
        if (slot == -2) return fail(End::k_overlap);
        o.kind = Plan::Operand::Kind::kValue;
        o.index = slot >= 0 ? p_.slots[slot].current : new_input(address(d->snapshot));
        p_.key += 'v' + std::to_string(o.index);
      } else if (static_cast<size_t>(i) >= args.size()) {
        return fail(End::k_argument);
      } else if (i == info.exact_if_one) {
        const c10::IValue& a = args[i];
        if (!(a.isInt() && a.toInt() == 1) && !(a.isDouble() && a.toDouble() == 1.0)) return fail(End::k_argument);
        o.constant = c10::IValue(static_cast<int64_t>(1));
        p_.key += "c1";
      } else if (args[i].isDouble() || args[i].isInt() || args[i].isBool() || wrapped_number(args[i], number)) {
        if (!args[i].isTensor()) number = args[i].isDouble() ? args[i].toDouble() : args[i].isInt() ? static_cast<double>(args[i].toInt()) : args[i].toBool();
        o.kind = Plan::Operand::Kind::kScalar;
        o.index = static_cast<int>(p_.scalars.size());
        p_.scalars.push_back(number);
        p_.key += 's';
      } else {
        return fail(End::k_argument);
      }
      m.operands.push_back(std::move(o));
    }
    for (size_t i = operands; i < args.size(); ++i) {
      if (!args[i].isString()) return fail(End::k_argument);
      Plan::Operand o;
      o.constant = args[i];
      p_.key += "c'" + args[i].toStringRef() + "'";
      m.operands.push_back(std::move(o));
    }
    // The output: a new value in its buffer (a buffer the group already knows is overwritten).
    char* const ptr = address(out->snapshot);
    int slot = find_slot(ptr);
    if (slot == -2) return fail(End::k_overlap);
    if (slot < 0) {
      slot = static_cast<int>(p_.slots.size());
      p_.slots.push_back({ptr, -1, -1});
    }
    m.output = static_cast<int>(p_.value_slot.size());
    p_.value_slot.push_back(slot);
    p_.value_dead.push_back(out->released && out->released->expired());
    p_.slots[slot].current = m.output;
    p_.key += 'o' + std::to_string(slot) + ';';
    p_.nodes.push_back(std::move(m));
    return std::nullopt;
  }

 private:
  char* address(const TensorSnapshot& s) const {
    return static_cast<char*>(s.base) + s.geometry.offset * p_.item;
  }
  // The slot at exactly ptr; -1: none; -2: ptr overlaps a slot without being it.
  int find_slot(const char* ptr) const {
    const int64_t bytes = p_.numel * p_.item;
    for (size_t i = 0; i < p_.slots.size(); ++i) {
      const char* s = p_.slots[i].ptr;
      if (s == ptr) return static_cast<int>(i);
      if (ptr < s + bytes && s < ptr + bytes) return -2;
    }
    return -1;
  }
  int new_input(char* ptr) {
    const int v = static_cast<int>(p_.value_slot.size());
    p_.value_slot.push_back(static_cast<int>(p_.slots.size()));
    p_.value_dead.push_back(0);
    p_.slots.push_back({ptr, v, v});
    return v;
  }
  Plan& p_;
};

}  // namespace

const char* end_name(End e) {
  static const char* names[] = {
#define NEURONX_NAME(name, why) #name,
      NEURONX_ADAPTIVE_ENDS(NEURONX_NAME)
#undef NEURONX_NAME
  };
  return names[static_cast<int>(e)];
}

void Plan::clear() {
  members = 0;
  end = End::k_queue_end;
  nodes.clear();
  slots.clear();
  value_slot.clear();
  value_dead.clear();
  scalars.clear();
  sizes.clear();
  numel = 0;
  dtype = c10::ScalarType::Float;
  item = 4;
  key.clear();
}

std::vector<int> Plan::inputs() const {
  std::vector<int> r;
  for (const Slot& s : slots)
    if (s.input >= 0) r.push_back(s.input);
  return r;
}

std::vector<int> Plan::outputs() const {
  std::vector<int> r;
  for (const Slot& s : slots)
    if (s.current != s.input && !value_dead[s.current]) r.push_back(s.current);
  return r;
}

int Plan::dead_outputs() const {
  int n = 0;
  for (const Slot& s : slots) n += s.current != s.input && value_dead[s.current];
  return n;
}

bool is_candidate(const rt::Kernel& k) {
  const OpKernel* ok = op_kernel(k);
  return ok && runs_as_planned(*ok, facts(ok->op()));
}

namespace {

// Whether any of the kernels may read [ptr, ptr + bytes).
bool may_read(const rt::Kernel* const* ks, size_t n, const char* ptr, int64_t bytes) {
  for (size_t i = 0; i < n; ++i)
    if (ks[i]->may_touch(ptr, static_cast<size_t>(bytes))) return true;
  return false;
}

// An output whose storage expired is dead only if no kernel queued after the group reads it: the
// queue's kernels do not own their operands (stream-ordered reuse), so a kernel queued before
// the host dropped the tensor may still read it. Without the whole queue in view, or with work
// queued since it was gathered, an output stays live.
void confirm_dead(Plan& p, const rt::GroupWindow& w, size_t grouped) {
  const bool whole_view = w.complete && w.queue;
  for (Plan::Slot& s : p.slots) {
    if (s.current == s.input || !p.value_dead[s.current]) continue;
    if (!whole_view || may_read(w.next + grouped, w.n - grouped, s.ptr, p.numel * p.item))
      p.value_dead[s.current] = 0;
  }
  // (after the expiry checks: a kernel queued before an expiry is counted in submitted_seq)
  if (whole_view && w.queue->submitted_seq() != w.submitted) std::fill(p.value_dead.begin(), p.value_dead.end(), 0);
}

}  // namespace

void make_plan(const rt::Kernel& head, const rt::GroupWindow& w, Plan& p) {
  p.clear();
  Builder b(p);
  if (auto why = b.add(head)) {
    p.end = *why;
    p.members = 1;
    return;
  }
  const size_t n = w.n;
  size_t i = 0;
  for (; i < n; ++i) {
    if (auto why = b.add(*w.next[i])) {
      p.end = *why;
      break;
    }
  }
  p.members = 1 + i;
  confirm_dead(p, w, i);
  // Which outputs are written is part of the structure.
  for (size_t s = 0; s < p.slots.size(); ++s)
    if (p.slots[s].current != p.slots[s].input && p.value_dead[p.slots[s].current]) p.key += 'x' + std::to_string(s);
  if (i == n) p.end = n + 1 >= rt::Engine::kMaxGroup ? End::k_size_bound : End::k_queue_end;
}

Graph to_graph(const Plan& p, FusionGroup& group) {
  Graph g;
  const int values = static_cast<int>(p.value_slot.size());
  TensorMeta meta;
  meta.dtype = p.dtype;
  meta.sizes = {SymExpr::constant(p.numel)};
  meta.strides = {SymExpr::constant(1)};
  for (int v = 0; v < values; ++v) {
    Value& val = g.values.emplace_back();
    val.kind = Value::Kind::kTensor;
    val.meta = meta;
    val.name = "v" + std::to_string(v);
  }
  group = FusionGroup{};
  group.dtype = p.dtype;
  group.may_alias = true;
  group.eager_split = true;
  for (size_t s = 0; s < p.scalars.size(); ++s) {
    Value& val = g.values.emplace_back();
    val.kind = Value::Kind::kScalar;
    val.name = "s" + std::to_string(s);
    group.scalar_inputs.push_back(values + static_cast<int>(s));
  }
  for (int v : p.inputs()) g.inputs.push_back({v, true});
  for (int s : group.scalar_inputs) g.inputs.push_back({s, false});
  for (const Plan::Member& m : p.nodes) {
    Node& n = g.nodes.emplace_back();
    n.kind = Node::Kind::kAten;
    n.op = m.op;
    n.id = m.id;
    n.target = op_info(m.id).target;
    for (const Plan::Operand& o : m.operands) {
      Arg& a = n.args.emplace_back();
      if (o.kind == Plan::Operand::Kind::kConstant) {
        a.constant = o.constant;
      } else {
        a.kind = Arg::Kind::kValue;
        a.value = o.kind == Plan::Operand::Kind::kValue ? o.index : values + o.index;
      }
    }
    n.outputs = {m.output};
    n.fused_group = 0;
    group.nodes.push_back(static_cast<int>(g.nodes.size()) - 1);
  }
  group.tensor_inputs = p.inputs();
  group.outputs = p.outputs();
  g.outputs = group.outputs;
  return g;
}

}  // namespace neuronx::compiler::adaptive
