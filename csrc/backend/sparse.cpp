// Sparse tensors on neuron: ATen's SparseTensorImpl (COO, dispatch key
// SparsePrivateUse1) and SparseCsrTensorImpl (CSR/CSC/BSR/BSC, key
// SparseCsrPrivateUse1) whose index and value tensors are neuron tensors. The
// constructors and accessors are ATen's own, shared by every backend. Every
// other op that sees a sparse neuron operand runs synchronously on host copies
// of its operands and its results come back to the device: correct, not fast.
// Sparse here serves sparse embedding gradients, SparseAdam and conversions;
// dense ops are the device's work.
#include "backend/sparse.h"
#include "backend/registration.h"

#include "backend/host_kernels.h"
#include "backend/ivalue_map.h"
#include "backend/op_kernel.h"

#include <ATen/SparseCsrTensorImpl.h>
#include <ATen/SparseTensorImpl.h>
#include <ATen/ops/_sparse_compressed_tensor_unsafe.h>
#include <ATen/ops/ccol_indices_native.h>
#include <ATen/ops/col_indices_native.h>
#include <ATen/ops/crow_indices_native.h>
#include <ATen/ops/row_indices_native.h>
#include <ATen/ops/_coalesced_native.h>
#include <ATen/ops/_indices_native.h>
#include <ATen/ops/_nnz_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_native.h>
#include <ATen/ops/_values_native.h>
#include <ATen/ops/dense_dim_native.h>
#include <ATen/ops/indices_native.h>
#include <ATen/ops/is_coalesced_native.h>
#include <ATen/ops/sparse_dim_native.h>
#include <ATen/ops/values_native.h>
#include <torch/library.h>

namespace neuronx {

namespace {

at::SparseTensorImpl* sparse_impl(const at::Tensor& t) {
  return static_cast<at::SparseTensorImpl*>(t.unsafeGetTensorImpl());
}

at::Tensor sparse_with(const at::Tensor& like, const at::Tensor& indices, const at::Tensor& values,
                       c10::Device device) {
  return at::_sparse_coo_tensor_with_dims_and_tensors(like.sparse_dim(), like.dense_dim(), like.sizes(), indices,
                                                       values, like.options().device(device), like.is_coalesced());
}

bool is_compressed(const at::Tensor& t) {
  const auto l = t.layout();
  return l == c10::kSparseCsr || l == c10::kSparseCsc || l == c10::kSparseBsr || l == c10::kSparseBsc;
}

at::SparseCsrTensorImpl* compressed_impl(const at::Tensor& t) {
  return static_cast<at::SparseCsrTensorImpl*>(t.unsafeGetTensorImpl());
}

at::Tensor compressed_on(const at::Tensor& t, c10::Device device) {
  auto* impl = compressed_impl(t);
  return at::_sparse_compressed_tensor_unsafe(impl->compressed_indices().to(device),
                                              impl->plain_indices().to(device), impl->values().to(device),
                                              t.sizes(), t.options().device(device));
}

at::Tensor to_host(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kNeuron) return t;
  if (is_compressed(t)) return compressed_on(t, c10::Device(c10::kCPU));
  if (t.is_sparse()) {
    auto* impl = sparse_impl(t);
    return sparse_with(t, impl->indices().cpu(), impl->values().cpu(), c10::Device(c10::kCPU));
  }
  return t.cpu();
}

at::Tensor to_device(const at::Tensor& t, c10::DeviceIndex d) {
  if (!t.defined() || t.device().type() == kNeuron) return t;
  if (t.is_sparse() || is_compressed(t)) return sparse_to_device(t, d);
  return t.to(c10::Device(kNeuron, d));
}

// A boxed argument for the host call: tensors mapped by f, neuron devices
// (factory arguments) replaced by the host.
template <typename F>
c10::IValue to_host_argument(const c10::IValue& v, F&& f) {
  if (v.isDevice() && v.toDevice().type() == kNeuron) return c10::IValue(c10::Device(c10::kCPU));
  return map_tensors(v, std::forward<F>(f));
}

// Written neuron argument `dev` takes the host result `host`.
void write_back(const at::Tensor& dev, const at::Tensor& host) {
  if (!dev.defined() || dev.device().type() != kNeuron) return;
  if (is_compressed(dev)) {
    TORCH_CHECK(is_compressed(host), "neuron sparse fallback: a sparse argument was given a ", host.layout(),
                " result");
    auto* h = compressed_impl(host);
    compressed_impl(dev)->set_member_tensors(h->compressed_indices().to(dev.device()),
                                             h->plain_indices().to(dev.device()), h->values().to(dev.device()),
                                             host.sizes());
    return;
  }
  if (dev.is_sparse()) {
    TORCH_CHECK(host.is_sparse(), "neuron sparse fallback: a sparse argument was given a dense result");
    auto* impl = sparse_impl(dev);
    impl->resize_(host.sparse_dim(), host.dense_dim(), host.sizes());
    impl->set_indices_and_values_unsafe(sparse_impl(host)->indices().to(dev.device()),
                                        sparse_impl(host)->values().to(dev.device()));
    impl->set_coalesced(host.is_coalesced());
    return;
  }
  if (dev.sizes() != host.sizes()) dev.resize_(host.sizes());
  dev.copy_(host);
}

void sparse_fallback(const c10::OperatorHandle& op, c10::Stack* stack) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  auto args = torch::jit::last(*stack, n);
  std::vector<c10::IValue> originals(args.begin(), args.end());
  std::optional<c10::DeviceIndex> dev;
  c10::Stack host;
  host.reserve(n);
  for (const auto& v : originals) {
    host.push_back(to_host_argument(v, [&](const at::Tensor& t) {
      if (t.defined() && t.device().type() == kNeuron) dev = t.device().index();
      at::Tensor h = to_host(t);
      // Some sparse kernels decide what to compute from requires_grad (the
      // reduction's argmax for its backward): the host copy says the same.
      if (t.defined() && t.device().type() == kNeuron && t.requires_grad() && h.is_leaf()) h.requires_grad_(true);
      return h;
    }));
  }
  std::vector<c10::IValue> host_args(host.begin(), host.end());
  const c10::DeviceIndex d = dev.value_or(current_device());
  op.callBoxed(&host);
  for (size_t i = 0; i < n; ++i) {
    const auto* ai = schema.arguments()[i].alias_info();
    if (ai && ai->isWrite() && originals[i].isTensor()) write_back(originals[i].toTensor(), host_args[i].toTensor());
  }
  torch::jit::drop(*stack, n);
  for (size_t r = 0; r < host.size(); ++r) {
    // A return that aliases a written argument is that (device) argument.
    const int arg = aliased_argument(schema, r);
    if (arg >= 0 && schema.returns()[r].alias_info()->isWrite()) {
      stack->push_back(originals[arg]);
    } else {
      stack->push_back(map_tensors(host[r], [&](const at::Tensor& t) { return to_device(t, d); }));
    }
  }
}

}  // namespace

at::Tensor sparse_to_device(const at::Tensor& host, c10::DeviceIndex d) {
  const c10::Device device(kNeuron, d);
  if (is_compressed(host)) return compressed_on(host, device);
  auto* impl = sparse_impl(host);
  return sparse_with(host, impl->indices().to(device), impl->values().to(device), device);
}

TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  m.impl("_sparse_coo_tensor_with_dims_and_tensors", at::native::new_with_dims_and_tensor_sparse_symint);
  m.impl("_sparse_coo_tensor_with_dims", at::native::new_with_dims_sparse);
  m.impl("_indices", at::native::_indices_sparse);
  m.impl("_values", at::native::_values_sparse);
  m.impl("indices", at::native::indices_sparse);
  m.impl("values", at::native::values_sparse);
  m.impl("_nnz", at::native::_nnz_sparse);
  m.impl("sparse_dim", at::native::sparse_dim_sparse);
  m.impl("dense_dim", at::native::dense_dim_sparse);
  m.impl("is_coalesced", at::native::is_coalesced_sparse);
  m.impl("_coalesced_", at::native::_coalesced_sparse_);
}

TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) {
  m.impl("crow_indices", at::native::crow_indices_sparse_csr);
  m.impl("col_indices", at::native::col_indices_sparse_csr);
  m.impl("ccol_indices", at::native::ccol_indices_sparse_csr);
  m.impl("row_indices", at::native::row_indices_sparse_csr);
  m.impl("values", at::native::values_sparse_csr);
  m.impl("_nnz", at::native::_nnz_sparse_csr);
  m.impl("sparse_dim", at::native::sparse_dim_sparse_csr);
  m.impl("dense_dim", at::native::dense_dim_sparse_csr);
}

TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_fallback>());
}

void register_sparse_kernels() {
  // Where CPU has a sparse kernel, take it, through the host.
  using K = c10::DispatchKey;
  register_where_host_has_kernel<&sparse_fallback>(K::SparseCPU, K::SparsePrivateUse1);
  register_where_host_has_kernel<&sparse_fallback>(K::SparseCsrCPU, K::SparseCsrPrivateUse1);
}

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_fallback>());
}

}  // namespace neuronx
