// scaled_dot_product_attention on neuron.
//
// SDPA picks a fused kernel per backend with _fused_sdp_choice; a PrivateUse1
// backend gets the math path (which materializes the T x T attention matrix)
// unless it answers "overrideable" and implements the overrideable ops. The
// simulated NeuronCore runs ATen's CPU flash-attention kernel, so neuron takes
// exactly the choice CPU would make and maps CPU's flash kernel onto the
// overrideable ops (each queued like any other op).
#include <ATen/Context.h>
#include <ATen/SDPBackend.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "backend/common.h"
#include "backend/tensor_views.h"

namespace neuronx {

namespace {

int64_t fused_sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  // The choice reads only metadata (incl. requires_grad: a mask that needs a
  // gradient sends CPU to the math path): ask CPU's chooser about CPU views.
  auto view = [](const at::Tensor& t) {
    if (t.device().type() != kNeuron) return t;
    at::Tensor a;
    if (t.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
      // Tracing with symbolic sizes (torch.compile, dynamic shapes): a CPU stand-in of the same
      // rank and dtype; a symbolic size stands in as 2 (the choice reads ranks, dtypes, head sizes
      // and whether sizes agree, not sequence lengths; asking the symbol would specialize it).
      std::vector<int64_t> sizes;
      for (const auto& s : t.sym_sizes()) sizes.push_back(s.maybe_as_int().value_or(2));
      a = at::empty(sizes, t.options().device(c10::kCPU));
    } else {
      a = cpu_alias(t);
    }
    if (t.requires_grad()) a.requires_grad_(true);
    return a;
  };
  std::optional<at::Tensor> cpu_mask;
  if (mask.has_value() && mask->defined()) cpu_mask = view(*mask);
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("aten::_fused_sdp_choice", "")
                             .typed<decltype(at::_fused_sdp_choice)>();
  const int64_t cpu_choice = op.redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), view(q), view(k), view(v),
                                           cpu_mask, dropout_p, is_causal, scale, enable_gqa);
  if (cpu_choice == static_cast<int64_t>(at::SDPBackend::flash_attention) &&
      at::globalContext().userEnabledOverrideableSDP())
    return static_cast<int64_t>(at::SDPBackend::overrideable);
  return cpu_choice;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor, at::Tensor,
           at::Tensor>
fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const std::optional<at::Tensor>& attn_bias, double dropout_p, bool is_causal,
                bool return_debug_mask, std::optional<double> scale) {
  auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, attn_bias, scale);
  // As the op's meta kernel (and CUDA's flash kernel) says: no cumulative lengths or debug mask,
  // 0-d seed and offset (unused: CPU's flash kernel has no dropout state).
  const auto scalar = at::empty({}, q.options().dtype(at::kLong));
  return {out, lse, at::Tensor(), at::Tensor(), c10::SymInt(q.size(-2)), c10::SymInt(k.size(-2)), scalar,
          scalar.clone(), at::Tensor()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& attn_bias, std::array<bool, 4> grad_input_mask, const at::Tensor& out, const at::Tensor& lse,
    const at::Tensor&, const at::Tensor&, c10::SymInt, c10::SymInt, double dropout_p, bool is_causal,
    const at::Tensor&, const at::Tensor&, std::optional<double> scale) {
  // CPU's flash kernel computes no gradient for the mask, and CPU SDPA (which
  // picks that kernel for these inputs) leaves the mask's gradient None: so do we.
  std::optional<at::Tensor> mask;
  if (attn_bias.defined()) mask = attn_bias;
  auto [gq, gk, gv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(grad_out, q, k, v, out, lse,
                                                                               dropout_p, is_causal, mask, scale);
  return {gq, gk, gv, at::Tensor()};
}

}  // namespace

// scaled_dot_product_attention asks this stub (not the op) for the backend.
int64_t fused_sdp_choice_stub(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                              std::optional<double> scale, bool enable_gqa) {
  return fused_sdp_choice(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa);
}

}  // namespace neuronx

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &neuronx::fused_sdp_choice_stub)
}  // namespace at::native

namespace neuronx {

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_fused_sdp_choice", fused_sdp_choice);
  m.impl("_scaled_dot_product_fused_attention_overrideable", fused_attention);
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward", fused_attention_backward);
}

}  // namespace neuronx
