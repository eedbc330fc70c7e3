#include "backend/launch_checks.h"

#include <ATen/ExpandUtils.h>
#include <ATen/ops/aminmax.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index.h>

#include "backend/metrics.h"
#include "backend/op_kernel.h"
#include "backend/python_hooks.h"
#include "backend/seen_values.h"
#include "backend/tensor_views.h"

namespace neuronx {

bool same_layout(c10::IntArrayRef sizes_a, c10::IntArrayRef strides_a, c10::IntArrayRef sizes_b,
                 c10::IntArrayRef strides_b) {
  if (sizes_a != sizes_b) return false;
  // Strides of size-1 dimensions carry no meaning.
  for (size_t i = 0; i < sizes_a.size(); ++i)
    if (sizes_a[i] != 1 && strides_a[i] != strides_b[i]) return false;
  return true;
}

bool has_channels_last_operand(c10::ArrayRef<c10::IValue> args) {
  auto channels_last = [](const at::Tensor& t) {
    if (!t.defined() || t.layout() != c10::kStrided || (t.dim() != 4 && t.dim() != 5)) return false;
    const auto mf = t.dim() == 4 ? c10::MemoryFormat::ChannelsLast : c10::MemoryFormat::ChannelsLast3d;
    return t.is_contiguous(mf) && !t.is_contiguous();
  };
  for (const auto& v : args) {
    if (v.isTensor() && channels_last(v.toTensor())) return true;
    if (v.isList())
      for (const c10::IValue& e : v.toListRef())
        if (e.isTensor() && channels_last(e.toTensor())) return true;
  }
  return false;
}

// What CUDA checks on the host before an advanced-indexing kernel, from
// shapes alone: indices broadcast together, a non-empty index into an empty
// dimension, values that broadcast to the indexed result (index_put). Boolean
// masks decide the result's shape from their data (CUDA runs nonzero first):
// synchronous too. false: take the synchronous path, where the CPU kernel
// raises at the op with CPU's exception and wording.
bool indexing_checks_pass(const OpAnalysis& a, c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 2 || !args[0].isTensor() || !args[1].isList()) return true;
  const at::Tensor& self = args[0].toTensor();
  AliasSet aliases;
  c10::List<std::optional<at::Tensor>> indices;
  int64_t dim = 0;
  for (const c10::IValue& v : args[1].toListRef()) {
    if (!v.isTensor() || !v.toTensor().defined()) {
      indices.push_back(std::nullopt);
      ++dim;
      continue;
    }
    const at::Tensor& i = v.toTensor();
    if (i.scalar_type() == c10::kBool || i.scalar_type() == c10::kByte) return false;
    if (dim < self.dim() && self.size(dim) == 0 && i.numel() > 0) return false;
    ++dim;
    indices.push_back(i.device().type() == kNeuron ? aliases.meta(i) : i.to(c10::kMeta));
  }
  try {
    const at::Tensor result = at::index(aliases.meta(self), indices);
    if (a.indexing == OpAnalysis::Indexing::kPut && args.size() > 2 && args[2].isTensor()) {
      const at::Tensor& values = args[2].toTensor();
      if (at::infer_size(values.sizes(), result.sizes()) != result.sizes()) return false;
    }
  } catch (const std::exception&) {
    clear_python_error();
    return false;
  }
  return true;
}

void probe_scalar_checks(const OpAnalysis& a, c10::ArrayRef<c10::IValue> args) {
  c10::Stack probe;
  probe.reserve(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = args[i];
    if (v.isTensor() && v.toTensor().defined()) {
      probe.emplace_back(at::empty({0}, v.toTensor().options().device(c10::kCPU)));
    } else if (v.isGenerator()) {
      probe.emplace_back();  // a neuron generator; the probe draws nothing
    } else {
      probe.push_back(v);
    }
  }
  // Its warnings (random_'s range beyond the dtype's exact integers) reach
  // Python here, at the op, as CPU's and CUDA's host code gives them; the
  // queued kernel's own copy goes to the engine thread's log.
  at::AutoDispatchBelowADInplaceOrView below;
  a.op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &probe);
}

bool mask_broadcasts_to_self(c10::ArrayRef<c10::IValue> args) {
  if (args.size() < 2 || !args[0].isTensor() || !args[1].isTensor()) return true;
  const at::Tensor &self = args[0].toTensor(), &mask = args[1].toTensor();
  try {
    return at::infer_size(self.sizes(), mask.sizes()) == self.sizes();
  } catch (const c10::Error&) {
    return false;
  }
}

bool index_values_in_range(c10::ArrayRef<c10::IValue> args, c10::DeviceIndex d) {
  if (args.size() < 2 || !args[0].isTensor() || !args[1].isList()) return true;
  const at::Tensor& self = args[0].toTensor();
  int64_t dim = 0;
  for (const c10::IValue& v : args[1].toListRef()) {
    if (dim >= self.dim()) break;
    const int64_t size = self.size(dim++);
    if (!v.isTensor()) continue;
    const at::Tensor& i = v.toTensor();
    if (!i.defined() || i.numel() == 0 || i.device().type() != kNeuron) continue;
    if (i.scalar_type() != c10::kLong && i.scalar_type() != c10::kInt) break;  // masks span several dims
    const auto seen = seen_values(i);
    if (!seen || (seen->first >= -size && seen->second < size)) continue;
    // Possibly out of range: wait for the index and read it.
    count_sync(SyncReason::kDataDependent);
    translate([&] { current_queue(d).synchronize(); });
    auto [lo_t, hi_t] = at::aminmax(cpu_alias(i));
    const int64_t lo = lo_t.item<int64_t>(), hi = hi_t.item<int64_t>();
    note_checked(i, lo, hi);
    if (lo < -size || hi >= size) return false;
  }
  return true;
}

}  // namespace neuronx
