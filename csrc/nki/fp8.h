#pragma once
// nl.float8_e4m3 is OCP e4m3 with infinities (largest finite 240), a format ATen has no dtype for.
// Its tiles and HBM tensors are float8_e4m3fnuz tensors holding e4m3 bits; every conversion from
// or to a tile goes through to_f32 / store, which know the encoding.
#include <ATen/core/Tensor.h>

namespace neuronx::nki {

constexpr at::ScalarType kNkiE4m3 = at::kFloat8_e4m3fnuz;

// A tile's values as fp32 (the engines compute in fp32).
at::Tensor to_f32(const at::Tensor& t);
// src's values rounded to t's dtype: a tensor of that dtype (e4m3: overflow to infinity).
at::Tensor to_dtype(const at::Tensor& src, at::ScalarType dtype);
// dst = src's values, rounded to dst's dtype (a bit copy when the dtypes agree).
void store(const at::Tensor& dst, const at::Tensor& src);

}  // namespace neuronx::nki
