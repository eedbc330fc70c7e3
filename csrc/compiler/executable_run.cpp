// The program on the queue (Executable::execute): its steps in order, fused loops over rows or
// flat elements, and library calls (run_node) on CPU views of device memory.
#include <ATen/ExpandUtils.h>
#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/full.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/common.h"
#include "backend/kernel_scratch.h"
#include "compiler/epilogue_fusion.h"
#include "compiler/executable.h"
#include "compiler/scalar_ops.h"
#include "runtime/queue.h"

namespace neuronx::compiler {

void Executable::conform(int ni, std::vector<c10::IValue>& env) const {
  for (int o : graph_.nodes[ni].outputs) {
    const std::vector<int64_t>& want = promised_strides_[o];
    if (want.empty() || !env[o].isTensor()) continue;
    const at::Tensor& t = env[o].toTensor();
    if (!t.defined() || t.dim() != static_cast<int64_t>(want.size())) continue;
    bool same = true, overlapping = false;  // (a promised broadcast layout cannot be copied into)
    for (int64_t d = 0; d < t.dim(); ++d) {
      same = same && (t.size(d) <= 1 || t.stride(d) == want[d]);
      overlapping = overlapping || (t.size(d) > 1 && want[d] == 0);
    }
    if (same || overlapping) continue;
    at::Tensor c = at::empty_strided(t.sizes(), want, t.options());
    c.copy_(t);
    env[o] = std::move(c);
  }
}

void Executable::run_node(int ni, std::vector<c10::IValue>& env, const std::vector<at::Tensor>& outputs, char* arena,
                          c10::DeviceIndex d) const {
  const Node& n = graph_.nodes[ni];
  const auto& schema = n.op->schema();
  const std::vector<ArgConv>& convs = arg_convs_[ni];
  auto item = [&](const Arg& x) -> const c10::IValue& { return x.kind == Arg::Kind::kValue ? env[x.value] : x.constant; };
  c10::Stack stack;
  stack.reserve(n.args.size() + 1);
  int gen_slot = gen_slot_[ni];
  for (size_t i = 0; i < n.args.size(); ++i) {
    const Arg& a = n.args[i];
    switch (convs[i]) {
      case ArgConv::kGenerator:
        stack.push_back(env.at(gen_slot++));  // resolved at launch
        break;
      case ArgConv::kTensorList: {
        c10::List<at::Tensor> l;
        l.reserve(a.items.size());
        for (const auto& x : a.items) l.push_back(item(x).toTensor());
        stack.emplace_back(std::move(l));
        break;
      }
      case ArgConv::kOptionalTensorList: {
        c10::List<std::optional<at::Tensor>> l;
        for (const auto& x : a.items) {
          const c10::IValue& v = item(x);
          l.push_back(v.isNone() ? std::nullopt : std::optional<at::Tensor>(v.toTensor()));
        }
        stack.emplace_back(std::move(l));
        break;
      }
      case ArgConv::kFloatList: {
        c10::List<double> l;
        for (const auto& x : a.items) l.push_back(as_double(item(x)));
        stack.emplace_back(std::move(l));
        break;
      }
      case ArgConv::kBoolList: {
        c10::List<bool> l;
        for (const auto& x : a.items) l.push_back(item(x).toBool());
        stack.emplace_back(std::move(l));
        break;
      }
      case ArgConv::kIntList: {
        c10::List<int64_t> l;
        l.reserve(a.items.size());
        for (const auto& x : a.items) {
          const c10::IValue& v = item(x);
          l.push_back(v.isInt() ? v.toInt() : static_cast<int64_t>(std::llround(as_double(v))));
        }
        stack.emplace_back(std::move(l));
        break;
      }
      case ArgConv::kTensor: {
        const c10::IValue& v = item(a);
        if (v.isDouble() || v.isInt() || v.isBool()) stack.push_back(wrapped_number(v));
        else stack.push_back(v);
        break;
      }
      case ArgConv::kInt: {
        const c10::IValue& v = item(a);
        if (v.isDouble()) stack.emplace_back(static_cast<int64_t>(std::llround(v.toDouble())));
        else stack.push_back(v);
        break;
      }
      case ArgConv::kDevice: {
        const c10::IValue& v = item(a);
        if (v.isDevice() && v.toDevice().type() == kNeuron) stack.emplace_back(c10::Device(c10::kCPU));
        else stack.push_back(v);
        break;
      }
      case ArgConv::kAsIs:
        stack.push_back(item(a));
        break;
    }
  }
  // A device kernel in place of CPU's (device_kernels.h), also writing where we choose.
  if (DeviceKernel k = device_kernel_[ni]) {
    std::vector<at::Tensor> dsts = result_buffers(ni, outputs, arena, /*channels_last_ok=*/true);
    if (!dsts.empty() && k(dsts, stack)) {
      device_kernel_counters_[ni]->device_kernel.fetch_add(1, std::memory_order_relaxed);
      for (size_t r = 0; r < dsts.size(); ++r) env[n.outputs[r]] = std::move(dsts[r]);
      conform(ni, env);
      return;
    }
  }
  // Written where we choose (the arena, the caller's output) through an out= overload.
  const auto& oc = out_op_[ni];
  if (oc && !lends(ni) && !out_failed_[ni].load(std::memory_order_relaxed)) {
    bool chosen = false;
    std::vector<at::Tensor> dsts = result_buffers(ni, outputs, arena, oc->any_layout, &chosen);
    if (chosen) {
      if (oc->extra) stack.push_back(*oc->extra);
      for (const at::Tensor& t : dsts) stack.emplace_back(t);
      try {
        oc->op.callBoxed(stack);
        for (size_t r = 0; r < dsts.size(); ++r) env[n.outputs[r]] = std::move(dsts[r]);
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
  // A returned result of an op that cannot write where we choose: the op's allocation of its
  // size is served from the caller's tensor, sparing the copy at the end of the run.
  const at::Tensor placed = placement_destination(ni, outputs);
  {
    std::optional<ScratchPlacement> placement;
    if (placed.defined())
      placement.emplace(placed.data_ptr(), at::detail::computeStorageNbytes(placed.sizes(), placed.strides(),
                                                                            placed.itemsize()));
    if (n.neuron_kernel == Node::NeuronKernel::kAlways || integral_histc)
      h.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), &stack);
    else
      h.callBoxed(stack);
    if (placement && placement->taken()) settle_placement(ni, stack, placed);
  }
  const auto& returns = schema.returns();
  if (returns.size() == 1 && returns[0].type()->kind() == c10::TypeKind::ListType && stack.size() == 1 &&
      stack[0].isTensorList()) {  // split, unbind, ...: one value per element
    auto list = stack[0].toTensorVector();
    for (size_t r = 0; r < n.outputs.size() && r < list.size(); ++r) env[n.outputs[r]] = list[r];
    return;
  }
  for (size_t r = 0; r < n.outputs.size() && r < stack.size(); ++r) env[n.outputs[r]] = std::move(stack[r]);
  if (op_info(n.id).empty_eval_stats) fill_empty_stats(ni, env);
  conform(ni, env);
}

at::Tensor Executable::placement_destination(int ni, const std::vector<at::Tensor>& outputs) const {
  const int v = place_value_[ni];
  if (v < 0) return {};
  const int oi = output_index_[v];
  if (oi >= static_cast<int>(outputs.size()) || !outputs[oi].defined()) return {};
  const at::Tensor& t = outputs[oi];
  const TensorMeta& m = *graph_.values[v].meta;
  if (t.dim() != static_cast<int64_t>(m.sizes.size())) return {};
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) != m.sizes[d].value() || (t.size(d) > 1 && t.stride(d) != m.strides[d].value())) return {};
  return t.is_non_overlapping_and_dense() ? t : at::Tensor();
}

// The memory lent to the op went to its allocation of that size: the result it was meant for
// (then nothing is copied at the end), or a temporary the op has freed, or another result,
// which gets memory of its own now (the caller's tensor is written at the end of the run).
void Executable::settle_placement(int ni, c10::Stack& stack, const at::Tensor& placed) const {
  const Node& n = graph_.nodes[ni];
  const void* lent = placed.data_ptr();
  auto own = [&](c10::IValue& iv, bool intended) {
    if (!iv.isTensor()) return;
    const at::Tensor& t = iv.toTensor();
    if (!t.defined() || !t.has_storage() || t.storage().data() != lent) return;
    if (intended && t.data_ptr() == lent && t.sizes() == placed.sizes() && t.strides() == placed.strides()) return;
    at::Tensor c = at::empty_strided(t.sizes(), t.strides(), t.options());
    c.copy_(t);
    iv = std::move(c);
  };
  for (size_t r = 0; r < stack.size(); ++r) {
    if (stack[r].isTensorList()) {
      auto list = stack[r].toTensorVector();
      for (auto& t : list) {
        c10::IValue iv(t);
        own(iv, false);
        t = iv.toTensor();
      }
      stack[r] = c10::IValue(list);
      continue;
    }
    own(stack[r], r < n.outputs.size() && n.outputs[r] == place_value_[ni]);
  }
}

// Batch norm in eval mode: CPU returns empty saved statistics where the graph was traced with
// [C]. Nothing reads them then (an eval norm's backward uses the running statistics), but the
// graph's outputs and plan expect the traced shape: zeros of it.
void Executable::fill_empty_stats(int ni, std::vector<c10::IValue>& env) const {
  const Node& n = graph_.nodes[ni];
  for (size_t r = 1; r < 3 && r < n.outputs.size(); ++r) {
    c10::IValue& v = env[n.outputs[r]];
    const auto& m = graph_.values[n.outputs[r]].meta;
    if (!v.isTensor() || !m || !m->is_static() || v.toTensor().numel() != 0) continue;
    std::vector<int64_t> sizes;
    for (const auto& e : m->sizes) sizes.push_back(e.value());
    if (c10::multiply_integers(sizes) != 0) v = at::zeros(sizes, v.toTensor().options());
  }
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
    const int64_t start = report_steps ? rt::now_ns() : 0;
    at::Tensor dst = outputs[i], src = r;
    for (int64_t d = 0; d < dst.dim(); ++d)
      if (dst.stride(d) == 0 && dst.size(d) > 1) {
        dst = dst.narrow(d, 0, 1);
        src = src.narrow(d, 0, 1);
      }
    dst.copy_(src);
    if (report_steps) rt::report_step("neuron::output_copy", start, rt::now_ns());
  }
}

}  // namespace neuronx::compiler
