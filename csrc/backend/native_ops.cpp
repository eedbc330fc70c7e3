// Ops with neuron kernels of their own: allocation, views and storage
// manipulation (metadata only, no kernel), host reads, copies, and the few
// ops whose CPU kernel would draw from the CPU generator.
#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <torch/library.h>

#include "backend/allocator.h"
#include "backend/copy.h"
#include "backend/metrics.h"
#include "backend/tensor_views.h"

namespace neuronx {

namespace {

c10::DeviceIndex device_or_current(std::optional<c10::Device> d) {
  if (!d || !d->has_index()) return current_device();
  TORCH_CHECK(d->type() == kNeuron, "expected a neuron device, got ", *d);
  return d->index();
}

void check_options(std::optional<c10::Layout> layout, std::optional<bool> pin_memory,
                   std::optional<c10::ScalarType> dtype) {
  TORCH_CHECK_NOT_IMPLEMENTED(!dtype || !c10::isQIntType(*dtype), "quantized dtype ", *dtype,
                              " is not supported on neuron yet: quantized tensors stay on CPU");
  TORCH_CHECK_NOT_IMPLEMENTED(c10::layout_or_default(layout) == c10::Layout::Strided, "layout ",
                              c10::layout_or_default(layout),
                              " is not supported on neuron yet: only strided (dense) tensors");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory),
              "pin_memory=True only applies to CPU tensors (pinned host memory), not neuron tensors");
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> mf) {
  check_options(layout, pin_memory, dtype);
  const c10::DeviceIndex d = device_or_current(device);
  c10::DeviceGuard g(c10::Device(kNeuron, d));
  return at::detail::empty_generic(size, device_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), mf);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  check_options(layout, pin_memory, dtype);
  const c10::DeviceIndex d = device_or_current(device);
  c10::DeviceGuard g(c10::Device(kNeuron, d));
  return at::detail::empty_strided_generic(size, stride, device_allocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

at::Tensor& set_storage(at::Tensor& self, at::Storage source, int64_t offset, c10::IntArrayRef size,
                        c10::IntArrayRef stride) {
  TORCH_CHECK(!source.data_ptr().get() || source.device().type() == kNeuron,
              "set_: expected a neuron storage, got one on ", source.device());
  at::native::checkSetStorage(self, source, offset, size, stride);
  self.unsafeGetTensorImpl()->set_storage_offset(offset);
  auto* impl = self.unsafeGetTensorImpl();
  if (!impl->storage().is_alias_of(source)) impl->set_storage_keep_dtype(std::move(source));
  c10::DimVector strides;
  if (stride.empty()) {
    strides = c10::contiguous_strides(size);
    stride = strides;
  }
  const size_t needed = at::detail::computeStorageNbytes(size, stride, self.dtype().itemsize(), offset);
  if (needed > impl->storage().nbytes()) resize_storage_bytes(impl->storage().unsafeGetStorageImpl(), needed);
  impl->set_sizes_and_strides(size, stride, offset);
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, at::Storage source) {
  const int64_t n = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage(self, std::move(source), 0, {n}, {});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& src) {
  return set_storage(self, src.storage(), src.storage_offset(), src.sizes(), src.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, device_allocator(), /*resizable=*/true);
  return set_storage(self, std::move(storage), 0, {0}, {});
}

// Like ATen's CPU resize_, but storage growth goes through
// resize_storage_bytes: the old bytes are copied on the stream (after queued
// writes) and the old buffer outlives the kernels still using it.
const at::Tensor& resize(const at::Tensor& self, c10::IntArrayRef size, std::optional<c10::MemoryFormat> mf) {
  for (int64_t s : size) TORCH_CHECK(s >= 0, "Trying to create tensor with negative dimension ", s, ": ", size);
  auto* impl = self.unsafeGetTensorImpl();
  // As on CPU: a resize to the current sizes keeps the strides, so out=
  // arguments that are strided views are written through, not restrided.
  if (impl->sizes() != size) impl->set_sizes_contiguous(size);
  if (impl->numel() > 0) {
    const size_t needed =
        at::detail::computeStorageNbytesContiguous(size, self.dtype().itemsize(), self.storage_offset());
    c10::StorageImpl* st = self.storage().unsafeGetStorageImpl();
    if (needed > st->nbytes()) resize_storage_bytes(st, needed);
  }
  if (mf) {
    TORCH_CHECK(*mf != c10::MemoryFormat::Preserve, "Unsupported memory format Preserve");
    impl->empty_tensor_restride(*mf);
  }
  return self;
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  static OpCounters& c = op_counters("aten::_local_scalar_dense");
  c.native.fetch_add(1, std::memory_order_relaxed);
  count_sync(SyncReason::kItem);
  rt::Queue& q = current_queue(self.device().index());
  translate([&] { q.synchronize(); });
  return at::native::_local_scalar_dense_cpu(cpu_alias(self));
}

// As on CUDA: once freed, the tensor's block is reused only after stream s has run
// the work queued on it by then.
void record_stream(at::Tensor& t, c10::Stream s) { record_stream_use(t.storage().data_ptr(), s); }

// Same algorithm as ATen's CPU native_dropout, but drawing the mask from the
// neuron generator (the CPU kernel would use the CPU default generator).
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  if (input.numel() == 0) return {input, at::empty_like(input, input.options())};
  if (!train.has_value() || *train) {
    const double p1m = 1. - p;
    const double scale = p1m == 0 ? 0. : 1. / p1m;
    at::Tensor mask = at::empty_like(input, input.options().dtype(at::kBool));
    mask.bernoulli_(p1m);
    return {input.mul(mask).mul_(scale), mask};
  }
  return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
}

at::Tensor copy_from_op(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  return copy_from(self, dst, non_blocking);
}

}  // namespace

// `param.data = t` and Module.to() keep a parameter's identity only when
// the two tensors' impls are shallow-copy compatible; c10 lists only in-tree
// dense backends. Host and neuron strided tensors are, as CPU and CUDA are:
// without this, model.to("neuron") would replace every Parameter object
// (optimizers built earlier would hold stale ones) and lazy modules would lose
// their uninitialized parameters.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    const auto type = t.device().type();
    return t.layout() == c10::kStrided && !t.is_quantized() && !t.is_nested() &&
           (type == c10::kCPU || type == kNeuron);
  };
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set()) || (dense(self) && dense(from));
}

// ATen's addr_ is addr_out(self, self, ...), whose CPU kernel skips
// broadcasting self only when both references are the same object: a boxed
// call cannot pass that on, so the in-place form's check is made here.
at::Tensor& addr_(at::Tensor& self, const at::Tensor& vec1, const at::Tensor& vec2, const c10::Scalar& beta,
                  const c10::Scalar& alpha) {
  TORCH_CHECK(vec1.dim() == 1 && vec2.dim() == 1 && self.dim() == 2, "2D tensor expected, got ", self.dim(),
              "D tensor for input");
  return at::addr_out(self, self, vec1, vec2, beta, alpha);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
  m.impl("addr_", addr_);
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("unfold", at::native::unfold);
  m.impl("resize_", resize);
  m.impl("set_.source_Storage_storage_offset", set_storage);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_.source_Tensor", set_source_tensor);
  m.impl("set_", set_empty);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("_copy_from", copy_from_op);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("record_stream", record_stream);
  m.impl("native_dropout", native_dropout);
}

}  // namespace neuronx

namespace neuronx {
// Copies carry conj/neg bits into the CPU kernel (the CPU aliases keep them),
// so _copy_from must not be materialized by the Conjugate/Negative fallbacks
// (which would call copy_ -> _copy_from again, forever).
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
}
}  // namespace neuronx

namespace neuronx {
namespace {
// Nested (strided) neuron tensors can come into existence through composite
// paths that never reach the neuron kernels; every op on them then lands
// here. (Sparse and quantized tensors are supported: sparse.cpp, quantized.cpp.)
[[noreturn]] void unsupported(const c10::OperatorHandle& op, const char* kind) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, op.schema().name(), ": ", kind,
                              " are not supported on neuron yet; keep them on CPU (only strided tensors run on "
                              "neuron)");
}
void nested_unsupported(const c10::OperatorHandle& op, c10::Stack*) { unsupported(op, "nested tensors"); }
}  // namespace

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&nested_unsupported>());
}
}  // namespace neuronx
