// The generic eager path: every ATen op without a neuron kernel of its own.
//
// 1. output metadata from the op's meta kernel (meta twins of the operands);
// 2. outputs allocated on the device, out= arguments resized on the host;
// 3. an OpKernel enqueued on the current stream that runs ATen's CPU kernel
//    on CPU aliases of the device buffers (out= form when there is one).
// Ops without a meta kernel, or whose output shape depends on data, take the
// synchronous path: drain the stream, run, and adopt the results.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <mutex>
#include <shared_mutex>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "backend/registration.h"
#include "backend/fallback_policy.h"
#include "backend/fast_ops.h"
#include "backend/generator.h"
#include "backend/launch_checks.h"
#include "backend/ivalue_map.h"
#include "backend/meta_cache.h"
#include "backend/metrics.h"
#include "backend/op_kernel.h"
#include "backend/python_hooks.h"
#include "backend/seen_values.h"
#include "backend/sparse.h"
#include "backend/tensor_views.h"

namespace neuronx {

namespace {

const c10::DispatchKeySet kCPUKeys(c10::DispatchKey::CPU);
const c10::DispatchKeySet kMetaKeys(c10::DispatchKey::Meta);

OpAnalysis& analysis_for(const c10::OperatorHandle& op) {
  // Schemas live as long as the process; key by address.
  thread_local std::unordered_map<const void*, OpAnalysis*> local;
  const void* key = &op.schema();
  auto it = local.find(key);
  if (it != local.end()) return *it->second;
  static std::shared_mutex mu;
  static auto* global = new std::unordered_map<const void*, std::unique_ptr<OpAnalysis>>;
  OpAnalysis* a = nullptr;
  {
    std::shared_lock<std::shared_mutex> r(mu);
    auto g = global->find(key);
    if (g != global->end()) a = g->second.get();
  }
  if (!a) {
    auto fresh = std::make_unique<OpAnalysis>(op);
    std::unique_lock<std::shared_mutex> w(mu);
    auto& slot = (*global)[key];
    if (!slot) slot = std::move(fresh);
    a = slot.get();
  }
  local.emplace(key, a);
  return *a;
}

template <typename F>
void for_each_tensor(const c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef())
      if (e.isTensor()) f(e.toTensor());
  }
}

[[noreturn]] void device_mismatch(const OpAnalysis& a, const c10::Device& x, const c10::Device& y) {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ", x,
              " and ", y, "! (in ", a.name, ")");
}

// The device the op runs on, checking that operands agree as CUDA does:
// neuron tensors of one device, plus host tensors only where CUDA allows
// them (0-dim scalars; index tensors for indexing ops).
c10::DeviceIndex op_device(const OpAnalysis& a, c10::ArrayRef<c10::IValue> args) {
  std::optional<c10::Device> dev;
  std::optional<c10::Device> host;
  for (size_t i = 0; i < args.size(); ++i) {
    for_each_tensor(args[i], [&](const at::Tensor& t) {
      if (!t.defined()) return;
      const c10::Device d = t.device();
      if (d.type() == kNeuron) {
        if (dev && *dev != d) device_mismatch(a, *dev, d);
        dev = d;
      } else if (d.is_cpu() && (t.dim() == 0 || a.allow_cpu_operands) && !a.arg_written[i]) {
        // allowed host operand
      } else {
        host = d;
      }
    });
    if (args[i].isDevice() && args[i].toDevice().type() == kNeuron && !dev) dev = args[i].toDevice();
  }
  if (host) {
    if (dev) device_mismatch(a, *dev, *host);
    TORCH_CHECK(false, "neuron fallback reached for ", a.name, " without a neuron tensor (found ", *host, ")");
  }
  if (!dev) return current_device();
  return dev->index() >= 0 ? dev->index() : current_device();
}

void check_supported(const OpAnalysis& a, c10::ArrayRef<c10::IValue> args) {
  for (int i : a.dtype_args)
    if (args[i].isInt())
      TORCH_CHECK_NOT_IMPLEMENTED(!c10::isQIntType(static_cast<c10::ScalarType>(args[i].toInt())), a.name,
                                  ": quantized dtypes are not supported on neuron yet; quantize on CPU");
  for (const auto& v : args) {
    for_each_tensor(v, [&](const at::Tensor& t) {
      if (!t.defined()) return;
      TORCH_CHECK_NOT_IMPLEMENTED(t.layout() == c10::kStrided, a.name, ": ", t.layout(),
                                  " tensors are not supported on neuron yet (only strided tensors); "
                                  "convert with .to_dense() or run this op on CPU");
      TORCH_CHECK_NOT_IMPLEMENTED(!t.is_quantized(), a.name,
                                  ": quantized tensors are not supported on neuron yet; dequantize first "
                                  "or run this op on CPU");
      TORCH_CHECK_NOT_IMPLEMENTED(!t.is_nested(), a.name,
                                  ": nested tensors are not supported on neuron yet");
    });
  }
}

// Operands for the CPU kernel, captured now. Host tensors that are not
// wrapped Python numbers are copied: the user may change them before the
// kernel runs (CUDA copies them into the launch too). on_device(t, pos) gives
// what stands for neuron tensor t (pos: its index in a list argument, or -1).
template <typename OnDevice>
c10::IValue operand(const OpAnalysis& a, size_t i, const c10::IValue& v, c10::DeviceIndex d, OnDevice&& on_device) {
  for (int g : a.generator_args)
    if (static_cast<size_t>(g) == i)
      return c10::IValue(kernel_generator(v.isNone() ? std::nullopt : std::optional<at::Generator>(v.toGenerator()), d));
  if (v.isDevice() && v.toDevice().type() == kNeuron) return c10::IValue(c10::Device(c10::kCPU));
  return map_tensors_indexed(v, [&](const at::Tensor& t, int pos) -> at::Tensor {
    if (!t.defined()) return t;
    if (t.device().type() == kNeuron) return on_device(t, pos);
    if (t.unsafeGetTensorImpl()->is_wrapped_number()) return t;
    return t.clone();
  });
}

// An operand for a kernel run now, on the host.
c10::IValue kernel_operand(const OpAnalysis& a, size_t i, const c10::IValue& v, c10::DeviceIndex d,
                           bool resizable, AliasSet& aliases) {
  return operand(a, i, v, d, [&](const at::Tensor& t, int) { return aliases.cpu(t, resizable); });
}

c10::IValue meta_operand(const c10::IValue& v, AliasSet& aliases) {
  if (v.isDevice() && v.toDevice().type() == kNeuron) return c10::IValue(c10::Device(c10::kMeta));
  // Host operands (0-dim scalars) stay on the host: meta kernels accept them as
  // CPU scalars, and Python meta kernels read wrapped numbers' values.
  return map_tensors(v, [&](const at::Tensor& t) {
    return t.defined() && t.device().type() == kNeuron ? aliases.meta(t) : t;
  });
}

void check_supported_result(const OpAnalysis& a, const at::Tensor& t) {
  if (!t.defined()) return;
  TORCH_CHECK_NOT_IMPLEMENTED(t.layout() != c10::kJagged && t.layout() != c10::kMkldnn, a.name,
                              " would produce a ", t.layout(),
                              " tensor: this layout is not supported on neuron yet; run this op on CPU");
  TORCH_CHECK_NOT_IMPLEMENTED(!t.is_quantized() && !c10::isQIntType(t.scalar_type()), a.name,
                              " would produce a quantized tensor: quantized tensors are not supported on neuron "
                              "yet; run this op on CPU");
  TORCH_CHECK_NOT_IMPLEMENTED(!t.is_nested(), a.name,
                              " would produce a nested tensor: nested tensors are not supported on neuron yet");
}

// A device tensor holding the host result r (used by the synchronous path).
at::Tensor adopt_host_result(const OpAnalysis& a, const at::Tensor& r, c10::DeviceIndex d) {
  check_supported_result(a, r);
  if (!r.defined()) return r;
  if (r.layout() != c10::kStrided) return sparse_to_device(r, d);  // e.g. to_sparse() of a neuron tensor
  at::Tensor m = r.is_non_overlapping_and_dense() ? r : r.contiguous();
  at::Tensor out = empty_with_geometry(Geometry::of(m), d);
  cpu_alias(out).copy_(r);
  return out;
}



// Times an op the host runs inline on a queue's behalf, for the profiler and
// the device counters (a failure is reported as such, then propagates).
class InlineRun {
 public:
  InlineRun(rt::Queue& q, const char* name) : q_(q), name_(name), start_(rt::now_ns()) {}
  void done() {
    q_.report_inline(name_, start_, rt::now_ns(), false);
    done_ = true;
  }
  ~InlineRun() {
    if (!done_) q_.report_inline(name_, start_, rt::now_ns(), true);
  }
  InlineRun(const InlineRun&) = delete;
  InlineRun& operator=(const InlineRun&) = delete;

 private:
  rt::Queue& q_;
  const char* name_;
  int64_t start_;
  bool done_ = false;
};

// `predicted`: the meta kernel's geometry for resized out= arguments; the
// CPU kernel's result tells whether it can be trusted for this op.
void sync_path(OpAnalysis& a, c10::ArrayRef<c10::IValue> args, std::vector<c10::IValue>& out, c10::DeviceIndex d,
               std::vector<std::pair<size_t, Geometry>>* predicted = nullptr) {
  a.counters->sync.fetch_add(1, std::memory_order_relaxed);
  count_sync(SyncReason::kDataDependent);
  rt::Queue& q = current_queue(d);
  translate([&] { q.synchronize(); });
  AliasSet alias_set;
  // Written arguments first: an input sharing their storage (addr_ is
  // addr.out(self, ..., out=self)) must see the same, resizable, storage.
  std::vector<c10::IValue> operands(a.num_args);
  for (int pass = 0; pass < 2; ++pass)
    for (size_t i = 0; i < a.num_args; ++i)
      if (a.arg_written[i] == (pass == 0)) operands[i] = kernel_operand(a, i, args[i], d, a.arg_written[i], alias_set);
  c10::Stack cpu(operands.begin(), operands.end());
  std::vector<c10::IValue> aliases(cpu.begin(), cpu.end());
  const c10::ArrayRef<c10::IValue> originals = args;
  {
    at::AutoDispatchBelowADInplaceOrView below;
    InlineRun run(q, a.name.c_str());
    a.op.redispatchBoxed(kCPUKeys, &cpu);
    run.done();
  }
  // Written arguments the CPU kernel resized (out= with data-dependent
  // shapes) moved to host memory: bring the result back to the device.
  for (size_t i = 0; i < a.num_args; ++i) {
    if (!a.arg_written[i] || !originals[i].isTensor()) continue;
    const at::Tensor& dev_t = originals[i].toTensor();
    const at::Tensor& host_t = aliases[i].toTensor();
    if (!dev_t.defined() || dev_t.device().type() != kNeuron) continue;
    if (host_t.sizes() == dev_t.sizes() && host_t.strides() == dev_t.strides() &&
        host_t.storage().data_ptr().get() == dev_t.storage().data_ptr().get() && host_t.is_conj() == dev_t.is_conj())
      continue;
    adopt_geometry(dev_t, Geometry::of(host_t));
    // A grown storage copies its old bytes on the queue: let that land first.
    translate([&] { q.synchronize(); });
    // Physical values, then the conjugate bit the kernel set (linalg out= forms do).
    const bool conj = host_t.is_conj();
    dev_t._set_conj(false);
    cpu_alias(dev_t).copy_(conj ? host_t.conj() : host_t);
    dev_t._set_conj(conj);
  }
  if (predicted) {  // emptied when the CPU kernel chose the predicted layouts
    bool agree = true;
    for (const auto& [i, g] : *predicted) {
      const at::Tensor& host_t = aliases[i].toTensor();
      agree = agree && same_layout(host_t.sizes(), host_t.strides(), g.sizes, g.strides);
    }
    if (agree) predicted->clear();
  }
  const std::vector<c10::IValue> results(cpu.begin(), cpu.end());
  out.resize(results.size());
  for (size_t r = 0; r < results.size(); ++r) {
    const int k = r < a.ret_arg.size() ? a.ret_arg[r] : -1;
    if (k >= 0 && !a.ret_view[r]) {
      out[r] = c10::IValue();  // the argument itself (fill_aliased_returns)
    } else if (k >= 0 && originals[k].isTensor() && results[r].isTensor()) {
      out[r] = view_with_geometry(originals[k].toTensor(), Geometry::of(results[r].toTensor()));
    } else {
      out[r] = map_tensors(results[r], [&](const at::Tensor& t) { return adopt_host_result(a, t, d); });
    }
  }
}

// Runs the op's meta kernel on meta twins of the operands. nullopt: the op
// must take the synchronous path (no meta kernel, data-dependent shapes, or
// results that are host values).
std::shared_ptr<MetaResult> run_meta(OpAnalysis& a, c10::ArrayRef<c10::IValue> args) {
  if (a.indexing != OpAnalysis::Indexing::kNone && !indexing_checks_pass(a, args)) return nullptr;
  c10::Stack meta;
  meta.reserve(a.num_args);
  AliasSet alias_set;
  for (const auto& v : args) meta.push_back(meta_operand(v, alias_set));
  std::vector<c10::IValue> meta_args(meta.begin(), meta.end());
  try {
    // The CPU kernel warns for the call (out= resizes, deprecations); the
    // meta kernel's copy of those warnings would make each appear twice.
    DiscardWarnings quiet;
    c10::WarningUtils::WarningHandlerGuard guard(&quiet);
    a.op.redispatchBoxed(kMetaKeys, &meta);
  } catch (const c10::Error& e) {
    // No meta kernel: always synchronous. Any other error is the user's (bad
    // shapes, dtypes, indices): the CPU kernel, run synchronously, raises it
    // with CPU's own exception type and wording.
    if (dynamic_cast<const c10::NotImplementedError*>(&e)) a.sync_only.store(true);
    return nullptr;
  } catch (const std::exception&) {
    // A Python meta kernel raised: let the CPU kernel decide (and word the error).
    clear_python_error();
    return nullptr;
  }
  auto r = std::make_shared<MetaResult>();
  r->returns.resize(a.num_returns);
  r->return_is_list.resize(a.num_returns, false);
  for (size_t i = 0; i < a.num_returns && i < meta.size(); ++i) {
    const c10::IValue& v = meta[i];
    if (v.isTensor()) {
      check_supported_result(a, v.toTensor());
      if (v.toTensor().layout() != c10::kStrided) {  // sparse: built on the host, then moved (sparse.cpp)
        a.sync_only.store(true);
        return nullptr;
      }
      r->returns[i] = std::vector<Geometry>{Geometry::of(v.toTensor())};
    } else if (v.isTensorList()) {
      std::vector<Geometry> gs;
      for (const at::Tensor& t : v.toTensorVector()) {
        check_supported_result(a, t);
        gs.push_back(Geometry::of(t));
      }
      r->returns[i] = std::move(gs);
      r->return_is_list[i] = true;
    } else if (!v.isNone()) {
      a.sync_only.store(true);  // returns a host value (bool, int, ...): must run to know it
      return nullptr;
    }
  }
  for (size_t i = 0; i < a.num_args; ++i)
    if (a.arg_written[i] && meta_args[i].isTensor() && meta_args[i].toTensor().defined())
      r->written.emplace_back(i, Geometry::of(meta_args[i].toTensor()));
  // Where ATen's meta kernel and its CPU kernel disagree on output shapes.
  if (a.eval_stats_empty && args.size() > 5 && args[5].isBool() && !args[5].toBool()) {
    // In eval mode the CPU kernel returns empty save_mean / save_invstd.
    for (size_t i = 1; i < 3 && i < r->returns.size(); ++i)
      if (r->returns[i] && !r->returns[i]->empty()) {
        Geometry& g = (*r->returns[i])[0];
        g.sizes.assign({0});
        g.strides.assign({1});
        g.offset = 0;
      }
  }
  return r;
}

}  // namespace

namespace {

// The path an op takes, and its output metadata (mr) when it is queued.
// kDone: it already ran (synchronously, learning how its out= resizes).
enum class Plan { kQueue, kSync, kDone };

Plan plan(OpAnalysis& a, c10::ArrayRef<c10::IValue> args, std::vector<c10::IValue>& results, c10::DeviceIndex d,
          std::shared_ptr<const MetaResult>& mr) {
  if (a.sync_only.load(std::memory_order_relaxed)) return Plan::kSync;
  if (a.fills) note_fill(args[0].toTensor(), args[1]);
  if (a.policy & kProbeScalars) probe_scalar_checks(a, args);
  if ((a.policy & kMaskToSelf) && !mask_broadcasts_to_self(args)) return Plan::kSync;
  // An index the host saw given values out of range raises here, as on CPU.
  if (a.indexing != OpAnalysis::Indexing::kNone && !index_values_in_range(args, d)) return Plan::kSync;

  // Output metadata: cached per input signature, else the meta kernel.
  thread_local std::string key;  // reused: no allocation per op
  const bool cacheable = MetaCache::make_key(args, key, a.float_values_shape);
  if (cacheable) mr = a.meta_cache.find(key);
  if (!mr) {
    auto fresh = run_meta(a, args);
    if (!fresh) return Plan::kSync;
    mr = std::move(fresh);
    if (cacheable) a.meta_cache.insert(key, mr);
  }

  if (mr->cpu_layout.load(std::memory_order_relaxed)) return Plan::kSync;

  // Written arguments whose shape the op changes. In-place ops must not
  // (CPU raises, e.g. a broadcast that would grow self: its kernel words the
  // error); out= arguments are resized, trusting the meta kernel's layout once
  // a synchronous run has shown the CPU kernel picks the same one.
  thread_local std::vector<std::pair<size_t, Geometry>> resized;
  resized.clear();
  for (const auto& [i, g] : mr->written) {
    const at::Tensor& t = args[i].toTensor();
    if (!t.defined() || t.device().type() != kNeuron || t.sizes() == c10::IntArrayRef(g.sizes)) continue;
    if (!a.arg_out[i]) {
      // In-place metadata ops (transpose_, unsqueeze_) keep the element count.
      if (c10::multiply_integers(g.sizes) != t.numel() || t.numel() == 0) return Plan::kSync;
      continue;
    }
    // An out= argument that is also an input would change under the kernel.
    for (size_t j = 0; j < a.num_args; ++j)
      if (j != i && args[j].isTensor() && args[j].toTensor().defined() && args[j].toTensor().is_alias_of(t))
        return Plan::kSync;
    resized.emplace_back(i, g);
  }
  if (!resized.empty()) {
    const int state = mr->out_resize.load(std::memory_order_relaxed);
    if (state == 0) {
      auto predicted = resized;  // sync_path may reenter the fallback (thread_local reuse)
      sync_path(a, args, results, d, &predicted);
      mr->out_resize.store(predicted.empty() ? 1 : 2, std::memory_order_relaxed);
      return Plan::kDone;
    }
    if (state == 2) return Plan::kSync;
  }

  return Plan::kQueue;
}

// Outputs: new tensors, views, and resized out= arguments. Returns whether a
// kernel must run (false: the op only made views).
bool allocate_outputs(const OpAnalysis& a, c10::ArrayRef<c10::IValue> args, const MetaResult& mr,
                      c10::DeviceIndex d, std::vector<c10::IValue>& results) {
  bool launch = a.any_written;
  results.resize(a.num_returns);
  for (size_t r = 0; r < a.num_returns; ++r) {
    const int k = a.ret_arg[r];
    if (k >= 0 && !a.ret_view[r]) continue;  // the argument itself (fill_aliased_returns)
    const auto& geoms = mr.returns[r];
    if (!geoms) continue;  // None
    if (k < 0) launch = true;
    if (!mr.return_is_list[r] && geoms->size() == 1) {
      const Geometry& g = (*geoms)[0];
      results[r] = k >= 0 ? view_with_geometry(args[k].toTensor(), g) : empty_with_geometry(g, d);
      continue;
    }
    std::vector<at::Tensor> ts;
    ts.reserve(geoms->size());
    for (const Geometry& g : *geoms)
      ts.push_back(k >= 0 ? view_with_geometry(args[k].toTensor(), g) : empty_with_geometry(g, d));
    results[r] = mr.return_is_list[r] ? c10::IValue(c10::List<at::Tensor>(ts)) : c10::IValue(ts[0]);
  }
  for (const auto& [i, g] : mr.written) {
    const at::Tensor& t = args[i].toTensor();
    // A correctly sized out= argument keeps its strides: CPU kernels write
    // through them (or raise, e.g. on internal overlap) rather than restride.
    if (!t.defined() || t.device().type() != kNeuron) continue;
    if (a.arg_out[i] && t.sizes() == c10::IntArrayRef(g.sizes)) continue;
    // CPU's kernel warns on every resize of a non-empty out= (the run that
    // chose this path did too); so does this one, which resizes on the host.
    if (a.arg_out[i]) at::native::resize_output_check(t, g.sizes);
    adopt_geometry(t, g);
  }

  return launch;
}

// The first call of a dtype signature runs inline after the queue drains, so
// an unsupported dtype raises here, at the op, as on CPU and CUDA.
void run_first_call(OpAnalysis& a, std::unique_ptr<OpKernel> k, const MetaResult& mr, const std::string& dtype_key,
                    rt::Queue& q, c10::DeviceIndex d, std::vector<c10::IValue>& results) {
  a.counters->sync.fetch_add(1, std::memory_order_relaxed);
  translate([&] { q.synchronize(); });
  try {
    k->set_validating(true);
    InlineRun run(q, a.name.c_str());
    k->execute();
    run.done();
    a.mark_validated(dtype_key);
    mr.dtypes_validated.store(true, std::memory_order_relaxed);
  } catch (const MetaMismatch& m) {
    // The op has run (inline, on the host); only our preallocated outputs
    // had the wrong shape or layout. Adopt what the CPU kernel returned. A wrong dtype is wrong
    // for every shape of these operand dtypes: each new shape runs inline too (this one, from
    // now on, synchronously).
    if (!m.dtype) a.mark_validated(dtype_key);
    if (k->mode() == OpKernel::Mode::kOut) {
      // It wrote our buffers in the layout it restrided their aliases to.
      for (size_t r = 0; r < a.num_returns && r < k->outs().size(); ++r)
        if (a.ret_arg[r] < 0 && results[r].isTensor() && k->outs()[r].isTensor())
          adopt_geometry(results[r].toTensor(), Geometry::of(k->outs()[r].toTensor()));
    } else {
      c10::Stack& rets = k->args();
      for (size_t r = 0; r < a.num_returns && r < rets.size(); ++r)
        if (a.ret_arg[r] < 0)
          results[r] = map_tensors(rets[r], [&](const at::Tensor& t) { return adopt_host_result(a, t, d); });
    }
  } catch (const c10::NotImplementedError&) {
    throw;  // unsupported dtype: raise at the op (the case below would queue it)
  } catch (const c10::Error& e) {
    // Errors CPU and CUDA raise on the host (dtypes, shapes the meta
    // kernel did not check) raise here, and these dtypes stay unvalidated.
    // Index errors depend on device data: they keep the asynchronous
    // contract, queued as this op's failure.
    if (kernel_error_kind(e) != KernelErrorKind::kIndex) {
      if (k->mode() != OpKernel::Mode::kOut) throw;
      // The out= form checks other things than the op (e.g. the out
      // dtype): the op itself gives CPU's error, or its result.
      c10::Stack functional(k->args().begin(), k->args().end());
      {
        at::AutoDispatchBelowADInplaceOrView below;
        a.op.redispatchBoxed(kCPUKeys, &functional);
      }
      a.out_form_resizes.store(true);
      for (size_t r = 0; r < a.num_returns && r < functional.size(); ++r)
        if (a.ret_arg[r] < 0)
          results[r] = map_tensors(functional[r], [&](const at::Tensor& t) { return adopt_host_result(a, t, d); });
      return;
    }
    a.mark_validated(dtype_key);
    std::string msg = e.what_without_backtrace();
    const int kind = static_cast<int>(kernel_error_kind(e));
    translate([&] {
      q.launch(std::make_unique<rt::FunctionKernel>(a.name.c_str(), [msg, kind] { throw rt::KernelError(msg, kind); }));
    });
  }
}

// Enqueues the CPU kernel on aliases of the device buffers (the first call of
// a dtype signature runs inline instead).
void launch(OpAnalysis& a, c10::ArrayRef<c10::IValue> args, const std::shared_ptr<const MetaResult>& mr,
            c10::DeviceIndex d, std::vector<c10::IValue>& results) {
  // The out= kernel writes straight into our outputs when they are plain
  // contiguous tensors. Other layouts (e.g. linalg's column-major results)
  // are where Python meta kernels and ATen's C++ kernels may pick different
  // strides; there the functional form runs and its result is copied.
  bool plain_outputs = true;
  for (const auto& r : results)
    if (r.isTensor() && (!r.toTensor().defined() || !r.toTensor().is_contiguous() || r.toTensor().is_conj() ||
                         r.toTensor().is_neg()))
      plain_outputs = false;
  // An op whose layouts vary runs its functional form, whose results show
  // the layout the CPU kernel chose (an out= kernel may just write ours).
  const bool use_out = a.out_op.has_value() && plain_outputs &&
                       !a.out_form_resizes.load(std::memory_order_relaxed) &&
                       !a.layout_varies.load(std::memory_order_relaxed);
  auto mode = a.any_new ? (use_out ? OpKernel::Mode::kOut : OpKernel::Mode::kFunctionalCopy)
                        : OpKernel::Mode::kDirect;
  auto k = std::make_unique<OpKernel>(&a, mode);
  k->set_geometry(mr);
  k->args().reserve(a.num_args);
  rt::Queue& q = current_queue(d);
  const AliasSet snapshots(&q);  // operands' CPU aliases are made when the kernel runs
  for (size_t i = 0; i < a.num_args; ++i)
    k->args().push_back(operand(a, i, args[i], d, [&](const at::Tensor& t, int pos) {
      k->defer(snapshots, t, static_cast<int>(i), pos);
      return at::Tensor();
    }));
  if (mode != OpKernel::Mode::kDirect) {
    k->outs().resize(a.num_returns);
    for (size_t r = 0; r < a.num_returns; ++r)
      if (a.ret_arg[r] < 0)
        k->outs()[r] = map_tensors_indexed(results[r], [&](const at::Tensor& t, int pos) {
          if (t.defined()) k->defer(snapshots, t, -1 - static_cast<int>(r), pos);
          return at::Tensor();
        });
  }
  thread_local std::string dtype_key;
  const bool known = mr->dtypes_validated.load(std::memory_order_relaxed);
  bool validated = known;
  if (!validated) {
    MetaCache::make_dtype_key(args, dtype_key);
    // Channels_last operands, and ops seen choosing another layout than
    // their meta kernel, are where output layouts must be learned: the
    // first call of each such signature runs inline and returns CPU's.
    validated = a.validated(dtype_key) && !has_channels_last_operand(args) &&
                !a.layout_varies.load(std::memory_order_relaxed);
  }
  if (validated) {
    if (!known) mr->dtypes_validated.store(true, std::memory_order_relaxed);  // (no store per op: the engine reads this line)
    translate([&] { q.launch(std::move(k)); });
    a.counters->async.fetch_add(1, std::memory_order_relaxed);
  } else {
    // The first call runs the op the user called, whose result shows what CPU returns: an out=
    // kernel accepts any dtype it can cast to (pow(bool, True) into the int64 the meta kernel
    // predicts), so it cannot show a wrong prediction.
    if (mode == OpKernel::Mode::kOut) k->set_mode(OpKernel::Mode::kFunctionalCopy);
    run_first_call(a, std::move(k), *mr, dtype_key, q, d, results);
  }
}

}  // namespace

OpAnalysis& op_analysis(const c10::OperatorHandle& op) { return analysis_for(op); }

void run_fallback(OpAnalysis& a, c10::ArrayRef<c10::IValue> args, std::vector<c10::IValue>& results) {
  check_supported(a, args);
  const c10::DeviceIndex d = op_device(a, args);
  std::shared_ptr<const MetaResult> mr;
  switch (plan(a, args, results, d, mr)) {
    case Plan::kSync: return sync_path(a, args, results, d);
    case Plan::kDone: return;
    case Plan::kQueue: break;
  }
  if (allocate_outputs(a, args, *mr, d, results)) {
    launch(a, args, mr, d, results);
  } else {
    a.counters->view.fetch_add(1, std::memory_order_relaxed);
  }
}

void fill_aliased_returns(const OpAnalysis& a, c10::ArrayRef<c10::IValue> args, std::vector<c10::IValue>& results) {
  for (size_t r = 0; r < results.size() && r < a.ret_arg.size(); ++r)
    if (a.ret_arg[r] >= 0 && !a.ret_view[r]) results[r] = args[a.ret_arg[r]];
}

void neuron_fallback(const c10::OperatorHandle& op, c10::Stack* stack) {
  OpAnalysis& a = analysis_for(op);
  auto args = torch::jit::last(*stack, a.num_args);
  rt::RecycledScope<std::vector<c10::IValue>> scope;
  std::vector<c10::IValue>& results = scope.value;
  run_fallback(a, args, results);
  fill_aliased_returns(a, args, results);  // (copies: the arguments are dropped next)
  torch::jit::drop(*stack, a.num_args);
  for (auto& r : results) stack->push_back(std::move(r));
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&neuron_fallback>());
}

void register_direct_fallbacks() {
  // Structured ops reach a backend without kernels through generated
  // CompositeExplicitAutogradNonFunctional wrappers (empty output + out=
  // call + resize). Sending their functional and in-place forms straight to
  // the fallback halves the dispatches and lets it pick the out= kernel itself.
  static auto* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__,
                                        __LINE__);
  // The hottest ops take the fallback through unboxed entry points (fast_ops.cpp) instead.
  std::unordered_map<std::string, const FastOp*> fast;
  for (const FastOp& f : fast_ops())
    fast.emplace(std::string(f.name).substr(6) + (*f.overload_name ? std::string(".") + f.overload_name : ""), &f);
  std::unordered_set<std::string> routed;  // (an op may qualify twice: policy and schema)
  auto route = [&](const std::string& op) {
    if (!routed.insert(op).second) return;
    auto it = fast.find(op);
    if (it == fast.end()) {
      lib->impl(op.c_str(), torch::CppFunction::makeFromBoxedFunction<&neuron_fallback>());
    } else {
      it->second->register_impl(*lib, op.c_str());
      fast.erase(it);
    }
  };
  // Composite kernels that would call CPU dispatch stubs on neuron tensors.
  for (const FallbackPolicy& p : fallback_policies())
    if (p.flags & kRouteDirect) route(std::string(p.op).substr(6));
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const auto& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto h = dispatcher.findSchema(name);
    if (!h || h->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) continue;
    // Also CompositeExplicitAutograd ops that CPU overrides with a kernel of
    // its own (native_layer_norm, native_group_norm, addr, ...): the
    // composite's decomposition rounds differently in reduced precision;
    // the CPU kernel on device memory matches CPU bit for bit.
    // (mish_backward: CompositeImplicitAutograd, as CUDA has its own kernel.)
    const bool cpu_overrides_composite =
        (h->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
         h->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) &&
        h->hasKernelForDispatchKey(c10::DispatchKey::CPU);
    if (!h->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) &&
        !cpu_overrides_composite)
      continue;
    const std::string full = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
    route(full);
  }
  // Fast ops with only backend kernels reach the fallback anyway: the entry point changes nothing else.
  for (const auto& [op, f] : fast) {
    auto h = dispatcher.findSchema({f->name, f->overload_name});
    if (!h || h->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) ||
        h->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) ||
        h->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
        h->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional))
      continue;
    f->register_impl(*lib, op.c_str());
  }
}

}  // namespace neuronx
