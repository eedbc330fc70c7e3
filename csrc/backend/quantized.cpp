// Quantized tensors on neuron, as CUDA supports them for the ops that have
// quantized kernels: ATen's QTensorImpl (dispatch key QuantizedPrivateUse1)
// whose storage is device memory and whose quantizer is ATen's own.
//
// Every op that sees a quantized neuron operand (or makes one: quantize_*,
// _empty_affine_quantized with device="neuron") runs synchronously on the
// host, after the stream drains, on zero-copy host aliases of the device
// buffers: in-place ops and out= write the device memory directly, views of
// a device tensor come back as views of its storage (same data_ptr), and new
// results are moved to the device. Correct, not fast: the device's work is
// dense math, and quantized models here are loaded, inspected and converted.
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/quantized/QTensorImpl.h>
#include <ATen/quantized/Quantizer.h>
#include <torch/library.h>

#include <cstring>

#include "backend/fallback_policy.h"
#include "backend/registration.h"
#include "backend/host_kernels.h"
#include "backend/ivalue_map.h"
#include "backend/metrics.h"
#include "backend/op_kernel.h"
#include "backend/tensor_views.h"

namespace neuronx {

namespace {

bool on_neuron(const at::Tensor& t) { return t.defined() && t.device().type() == kNeuron; }

at::Tensor qtensor_with(c10::Storage storage, c10::DispatchKey key, const at::Tensor& like,
                        const at::QuantizerPtr& quantizer) {
  auto impl = c10::make_intrusive<at::QTensorImpl>(std::move(storage), c10::DispatchKeySet(key), like.dtype(),
                                                   quantizer);
  impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  return at::Tensor(std::move(impl));
}

// A quantized result computed on the host, as a new neuron tensor.
at::Tensor quantized_to_device(const at::Tensor& host, c10::DeviceIndex d) {
  const at::Tensor src = host.is_non_overlapping_and_dense() ? host : host.contiguous(host.suggest_memory_format());
  c10::DeviceGuard guard(c10::Device(kNeuron, d));
  const size_t nbytes = src.storage().nbytes();
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, device_allocator()->allocate(nbytes),
                       device_allocator(), true);
  if (nbytes) std::memcpy(storage.mutable_data(), src.storage().data(), nbytes);  // the stream is drained
  return qtensor_with(std::move(storage), c10::DispatchKey::QuantizedPrivateUse1, src,
                      at::get_qtensorimpl(src)->quantizer());
}

// The host stand-ins of one call's neuron operands, and the way back.
class HostCall {
 public:
  at::Tensor to_host(const at::Tensor& t) {
    if (!on_neuron(t)) return t;
    device_ = t.device().index();
    c10::Storage storage = aliases_.cpu_storage(t);
    storages_.put(storage.unsafeGetStorageImpl(), t.storage());
    if (t.is_quantized())
      return qtensor_with(std::move(storage), c10::DispatchKey::QuantizedCPU, t, at::get_qtensorimpl(t)->quantizer());
    return aliases_.cpu(t);
  }
  // Host results: views of a device operand's bytes become views of its
  // storage; anything new moves to the device, unless the op was asked for
  // the host (a CPU device argument: .cpu(), .to("cpu")).
  at::Tensor to_device(const at::Tensor& h) {
    if (!h.defined() || !h.is_cpu() || to_cpu_) return h;
    if (const c10::Storage* dev = storages_.find(h.storage().unsafeGetStorageImpl())) {
      if (h.is_quantized())
        return qtensor_with(*dev, c10::DispatchKey::QuantizedPrivateUse1, h, at::get_qtensorimpl(h)->quantizer());
      return view_with_geometry(neuron_like(*dev), Geometry::of(h));
    }
    if (h.is_quantized()) return quantized_to_device(h, device());
    return h.to(c10::Device(kNeuron, device()));
  }
  c10::IValue argument(const c10::IValue& v) {
    if (v.isDevice() && v.toDevice().type() == kNeuron) {
      device_ = v.toDevice().has_index() ? v.toDevice().index() : current_device();
      return c10::IValue(c10::Device(c10::kCPU));
    }
    if (v.isDevice() && v.toDevice().is_cpu()) to_cpu_ = true;
    return map_tensors(v, [&](const at::Tensor& t) { return to_host(t); });
  }
  c10::DeviceIndex device() const { return device_.value_or(current_device()); }

 private:
  static at::Tensor neuron_like(const c10::Storage& storage) {
    auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(storage),
                                                     c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                     caffe2::TypeMeta::Make<uint8_t>());
    return at::Tensor(std::move(impl));
  }
  AliasSet aliases_;
  SmallIndex<const c10::StorageImpl*, c10::Storage> storages_;
  std::optional<c10::DeviceIndex> device_;
  bool to_cpu_ = false;
};

void quantized_fallback(const c10::OperatorHandle& op, c10::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  op_counters(op.schema().operator_name().name + (op.schema().overload_name().empty() ? "" : "." + op.schema().overload_name()))
      .sync.fetch_add(1, std::memory_order_relaxed);
  HostCall call;
  auto args = torch::jit::last(*stack, n);
  c10::Stack host;
  host.reserve(n);
  for (const auto& v : args) host.push_back(call.argument(v));
  std::vector<c10::IValue> originals(args.begin(), args.end());
  count_sync(SyncReason::kDataDependent);
  rt::Queue& q = current_queue(call.device());
  translate([&] { q.synchronize(); });
  {
    at::AutoDispatchBelowADInplaceOrView below;
    const uint32_t policy = policy_flags(op.operator_name().name, op.operator_name().overload_name);
    if (policy & kHostCopy) {
      at::Tensor dst = host[1].toTensor();
      if ((policy & kHostCopyResize) && dst.sizes() != host[0].toTensor().sizes())
        dst.resize_(host[0].toTensor().sizes());
      dst.copy_(host[0].toTensor());
      host.resize(1);
      host[0] = dst;
    } else {
      op.callBoxed(&host);  // dispatched by the host operands: QuantizedCPU or CPU kernels
    }
  }
  torch::jit::drop(*stack, n);
  const auto& schema = op.schema();
  for (size_t r = 0; r < host.size(); ++r) {
    const int arg = aliased_argument(schema, r);
    if (arg >= 0 && schema.returns()[r].alias_info()->isWrite()) {
      stack->push_back(originals[arg]);  // in place / out=: the device tensor itself, written through
    } else {
      stack->push_back(map_tensors(host[r], [&](const at::Tensor& t) { return call.to_device(t); }));
    }
  }
}

}  // namespace

// Dense ops that make a quantized tensor from a neuron one.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char* name : {"quantize_per_tensor", "quantize_per_tensor.tensor_qparams", "quantize_per_tensor.tensors",
                           "quantize_per_channel", "_make_per_tensor_quantized_tensor",
                           "_make_per_channel_quantized_tensor"})
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&quantized_fallback>());
}

TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&quantized_fallback>());
}

void register_quantized_kernels() {
  // Where CPU has a quantized kernel, take it, on the host.
  register_where_host_has_kernel<&quantized_fallback>(c10::DispatchKey::QuantizedCPU,
                                                      c10::DispatchKey::QuantizedPrivateUse1);
}

}  // namespace neuronx
