#pragma once
// Tensors that alias device memory under another device type, and device
// tensors built from metadata. Kernels run ATen's CPU kernels zero-copy on
// "CPU aliases" of device buffers; output metadata comes from "meta twins".
#include <c10/util/SmallVector.h>

#include "backend/common.h"
#include "backend/small_index.h"

namespace neuronx {

// Sizes, strides, offset and dtype of a tensor: what an op's meta kernel
// decides about an output.
struct Geometry {
  c10::SmallVector<int64_t, 5> sizes, strides;
  int64_t offset = 0;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  bool conj = false, neg = false;
  bool defined = true;  // false: the op returned an undefined tensor here
  static Geometry of(const at::Tensor& t);
  void assign(const at::Tensor& t);  // *this = of(t), reusing this one's storage
};

// What a CPU alias of a neuron tensor is made from, captured when a kernel is queued, so the
// alias itself can be made (and destroyed) by the engine's thread when the kernel runs.
struct TensorSnapshot {
  const c10::TensorImpl* impl = nullptr;     // identities at capture: the same tensor twice, or
  const c10::StorageImpl* storage = nullptr;  // two views of one storage, share their alias
  void* base = nullptr;
  size_t nbytes = 0;
  Geometry geometry;
  bool wrapped = false;
  c10::Storage keep;  // the neuron storage, when the kernel's stream does not order its reuse
};

// Host-side stand-ins for the neuron operands of one kernel.
//
// cpu(t): a CPU tensor over the same bytes, sizes, strides and offset as the
// neuron tensor t. It snapshots t's metadata, so later host-side changes to t
// (resize_, set_, t_()) do not affect queued work. For a kernel queued on `stream`
// (the constructor's), an alias of a buffer allocated for that stream does not own
// the memory: the allocator's stream order keeps it valid until the kernel ran
// (runtime/caching_allocator.h). Any other alias keeps t's storage alive.
// meta(t): a meta tensor with t's metadata, for the op's meta kernel.
// Operands that share a neuron storage share one CPU (or meta) storage, so
// ATen's overlap checks and alias handling see what the device sees.
class AliasSet {
 public:
  explicit AliasSet(const rt::Queue* stream = nullptr) : stream_(stream) {}
  at::Tensor cpu(const at::Tensor& t, bool resizable = false);
  at::Tensor meta(const at::Tensor& t);
  // A CPU storage over the bytes of t's (neuron) storage, one per storage.
  c10::Storage cpu_storage(const at::Tensor& t, bool resizable = false);
  // cpu(t) in two steps: what to capture now (into s, in place), and the alias made from it later
  // (by an AliasSet without a stream: the snapshot already keeps what must be kept).
  void snapshot_into(const at::Tensor& t, TensorSnapshot& s) const;
  at::Tensor cpu(const TensorSnapshot& s);

 private:
  const rt::Queue* stream_;
  SmallIndex<const c10::StorageImpl*, c10::Storage> cpu_, meta_;
  // One alias per device tensor: an op given the same tensor twice (an
  // in-place op's self and out=) sees the same tensor twice, as on CPU
  // (TensorIterator's read-write and overlap checks compare impls).
  SmallIndex<const c10::TensorImpl*, at::Tensor> cpu_impls_;
};

// Raised when a kernel tries to grow a non-resizable CPU alias of a device buffer (an out=
// kernel resizing its output through an intermediate shape): callers recognise it by type.
class DeviceBufferNotResizable : public c10::Error {
 public:
  using c10::Error::Error;
};

// Clears a finished kernel's stack, keeping the CPU aliases (made by AliasSet::cpu(snapshot) on
// this thread) that nothing else references, for that function to reuse.
void recycle_aliases(c10::Stack& stack);

// A CPU alias of a single tensor (AliasSet(stream).cpu(t)).
at::Tensor cpu_alias(const at::Tensor& t, bool resizable = false, const rt::Queue* stream = nullptr);

// A neuron tensor that views base's storage with geometry g.
at::Tensor view_with_geometry(const at::Tensor& base, const Geometry& g);

// A new neuron tensor on device d with g's sizes, strides and dtype.
at::Tensor empty_with_geometry(const Geometry& g, c10::DeviceIndex d);

// Gives t (neuron) g's sizes/strides/offset, growing its storage if needed.
void adopt_geometry(const at::Tensor& t, const Geometry& g);

// Grows or shrinks a neuron storage; existing bytes are copied on the
// current stream and the old buffer lives until every queue is past it.
void resize_storage_bytes(c10::StorageImpl* storage, size_t nbytes);

}  // namespace neuronx
