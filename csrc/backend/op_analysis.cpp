// What the eager fallback learns about an operator once: its schema's
// aliasing and argument kinds, its policy-table flags, and its out= form.
#include <ATen/core/dispatch/Dispatcher.h>

#include "backend/fallback_policy.h"
#include "backend/ivalue_map.h"
#include "backend/metrics.h"
#include "backend/op_kernel.h"

namespace neuronx {

namespace {

// Overloads of each operator name, for finding out= forms.
const std::unordered_map<std::string, std::vector<c10::OperatorName>>& overloads_by_name() {
  static const auto* m = [] {
    auto* r = new std::unordered_map<std::string, std::vector<c10::OperatorName>>;
    for (const auto& n : c10::Dispatcher::singleton().getAllOpNames()) (*r)[n.name].push_back(n);
    return r;
  }();
  return *m;
}

std::optional<c10::OperatorHandle> find_out_variant(const c10::FunctionSchema& s) {
  const auto& all = overloads_by_name();
  auto it = all.find(s.name());
  if (it == all.end()) return std::nullopt;
  for (const auto& name : it->second) {
    if (name.overload_name == s.overload_name()) continue;
    auto h = c10::Dispatcher::singleton().findSchema(name);
    if (!h || !h->hasComputedKernelForDispatchKey(c10::DispatchKey::CPU)) continue;
    const auto& o = h->schema();
    std::vector<const c10::Argument*> ins, outs;
    for (const auto& a : o.arguments()) (a.is_out() ? outs : ins).push_back(&a);
    if (outs.empty() || outs.size() != s.returns().size() || ins.size() != s.arguments().size()) continue;
    bool ok = true;
    for (size_t i = 0; ok && i < ins.size(); ++i) ok = *ins[i]->type() == *s.arguments()[i].type();
    for (size_t i = 0; ok && i < outs.size(); ++i) ok = *outs[i]->type() == *s.returns()[i].type();
    if (ok) return h;
  }
  return std::nullopt;
}

}  // namespace

int aliased_argument(const c10::FunctionSchema& s, size_t r) {
  const auto* ri = r < s.returns().size() ? s.returns()[r].alias_info() : nullptr;
  if (!ri) return -1;
  for (size_t i = 0; i < s.arguments().size(); ++i) {
    const auto* ai = s.arguments()[i].alias_info();
    if (!ai) continue;
    for (const auto& set : ri->beforeSets())
      if (ai->beforeSets().count(set)) return static_cast<int>(i);
  }
  return -1;
}

OpAnalysis::OpAnalysis(const c10::OperatorHandle& h) : op(h) {
  const auto& s = h.schema();
  name = s.name() + (s.overload_name().empty() ? "" : "." + s.overload_name());
  num_args = s.arguments().size();
  num_returns = s.returns().size();
  arg_written.resize(num_args, false);
  arg_out.resize(num_args, false);
  for (size_t i = 0; i < num_args; ++i) {
    const auto& a = s.arguments()[i];
    if (a.alias_info() && a.alias_info()->isWrite()) {
      arg_written[i] = true;
      arg_out[i] = a.is_out();
      any_written = true;
    }
    auto t = a.real_type();
    if (auto o = t->cast<c10::OptionalType>()) t = o->getElementType();
    if (t->kind() == c10::TypeKind::GeneratorType) generator_args.push_back(static_cast<int>(i));
    if (t->kind() == c10::TypeKind::ScalarTypeType) dtype_args.push_back(static_cast<int>(i));
  }
  for (size_t r = 0; r < num_returns; ++r) {
    const auto* ri = s.returns()[r].alias_info();
    const int arg = aliased_argument(s, r);
    ret_arg.push_back(arg);
    ret_view.push_back(arg >= 0 && !ri->isWrite());
    if (arg < 0 && is_tensor_type(s.returns()[r].type())) any_new = true;
  }
  policy = policy_flags(s.name(), s.overload_name());
  device_kernel = neuronx::device_kernel(s.name(), s.overload_name());
  allow_cpu_operands = policy & kHostIndices;
  indexing = (policy & kIndexGet) ? Indexing::kGet : (policy & kIndexPut) ? Indexing::kPut : Indexing::kNone;
  fills = policy & kFill;
  float_values_shape = policy & kFloatValuesShape;
  eval_stats_empty = policy & kEvalStatsEmpty;
  if (policy & kSyncOnly) sync_only.store(true);
  bool all_new = num_returns > 0;
  for (int a : ret_arg) all_new = all_new && a < 0;
  // Only structured ops share their checks between the functional and out=
  // forms (e.g. max() rejects empty inputs, max.unary_out does not): use the
  // out= kernel only for them.
  const bool structured = h.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional);
  if (!any_written && all_new && structured) out_op = find_out_variant(s);
  counters = &op_counters(name);
}

bool OpAnalysis::validated(const std::string& dtype_key) {
  std::lock_guard<std::mutex> g(validated_mu_);
  return validated_.count(dtype_key) > 0;
}

void OpAnalysis::mark_validated(const std::string& dtype_key) {
  std::lock_guard<std::mutex> g(validated_mu_);
  validated_.insert(dtype_key);
}

}  // namespace neuronx
