#pragma once
// Tensors that alias device memory under another device type, and device
// tensors built from metadata. Kernels run ATen's CPU kernels zero-copy on
// "CPU aliases" of device buffers; output metadata comes from "meta twins".
#include "backend/common.h"

namespace neuronx {

// A CPU tensor over the same bytes, sizes, strides and offset as the neuron
// tensor t. It keeps t's storage alive and snapshots t's metadata, so later
// host-side changes to t (resize_, set_, t_()) do not affect queued work.
at::Tensor cpu_alias(const at::Tensor& t, bool resizable = false);

// A meta tensor with t's metadata (storage size, offset, dtype, conj/neg and
// wrapped-number flags) for computing an op's output metadata.
at::Tensor meta_twin(const at::Tensor& t);

// A neuron tensor that views base's storage with m's geometry and dtype.
at::Tensor view_with_geometry(const at::Tensor& base, const at::Tensor& m);

// A new neuron tensor on device d with m's sizes, strides and dtype.
at::Tensor empty_like_meta(const at::Tensor& m, c10::DeviceIndex d);

// Gives t (neuron) m's sizes/strides/offset, growing its storage if needed.
void adopt_geometry(const at::Tensor& t, const at::Tensor& m);

// Grows or shrinks a neuron storage; existing bytes are copied on the
// current stream and the old buffer lives until every queue is past it.
void resize_storage_bytes(c10::StorageImpl* storage, size_t nbytes);

}  // namespace neuronx
