// The fused LSTM/GRU cells that nn.LSTM/nn.GRU call on accelerators
// (CUDA, XPU, PrivateUse1). ATen ships them for CUDA only; on neuron they are
// composed of device ops (each queued like any other op). The workspace
// layout is private to this file: forward and backward agree on it.
#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

#include "backend/common.h"

namespace neuronx {

namespace {

at::Tensor add_biases(at::Tensor gates, const std::optional<at::Tensor>& b) {
  return b.has_value() && b->defined() ? gates + *b : gates;
}

// workspace = [i, f, g, o] (activated gates)
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell(const at::Tensor& input_gates,
                                                         const at::Tensor& hidden_gates, const at::Tensor& cx,
                                                         const std::optional<at::Tensor>& input_bias,
                                                         const std::optional<at::Tensor>& hidden_bias) {
  at::Tensor gates = add_biases(add_biases(input_gates + hidden_gates, input_bias), hidden_bias);
  auto chunks = gates.chunk(4, 1);
  at::Tensor i = chunks[0].sigmoid(), f = chunks[1].sigmoid(), g = chunks[2].tanh(), o = chunks[3].sigmoid();
  at::Tensor cy = f * cx + i * g;
  at::Tensor hy = o * cy.tanh();
  return {hy, cy, at::cat({i, f, g, o}, 1)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell_backward(const std::optional<at::Tensor>& grad_hy,
                                                                  const std::optional<at::Tensor>& grad_cy,
                                                                  const at::Tensor& cx, const at::Tensor& cy,
                                                                  const at::Tensor& workspace, bool has_bias) {
  auto w = workspace.chunk(4, 1);
  const at::Tensor &i = w[0], &f = w[1], &g = w[2], &o = w[3];
  const at::Tensor tcy = cy.tanh();
  const bool has_ghy = grad_hy.has_value() && grad_hy->defined();
  const bool has_gcy = grad_cy.has_value() && grad_cy->defined();
  at::Tensor gcy = has_ghy ? *grad_hy * o * (1 - tcy * tcy) : at::zeros_like(cy);
  if (has_gcy) gcy = gcy + *grad_cy;
  at::Tensor go = has_ghy ? *grad_hy * tcy : at::zeros_like(o);
  at::Tensor grad_gates = at::cat({gcy * g * i * (1 - i), gcy * cx * f * (1 - f), gcy * i * (1 - g * g),
                                   go * o * (1 - o)},
                                  1);
  at::Tensor grad_cx = gcy * f;
  at::Tensor grad_bias = has_bias ? grad_gates.sum(0) : at::Tensor();
  return {grad_gates, grad_cx, grad_bias};
}

// workspace = [r, z, n, hx, hn] (hn: hidden part of the new gate, with bias)
std::tuple<at::Tensor, at::Tensor> gru_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                            const at::Tensor& hx, const std::optional<at::Tensor>& input_bias,
                                            const std::optional<at::Tensor>& hidden_bias) {
  auto ig = add_biases(input_gates, input_bias).chunk(3, 1);
  auto hg = add_biases(hidden_gates, hidden_bias).chunk(3, 1);
  at::Tensor r = (ig[0] + hg[0]).sigmoid();
  at::Tensor z = (ig[1] + hg[1]).sigmoid();
  at::Tensor n = (ig[2] + r * hg[2]).tanh();
  at::Tensor hy = n + z * (hx - n);
  return {hy, at::cat({r, z, n, hx, hg[2]}, 1)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  auto w = workspace.chunk(5, 1);
  const at::Tensor &r = w[0], &z = w[1], &n = w[2], &hx = w[3], &hn = w[4];
  at::Tensor grad_hx = grad_hy * z;
  at::Tensor gn = grad_hy * (1 - z) * (1 - n * n);  // through tanh
  at::Tensor gz = grad_hy * (hx - n) * z * (1 - z);
  at::Tensor gr = gn * hn * r * (1 - r);
  at::Tensor grad_input_gates = at::cat({gr, gz, gn}, 1);
  at::Tensor grad_hidden_gates = at::cat({gr, gz, gn * r}, 1);
  at::Tensor gib = has_bias ? grad_input_gates.sum(0) : at::Tensor();
  at::Tensor ghb = has_bias ? grad_hidden_gates.sum(0) : at::Tensor();
  return {grad_input_gates, grad_hidden_gates, grad_hx, gib, ghb};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", lstm_cell);
  m.impl("_thnn_fused_lstm_cell_backward_impl", lstm_cell_backward);
  m.impl("_thnn_fused_gru_cell", gru_cell);
  m.impl("_thnn_fused_gru_cell_backward", gru_cell_backward);
}

}  // namespace neuronx
