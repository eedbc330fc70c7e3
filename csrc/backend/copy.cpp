// Copies between host and device and between devices, ordered on streams.
//
// host -> device: pinned + non_blocking is asynchronous (the task keeps the
//   source alive); otherwise the copy is enqueued and waited for, as CUDA
//   does for pageable memory.
// device -> host: waits for the stream unless the destination is pinned and
//   non_blocking (then the user synchronizes, as on CUDA).
// device -> device: enqueued; across devices the two streams are ordered with
//   events in both directions.
#include "backend/copy.h"

#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/ops/copy.h>

#include "backend/allocator.h"
#include "backend/common.h"
#include "backend/metrics.h"
#include "backend/seen_values.h"
#include "backend/tensor_views.h"

namespace neuronx {

namespace {

OpCounters& copy_counters() {
  static OpCounters& c = op_counters("aten::_copy_from");
  return c;
}

// A copy between CPU views (of device buffers or host memory): it knows what it touches.
class CopyKernel final : public rt::Kernel {
 public:
  CopyKernel(const char* name, at::Tensor dst, at::Tensor src) : name_(name), dst_(std::move(dst)), src_(std::move(src)) {}
  void run() override {
    at::AutoDispatchBelowADInplaceOrView below;
    try {
      dst_.copy_(src_);
    } catch (const c10::Error& e) {
      throw rt::KernelError(e.what_without_backtrace(), static_cast<int>(kernel_error_kind(e)));
    }
  }
  const char* name() const override { return name_; }
  bool may_touch(const void* p, size_t n) const override { return overlaps(dst_, p, n) || overlaps(src_, p, n); }

 private:
  static bool overlaps(const at::Tensor& t, const void* p, size_t n) {
    const char* s = static_cast<const char*>(t.storage().data());
    const char* q = static_cast<const char*>(p);
    return q < s + t.storage().nbytes() && s < q + n;
  }
  const char* name_;
  at::Tensor dst_, src_;
};

std::unique_ptr<rt::Kernel> copy_kernel(const char* name, at::Tensor dst, at::Tensor src) {
  return std::make_unique<CopyKernel>(name, std::move(dst), std::move(src));
}

}  // namespace

at::Tensor copy_from(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(src.defined() && dst.defined(), "copy_: both tensors must be defined");
  copy_counters().native.fetch_add(1, std::memory_order_relaxed);
  // Shapes are checked here, at the call, as CPU and CUDA check them (the copy itself runs later,
  // and an empty destination copies nothing but still needs a source that broadcasts to it).
  if (dst.sizes() != src.sizes()) {
    const auto shape = at::infer_size_dimvector(dst.sizes(), src.sizes());
    TORCH_CHECK(c10::IntArrayRef(shape) == dst.sizes(), "output with shape ", dst.sizes(),
                " doesn't match the broadcast shape ", c10::IntArrayRef(shape));
  }
  if (dst.numel() == 0) return dst;
  const bool src_dev = src.device().type() == kNeuron;
  const bool dst_dev = dst.device().type() == kNeuron;
  TORCH_CHECK((src_dev || src.is_cpu()) && (dst_dev || dst.is_cpu()), "copy_ between ", src.device(), " and ",
              dst.device(), " is not supported; copy through CPU");

  if (src_dev && dst_dev) {
    const c10::DeviceIndex ds = src.device().index(), dd = dst.device().index();
    rt::Queue& qd = current_queue(dd);
    if (ds == dd) {
      if (dst.is_same(src)) return dst;
      // The same checks CPU makes at the call (the kernel runs later).
      at::assert_no_internal_overlap(dst);
      at::assert_no_partial_overlap(dst, src);
      note_device_copy(dst, src);
      AliasSet aliases(&qd);
      at::Tensor d_alias = aliases.cpu(dst), s_alias = aliases.cpu(src);
      translate([&] { qd.launch(copy_kernel("neuron::copy_d2d", std::move(d_alias), std::move(s_alias))); });
      return dst;
    }
    rt::Queue& qs = current_queue(ds);
    translate([&] {
      auto ready = rt::Event::create(false);
      ready->record(qs);
      ready->block(qd);
      qd.launch(copy_kernel("neuron::copy_p2p", cpu_alias(dst), cpu_alias(src)));
      auto done = rt::Event::create(false);
      done->record(qd);
      done->block(qs);
    });
    return dst;
  }

  if (dst_dev) {  // host -> device
    rt::Queue& q = current_queue(dst.device().index());
    const bool async = non_blocking && is_pinned_ptr(src.storage().data_ptr().get());
    note_host_copy(dst, src);
    translate([&] {
      q.launch(copy_kernel("neuron::copy_h2d", cpu_alias(dst, false, &q), src));
      if (!async) {
        count_sync(SyncReason::kBlockingCopy);
        q.synchronize();
      }
    });
    return dst;
  }

  // device -> host
  rt::Queue& q = current_queue(src.device().index());
  const bool async = non_blocking && is_pinned_ptr(dst.storage().data_ptr().get());
  translate([&] {
    q.launch(copy_kernel("neuron::copy_d2h", dst, cpu_alias(src, false, &q)));
    if (!async) {
      count_sync(SyncReason::kCopyToHost);
      q.synchronize();
    }
  });
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& src, const at::Tensor& dst) {
  if (dst.sizes() != src.sizes()) dst.resize_(src.sizes());
  return copy_from(src, dst, false);
}

}  // namespace neuronx
