// torch.autocast("neuron"): AutocastPrivateUse1 kernels with CUDA's policies,
// from ATen's shared op lists (lower-precision matmul/conv/attention, fp32
// reductions/norms/losses, widest-type promotion), so a model autocasts on
// neuron exactly as it does on CUDA. The default dtype is bfloat16 (the
// device's native reduced precision); float16 works too.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

#include "backend/registration.h"
#include "backend/common.h"

namespace neuronx {

namespace {

using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

#define ADD_NS(RAW_OP) at::RAW_OP
#define NEURON_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define NEURON_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define NEURON_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define NEURON_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

// As on CUDA: binary_cross_entropy is unsafe in reduced precision.
Tensor binary_cross_entropy_banned(const Tensor&, const Tensor&, const std::optional<Tensor>&, int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
              "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
              "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
              "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
              "safe to autocast.");
}

}  // namespace

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(NEURON_LOWER_PRECISION_FP)
  AT_FORALL_FP32(NEURON_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(NEURON_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(NEURON_PROMOTE)
  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"), TORCH_FN((&binary_cross_entropy_banned)));
}

void init_autocast_dtype() {
  // PyTorch keeps the autocast dtype per thread, starting from float16 for
  // PrivateUse1. The importing thread (where `import torch` runs) starts from
  // bfloat16; other threads keep PyTorch's default unless they set one.
  at::autocast::set_autocast_dtype(c10::DeviceType::PrivateUse1, at::kBFloat16);
}

}  // namespace neuronx
