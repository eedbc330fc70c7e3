#include "backend/tensor_views.h"

#include <ATen/EmptyTensor.h>
#include <ATen/TensorUtils.h>
#include <c10/core/CPUAllocator.h>

#include <cstring>

#include "backend/allocator.h"
#include "backend/metrics.h"
#include "runtime/recycled.h"

namespace neuronx {

namespace {

void release_storage(void* p) { c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(p)); }

// The allocator of a non-resizable CPU alias: ATen's CPU resize asks the storage's allocator
// for the larger buffer, and this one answers with a typed error (the storage must report
// resizable for the request to reach it; shrinking never allocates).
struct FixedBufferAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    throw DeviceBufferNotResizable({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                                   "Trying to resize storage that is not resizable: a kernel asked to grow a neuron "
                                   "buffer to " + std::to_string(nbytes) + " bytes");
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
};

FixedBufferAllocator fixed_buffer_allocator;

// CPU aliases whose kernel ran, kept by the engine thread that made them: the next kernel's
// operands reuse their TensorImpl and StorageImpl (two allocations and their set-up per operand).
using AliasPool = rt::ThreadStash<at::Tensor, 64>;

void apply_flags(c10::TensorImpl* impl, const Geometry& g) {
  if (g.conj) impl->_set_conj(true);
  if (g.neg) impl->_set_neg(true);
}

void copy_flags(c10::TensorImpl* dst, const at::Tensor& src) {
  if (src.is_conj()) dst->_set_conj(true);
  if (src.is_neg()) dst->_set_neg(true);
}

}  // namespace

namespace {

at::Tensor make_alias(c10::Storage storage, const at::Tensor& t, c10::DispatchKey key) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(key), t.dtype());
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) impl->set_wrapped_number(true);
  copy_flags(impl.get(), t);
  return at::Tensor(std::move(impl));
}

}  // namespace

at::Tensor AliasSet::cpu(const at::Tensor& t, bool resizable) {
  if (!t.defined()) return t;
  if (const at::Tensor* alias = cpu_impls_.find(t.unsafeGetTensorImpl()))
    if (alias->sizes() == t.sizes() && alias->strides() == t.strides() &&
        alias->storage_offset() == t.storage_offset())
      return *alias;
  return cpu_impls_.put(t.unsafeGetTensorImpl(), make_alias(cpu_storage(t, resizable), t, c10::DispatchKey::CPU));
}

c10::Storage AliasSet::cpu_storage(const at::Tensor& t, bool resizable) {
  c10::StorageImpl* st = t.storage().unsafeGetStorageImpl();
  if (const c10::Storage* storage = cpu_.find(st)) return *storage;
  void* base = st->data_ptr().get();
  c10::DataPtr data;
  if (base && stream_ && allocation_stream(st->data_ptr()) == stream_) {
    data = c10::DataPtr(base, c10::Device(c10::kCPU));
  } else if (base) {
    c10::raw::intrusive_ptr::incref(st);
    data = c10::DataPtr(base, st, &release_storage, c10::Device(c10::kCPU));
  } else {
    data = c10::DataPtr(nullptr, c10::Device(c10::kCPU));  // zero-byte storage
  }
  c10::Storage storage(c10::Storage::use_byte_size_t(), st->nbytes(), std::move(data),
                       resizable ? c10::GetCPUAllocator() : &fixed_buffer_allocator, true);
  return cpu_.put(st, std::move(storage));
}

void AliasSet::snapshot_into(const at::Tensor& t, TensorSnapshot& s) const {
  c10::StorageImpl* st = t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  s.impl = t.unsafeGetTensorImpl();
  s.storage = st;
  s.base = st->data_ptr().get();
  s.nbytes = st->nbytes();
  s.geometry.assign(t);
  s.wrapped = s.impl->is_wrapped_number();
  if (s.base && !(stream_ && allocation_stream(st->data_ptr()) == stream_)) s.keep = t.storage();
}

at::Tensor AliasSet::cpu(const TensorSnapshot& s) {
  const Geometry& g = s.geometry;
  if (const at::Tensor* alias = cpu_impls_.find(s.impl))
    if (alias->sizes() == c10::IntArrayRef(g.sizes) && alias->strides() == c10::IntArrayRef(g.strides) &&
        alias->storage_offset() == g.offset)
      return *alias;
  const c10::Storage* storage = cpu_.find(s.storage);
  at::Tensor reused = AliasPool::take();  // an alias a finished kernel left (recycle_aliases)
  if (!storage) {
    // Not owning: the snapshot's `keep`, or stream order, keeps the memory until the kernel ran.
    c10::DataPtr data(s.base, c10::Device(c10::kCPU));
    if (reused.defined()) {
      c10::StorageImpl* st = reused.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
      st->set_data_ptr_noswap(std::move(data));
      st->set_nbytes(s.nbytes);
      storage = &cpu_.put(s.storage, reused.storage());
    } else {
      c10::Storage fresh(c10::Storage::use_byte_size_t(), s.nbytes, std::move(data), &fixed_buffer_allocator, true);
      storage = &cpu_.put(s.storage, std::move(fresh));
    }
  }
  const caffe2::TypeMeta dtype = c10::scalarTypeToTypeMeta(g.dtype);
  count_alias(reused.defined());
  at::Tensor alias;
  if (reused.defined()) {
    c10::TensorImpl* impl = reused.unsafeGetTensorImpl();
    impl->set_storage_and_dtype(*storage, dtype);
    if (impl->is_wrapped_number()) impl->set_wrapped_number(false);
    impl->_set_conj(false);
    impl->_set_neg(false);
    alias = std::move(reused);
  } else {
    alias = at::Tensor(c10::make_intrusive<c10::TensorImpl>(
        c10::Storage(*storage), c10::DispatchKeySet(c10::DispatchKey::CPU), dtype));
  }
  c10::TensorImpl* impl = alias.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(g.sizes, g.strides, g.offset);
  if (s.wrapped) impl->set_wrapped_number(true);
  apply_flags(impl, g);
  return cpu_impls_.put(s.impl, std::move(alias));
}

void recycle_aliases(c10::Stack& stack) {
  for (c10::IValue& v : stack) {
    if (!v.isTensor()) continue;
    const at::Tensor& t = v.toTensor();
    const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    // Only our aliases, referenced from here alone, whose storage is theirs alone.
    if (!t.defined() || t.use_count() != 1 || t.weak_use_count() != 1 || impl->device_type() != c10::kCPU ||
        impl->autograd_meta() || impl->has_symbolic_sizes_strides() || !impl->has_storage())
      continue;
    const c10::Storage& st = impl->storage();
    if (st.use_count() != 1 || st.allocator() != &fixed_buffer_allocator || !st.resizable() ||
        st.data_ptr().get_context() != nullptr)
      continue;
    AliasPool::keep(std::move(v).toTensor());
  }
  stack.clear();
}

at::Tensor AliasSet::meta(const at::Tensor& t) {
  if (!t.defined()) return t;
  const c10::StorageImpl* st = t.storage().unsafeGetStorageImpl();
  if (const c10::Storage* storage = meta_.find(st)) return make_alias(*storage, t, c10::DispatchKey::Meta);
  c10::Storage storage(c10::Storage::use_byte_size_t(), t.storage().nbytes(),
                       c10::DataPtr(nullptr, c10::Device(c10::kMeta)), c10::GetAllocator(c10::kMeta), true);
  meta_.put(st, storage);
  return make_alias(std::move(storage), t, c10::DispatchKey::Meta);
}

at::Tensor cpu_alias(const at::Tensor& t, bool resizable, const rt::Queue* stream) {
  return AliasSet(stream).cpu(t, resizable);
}

Geometry Geometry::of(const at::Tensor& t) {
  Geometry g;
  g.assign(t);
  return g;
}

void Geometry::assign(const at::Tensor& t) {
  defined = t.defined();
  if (!defined) {
    sizes.clear();
    strides.clear();
    offset = 0;
    dtype = c10::ScalarType::Undefined;
    conj = neg = false;
    return;
  }
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  sizes.assign(impl->sizes().begin(), impl->sizes().end());
  strides.assign(impl->strides().begin(), impl->strides().end());
  offset = impl->storage_offset();
  dtype = c10::typeMetaToScalarType(impl->dtype());
  conj = impl->is_conj();
  neg = impl->is_neg();
}


at::Tensor view_with_geometry(const at::Tensor& base, const Geometry& g) {
  if (!g.defined) return at::Tensor();
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(base.storage()),
                                                   base.key_set(), c10::scalarTypeToTypeMeta(g.dtype));
  impl->set_sizes_and_strides(g.sizes, g.strides, g.offset);
  apply_flags(impl.get(), g);
  return at::Tensor(std::move(impl));
}

at::Tensor empty_with_geometry(const Geometry& g, c10::DeviceIndex d) {
  if (!g.defined) return at::Tensor();
  // empty_strided's work, allocating on d directly (no device guard around it: this is every op's output)
  const caffe2::TypeMeta dtype = c10::scalarTypeToTypeMeta(g.dtype);
  const size_t nbytes = at::detail::computeStorageNbytes(g.sizes, g.strides, dtype.itemsize());
  auto storage = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                       allocate_on(nbytes, d), device_allocator(), true);
  auto t = at::detail::make_tensor_base<c10::TensorImpl>(std::move(storage),
                                                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype);
  t.unsafeGetTensorImpl()->set_sizes_and_strides(g.sizes, g.strides);
  apply_flags(t.unsafeGetTensorImpl(), g);
  return at::Tensor(std::move(t));
}

void adopt_geometry(const at::Tensor& t, const Geometry& g) {
  if (t.sizes() == c10::IntArrayRef(g.sizes) && t.strides() == c10::IntArrayRef(g.strides) &&
      t.storage_offset() == g.offset)
    return;
  const size_t needed = at::detail::computeStorageNbytes(g.sizes, g.strides, t.dtype().itemsize(), g.offset);
  c10::StorageImpl* st = t.storage().unsafeGetStorageImpl();
  if (needed > st->nbytes()) resize_storage_bytes(st, needed);
  t.unsafeGetTensorImpl()->set_sizes_and_strides(g.sizes, g.strides, g.offset);
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
