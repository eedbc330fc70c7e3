// OpKernel: an ATen op queued on a stream, run as its CPU kernel on CPU
// aliases of the device buffers (see fallback.cpp for how it is planned).
#include "backend/op_kernel.h"

#include <ATen/core/LegacyTypeDispatch.h>

#include "backend/launch_checks.h"
#include "backend/tensor_views.h"

namespace neuronx {

namespace {
const c10::DispatchKeySet kCPUKeys(c10::DispatchKey::CPU);
}  // namespace

std::atomic<bool> OpKernel::track_liveness_{false};

void OpKernel::set_track_output_liveness(bool on) { track_liveness_.store(on); }

bool OpKernel::may_touch(const void* p, size_t n) const {
  if (deferred_.empty() && !args_.empty()) return true;  // (materialized: ran, or runs inline)
  const char* q = static_cast<const char*>(p);
  for (const Deferred& d : deferred_) {
    const char* s = static_cast<const char*>(d.snapshot.base);
    if (q < s + d.snapshot.nbytes && s < q + n) return true;
  }
  return false;
}

void OpKernel::run() {
  // The aliases were made on this thread: destroy them here too, whatever happens.
  struct Release {
    OpKernel* k;
    ~Release() {
      k->args_.clear();
      k->outs_.clear();
      recycle_aliases(k->made_);  // (the op may have dropped them already: inputs of a functional op)
    }
  } release{this};
  try {
    execute();
  } catch (const c10::Error& e) {
    throw rt::KernelError(e.what_without_backtrace(), static_cast<int>(kernel_error_kind(e)));
  }
}

void OpKernel::materialize() {
  if (deferred_.empty()) return;
  AliasSet aliases;
  for (Deferred& d : deferred_) {
    at::Tensor alias = aliases.cpu(d.snapshot);
    made_.emplace_back(alias);
    c10::IValue& slot = d.arg >= 0 ? args_[d.arg] : outs_[-1 - d.arg];
    if (d.pos < 0) slot = std::move(alias);
    else slot.toList().set(d.pos, c10::IValue(std::move(alias)));
    if (d.snapshot.keep) keep_.push_back(std::move(d.snapshot.keep));
  }
  deferred_.clear();
}

void OpKernel::execute() {
  materialize();
  // Ours in place of the CPU kernel, writing `out` (fallback_policy.h), where it applies.
  auto device_kernel_ran = [&](c10::ArrayRef<c10::IValue> outs) {
    if (!op_->device_kernel || outs.empty()) return false;
    c10::SmallVector<at::Tensor, 2> ts;
    for (const c10::IValue& o : outs) {
      if (!o.isTensor()) return false;
      ts.push_back(o.toTensor());
    }
    if (!op_->device_kernel(ts, args_)) return false;
    op_->counters->device_kernel.fetch_add(1, std::memory_order_relaxed);
    return true;
  };
  at::AutoDispatchBelowADInplaceOrView below;
  switch (mode_) {
    case Mode::kDirect:
      if (!op_->ret_arg.empty() && op_->ret_arg[0] >= 0 && device_kernel_ran(args_[op_->ret_arg[0]])) return;
      op_->op.redispatchBoxed(kCPUKeys, &args_);
      return;
    case Mode::kOut: {
      if (device_kernel_ran(outs_)) return;
      c10::Stack s;
      s.reserve(args_.size() + outs_.size());
      size_t in = 0, out = 0;
      for (const auto& arg : op_->out_op->schema().arguments())
        s.push_back(arg.is_out() ? outs_[out++] : args_[in++]);
      // The user called the functional op: warnings of an out= attempt that is abandoned
      // (its resize warning above all) are not theirs; the functional run gives its own.
      HeldWarnings warnings;
      try {
        {
          c10::WarningUtils::WarningHandlerGuard guard(&warnings);
          op_->out_op->redispatchBoxed(kCPUKeys, &s);
        }
        warnings.replay();
        restore_restrided_outputs();
        return;
      } catch (const DeviceBufferNotResizable&) {
        // Some out= kernels resize their output through an intermediate
        // shape; device buffers cannot grow inside a kernel. Use the
        // functional form (now and from now on) and copy the result, after
        // restoring the outputs' geometry (a failed resize may have changed it).
        if (!geometry_) throw;
        op_->out_form_resizes.store(true);
        for (size_t r = 0; r < outs_.size() && r < geometry_->returns.size(); ++r) {
          if (!outs_[r].isTensor() || !geometry_->returns[r] || geometry_->returns[r]->empty()) continue;
          const Geometry& g = (*geometry_->returns[r])[0];
          outs_[r].toTensor().unsafeGetTensorImpl()->set_sizes_and_strides(g.sizes, g.strides, g.offset);
        }
      } catch (...) {
        warnings.replay();  // the op's own error: its warnings came before it, as on CPU
        throw;
      }
      [[fallthrough]];
    }
    case Mode::kFunctionalCopy: {
      if (device_kernel_ran(outs_)) return;
      op_->op.redispatchBoxed(kCPUKeys, &args_);
      auto copy_out = [&](const at::Tensor& dst, const at::Tensor& src) {
        if (!dst.defined()) return;
        const bool other_layout = src.defined() && src.layout() == c10::kStrided &&
                                  !same_layout(dst.sizes(), dst.strides(), src.sizes(), src.strides());
        if (!src.defined() || dst.sizes() != src.sizes() || dst.scalar_type() != src.scalar_type() ||
            (validating_ && other_layout)) {
          // Only the layout or the dtype differs: this signature runs synchronously from now on
          // (and the op learns layouts on first calls); else the whole op.
          if (src.defined() && dst.sizes() == src.sizes() && geometry_) {
            geometry_->cpu_layout.store(true);
            if (dst.scalar_type() == src.scalar_type()) op_->layout_varies.store(true);
          } else {
            op_->sync_only.store(true);
          }
          throw MetaMismatch(op_->name + ": the meta kernel predicted an output of shape " +
                             c10::str(dst.sizes()) + " strides " + c10::str(dst.strides()) + " " +
                             c10::toString(dst.scalar_type()) + " but the kernel produced " +
                             (src.defined() ? c10::str(src.sizes()) + " strides " + c10::str(src.strides()) + " " +
                                                  c10::toString(src.scalar_type())
                                            : std::string("none")) +
                             "; it now runs synchronously",
                             src.defined() && dst.scalar_type() != src.scalar_type());
        }
        // A queued call whose layout the meta kernel got wrong (channels_last
        // in, contiguous predicted): the values are right; later calls run
        // synchronously and take the CPU kernel's layout.
        if (other_layout && geometry_) {
          geometry_->cpu_layout.store(true);
          op_->layout_varies.store(true);
        }
        dst.copy_(src);
      };
      for (size_t r = 0; r < outs_.size() && r < args_.size(); ++r) {
        if (outs_[r].isTensor()) {
          copy_out(outs_[r].toTensor(), args_[r].toTensor());
        } else if (outs_[r].isList()) {
          auto dst = outs_[r].toListRef();
          auto src = args_[r].toListRef();
          for (size_t i = 0; i < dst.size(); ++i)
            if (dst[i].isTensor()) copy_out(dst[i].toTensor(), src[i].toTensor());
        }
      }
      return;
    }
  }
}

// A structured out= kernel may restride a correctly sized out= argument to
// the layout it prefers (replication_pad2d keeps channels_last): it then
// wrote that layout into our buffer, which the device tensor reads with the
// meta kernel's strides. Put the values in the device tensor's layout, and
// from now on run this signature synchronously so its outputs take CPU's layout.
void OpKernel::restore_restrided_outputs() {
  if (!geometry_) return;
  for (size_t r = 0; r < outs_.size() && r < geometry_->returns.size(); ++r) {
    if (!outs_[r].isTensor() || !geometry_->returns[r] || geometry_->returns[r]->empty()) continue;
    at::Tensor out = outs_[r].toTensor();
    const Geometry& g = (*geometry_->returns[r])[0];
    if (same_layout(out.sizes(), out.strides(), g.sizes, g.strides) && out.storage_offset() == g.offset) continue;
    geometry_->cpu_layout.store(true);
    op_->layout_varies.store(true);
    if (validating_)  // inline: the caller adopts the layout the kernel chose
      throw MetaMismatch(op_->name + ": the out= kernel chose strides " + c10::str(out.strides()));
    at::Tensor written = out.clone();
    out.unsafeGetTensorImpl()->set_sizes_and_strides(g.sizes, g.strides, g.offset);
    out.copy_(written);
  }
}

}  // namespace neuronx
