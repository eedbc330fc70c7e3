#pragma once
// Epilogue fusion onto library GEMMs and convolutions, through oneDNN's fused
// ops (shipped in ATen). GEMMs: a float32 `mm`/`addmm` becomes one call of
// oneDNN's linear (shipped in ATen, `mkldnn::_linear_pointwise`; a column-major
// left operand is copied row-major first): the bias is added by the matmul, and
// an activation (relu, gelu, silu, tanh, sigmoid) or a residual add that is the
// GEMM result's only consumer runs as the matmul's post-op, on the output tile
// while it is in cache. Applied where oneDNN beats ATen's BLAS call on this
// machine: GEMMs of 2^22 multiply-adds and more (1.4x there, 2-2.3x from 2^24).
// Convolutions (2-D, float32, not transposed) already run on oneDNN in ATen;
// one whose only consumer is such an activation or residual add becomes
// `mkldnn::_convolution_pointwise` with it as the post-op.
#include "compiler/graph.h"

namespace neuronx::compiler {

struct EpilogueStats {
  int gemms = 0;      // mm/addmm lowered to oneDNN's matmul
  int convolutions = 0;  // convolutions given their epilogue
  int epilogues = 0;     // pointwise consumers fused into GEMMs and convolutions
};

// Rewrites the graph in place; keeps value ids of everything used after the fused nodes.
EpilogueStats fuse_epilogues(Graph& g);

}  // namespace neuronx::compiler
