#include "backend/tensor_views.h"

#include <ATen/EmptyTensor.h>
#include <ATen/TensorUtils.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/CPUAllocator.h>

#include <cstring>

namespace neuronx {

namespace {

void release_storage(void* p) { c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(p)); }

void copy_flags(c10::TensorImpl* dst, const at::Tensor& src) {
  if (src.is_conj()) dst->_set_conj(true);
  if (src.is_neg()) dst->_set_neg(true);
}

}  // namespace

at::Tensor cpu_alias(const at::Tensor& t, bool resizable) {
  c10::StorageImpl* st = t.storage().unsafeGetStorageImpl();
  void* base = st->data_ptr().get();
  const auto opts = at::TensorOptions().dtype(t.dtype()).device(c10::kCPU);
  at::Tensor out;
  if (!base) {
    // Zero-byte storage: nothing to alias.
    out = at::empty_strided(t.sizes(), t.strides(), opts);
  } else {
    c10::raw::intrusive_ptr::incref(st);
    auto maker = at::for_blob(base, t.sizes());
    maker.strides(t.strides()).storage_offset(t.storage_offset()).context(st, &release_storage).options(opts);
    if (resizable) maker.resizeable_storage().allocator(c10::GetCPUAllocator());
    out = maker.make_tensor();
  }
  copy_flags(out.unsafeGetTensorImpl(), t);
  return out;
}

at::Tensor meta_twin(const at::Tensor& t) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), t.storage().nbytes(),
                       c10::DataPtr(nullptr, c10::Device(c10::kMeta)), c10::GetAllocator(c10::kMeta),
                       /*resizable=*/true);
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage),
                                                   c10::DispatchKeySet(c10::DispatchKey::Meta), t.dtype());
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) impl->set_wrapped_number(true);
  copy_flags(impl.get(), t);
  return at::Tensor(std::move(impl));
}

at::Tensor view_with_geometry(const at::Tensor& base, const at::Tensor& m) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(base.storage()),
                                                   base.key_set(), m.dtype());
  impl->set_sizes_and_strides(m.sizes(), m.strides(), m.storage_offset());
  copy_flags(impl.get(), m);
  return at::Tensor(std::move(impl));
}

at::Tensor empty_like_meta(const at::Tensor& m, c10::DeviceIndex d) {
  c10::DeviceGuard g(c10::Device(kNeuron, d));
  auto t = at::detail::empty_strided_generic(m.sizes(), m.strides(), device_allocator(),
                                             c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                             m.scalar_type());
  copy_flags(t.unsafeGetTensorImpl(), m);
  return t;
}

void adopt_geometry(const at::Tensor& t, const at::Tensor& m) {
  if (t.sizes() == m.sizes() && t.strides() == m.strides() && t.storage_offset() == m.storage_offset()) return;
  const size_t needed = at::detail::computeStorageNbytes(m.sizes(), m.strides(), m.dtype().itemsize(),
                                                         m.storage_offset());
  c10::StorageImpl* st = t.storage().unsafeGetStorageImpl();
  if (needed > st->nbytes()) resize_storage_bytes(st, needed);
  t.unsafeGetTensorImpl()->set_sizes_and_strides(m.sizes(), m.strides(), m.storage_offset());
}

void resize_storage_bytes(c10::StorageImpl* st, size_t nbytes) {
  TORCH_CHECK(st->resizable(), "Trying to resize storage that is not resizable");
  const c10::DeviceIndex d = st->device().index() >= 0 ? st->device().index() : current_device();
  c10::DeviceGuard g(c10::Device(kNeuron, d));
  c10::DataPtr fresh = device_allocator()->allocate(nbytes);
  const size_t keep = std::min(nbytes, st->nbytes());
  void* dst = fresh.get();
  auto old = std::make_shared<c10::DataPtr>(st->set_data_ptr(std::move(fresh)));
  st->set_nbytes(nbytes);
  if (!old->get()) return;
  rt::Device& dev = runtime_device(d);
  rt::Queue& q = current_queue(d);
  const void* src = old->get();
  q.launch(std::make_unique<rt::FunctionKernel>("neuron::resize_storage", [old, dst, src, keep] {
    if (keep) std::memcpy(dst, src, keep);
  }));
  // Work queued earlier on other streams may still read the old buffer:
  // it is released only after each of them has passed this point.
  for (rt::Queue* other : dev.live_queues())
    if (other != &q && !other->query())
      other->launch(std::make_unique<rt::FunctionKernel>("neuron::release", [old] {}));
}

}  // namespace neuronx
