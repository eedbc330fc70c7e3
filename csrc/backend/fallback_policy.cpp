#include "backend/fallback_policy.h"

#include <unordered_map>

namespace neuronx {

namespace {

constexpr const char* kIndexOp = "advanced indexing: index tensors may stay on the host, as CUDA allows; shapes "
                                 "and host-written index values are checked at the op";
constexpr const char* kFloatShape = "the output's length comes from float scalars: the meta cache keys on "
                                    "their values, not only their types";
constexpr const char* kMetaDisagrees = "its meta kernel predicts other output shapes or strides than its CPU "
                                       "kernel gives for some inputs (found by the conformance sweep): always "
                                       "run synchronously and adopt the CPU kernel's outputs";

constexpr const char* kRandomArgs = "its CPU kernel checks its scalar arguments (a range, a probability, a scale) "
                                    "where the meta kernel does not: the check runs on the host at the op";

constexpr const char* kSameDraws = "a device kernel draws ATen's CPU kernel's mt19937 stream in blocks (the same "
                                   "values, checked once per process against the CPU kernel)";

const FallbackPolicy kPolicies[] = {
    {"aten::index", kHostIndices | kIndexGet, kIndexOp},
    {"aten::_unsafe_index", kHostIndices | kIndexGet, kIndexOp},
    {"aten::index_put", kHostIndices | kIndexPut, kIndexOp},
    {"aten::index_put_", kHostIndices | kIndexPut, kIndexOp},
    {"aten::_index_put_impl_", kHostIndices | kIndexPut, kIndexOp},
    {"aten::_unsafe_index_put", kHostIndices | kIndexPut, kIndexOp},
    {"aten::index_fill", kHostIndices, "CUDA accepts a host index tensor (test_sort_and_select uses one)"},
    {"aten::index_fill_", kHostIndices, "CUDA accepts a host index tensor (test_sort_and_select uses one)"},
    {"aten::fill_", kFill, "the host sees the value written: an index filled out of range raises at its use"},
    {"aten::arange", kFloatValuesShape, kFloatShape},
    {"aten::_dim_arange", kFloatValuesShape, kFloatShape},
    {"aten::range", kFloatValuesShape, kFloatShape},
    {"aten::linspace", kFloatValuesShape, kFloatShape},
    {"aten::logspace", kFloatValuesShape, kFloatShape},
    {"aten::histc", kFloatValuesShape, kFloatShape},
    {"aten::histogram", kFloatValuesShape, kFloatShape},
    {"aten::histogramdd", kFloatValuesShape, kFloatShape},
    {"aten::_histogramdd_bin_edges", kFloatValuesShape, kFloatShape},
    {"aten::_histogramdd_from_bin_cts", kFloatValuesShape, kFloatShape},
    {"aten::_histogramdd_from_bin_tensors", kFloatValuesShape, kFloatShape},
    {"aten::max_unpool2d", kSyncOnly, kMetaDisagrees},
    {"aten::max_unpool3d", kSyncOnly, kMetaDisagrees},
    {"aten::multilabel_margin_loss_forward", kSyncOnly, kMetaDisagrees},
    {"aten::_fft_c2r", kSyncOnly, kMetaDisagrees},
    {"aten::native_batch_norm", kEvalStatsEmpty,
     "in eval mode the CPU kernel returns empty save_mean/save_invstd where the meta kernel gives [C]"},
    {"aten::_native_batch_norm_legit", kEvalStatsEmpty,
     "in eval mode the CPU kernel returns empty save_mean/save_invstd where the meta kernel gives [C]"},
    {"aten::uniform_", kProbeScalars, kRandomArgs},
    {"aten::normal_", kProbeScalars, kRandomArgs},
    {"aten::random_", kProbeScalars, kRandomArgs},
    {"aten::exponential_", kProbeScalars, kRandomArgs},
    {"aten::geometric_", kProbeScalars, kRandomArgs},
    {"aten::bernoulli_", kProbeScalars, kRandomArgs},
    {"aten::bernoulli_.float", kDeviceKernel, kSameDraws, bernoulli_scalar_kernel},
    {"aten::bernoulli.p", kDeviceKernel, kSameDraws, bernoulli_scalar_kernel},
    {"aten::max_pool2d_with_indices", kDeviceKernel,
     "a device kernel for contiguous (N)CHW float inputs: ATen's NCHW kernel branches on every element's value "
     "(mispredicted half the time); the same values and indices, checked once per process against it",
     max_pool2d_kernel},
    {"aten::max_pool2d_with_indices_backward", kDeviceKernel,
     "a device kernel for disjoint windows (stride = kernel), (N)CHW or channels-last float: each gradient element "
     "written once from its window instead of a zero fill and a scatter; the same bits, checked once per process",
     max_pool2d_backward_kernel},
    {"aten::cauchy_", kProbeScalars, kRandomArgs},
    {"aten::log_normal_", kProbeScalars, kRandomArgs},
    {"aten::masked_scatter_", kMaskToSelf,
     "the CPU kernel expands the mask to self, which the meta kernel does not check: a mask that would grow "
     "self raises at the op"},
    {"aten::_copy_from", kHostCopy,
     "quantized tensors: the backend's half of copy_ (CPU has no kernel for it) is a copy between the host aliases"},
    {"aten::_copy_from_and_resize", kHostCopy | kHostCopyResize,
     "quantized tensors: as _copy_from, after resizing the destination to the source's sizes"},
    {"aten::conj_physical_", kRouteDirect,
     "its CompositeExplicitAutograd kernel calls a CPU dispatch stub on the neuron tensor"},
    {"aten::mode.values", kRouteDirect,
     "its CompositeExplicitAutograd kernel calls a CPU dispatch stub on the neuron tensors"},
};

const std::unordered_map<std::string, uint32_t>& by_name() {
  static const auto* m = [] {
    auto* r = new std::unordered_map<std::string, uint32_t>;
    for (const FallbackPolicy& p : kPolicies) (*r)[p.op] |= p.flags;
    return r;
  }();
  return *m;
}

}  // namespace

c10::ArrayRef<FallbackPolicy> fallback_policies() { return kPolicies; }

uint32_t policy_flags(const std::string& name, const std::string& overload) {
  const auto& m = by_name();
  uint32_t flags = 0;
  if (auto it = m.find(name); it != m.end()) flags |= it->second;
  if (!overload.empty())
    if (auto it = m.find(name + "." + overload); it != m.end()) flags |= it->second;
  return flags;
}

DeviceKernel device_kernel(const std::string& name, const std::string& overload) {
  static const auto* m = [] {
    auto* r = new std::unordered_map<std::string, DeviceKernel>;
    for (const FallbackPolicy& p : kPolicies)
      if (p.kernel) (*r)[p.op] = p.kernel;
    return r;
  }();
  auto it = m->find(overload.empty() ? name : name + "." + overload);
  return it == m->end() ? nullptr : it->second;
}

std::string policy_flag_names(uint32_t flags) {
  static const std::pair<PolicyFlag, const char*> kNames[] = {
      {kHostIndices, "host_indices"},   {kIndexGet, "index_get"},
      {kIndexPut, "index_put"},         {kFill, "fill"},
      {kFloatValuesShape, "float_values_shape"}, {kSyncOnly, "sync_only"},
      {kEvalStatsEmpty, "eval_stats_empty"},     {kRouteDirect, "route_direct"},
      {kProbeScalars, "probe_scalars"},          {kMaskToSelf, "mask_to_self"},
      {kHostCopy, "host_copy"},                  {kHostCopyResize, "host_copy_resize"},
      {kDeviceKernel, "device_kernel"},
  };
  std::string out;
  for (const auto& [f, n] : kNames)
    if (flags & f) out += (out.empty() ? "" : ",") + std::string(n);
  return out;
}

}  // namespace neuronx
