#pragma once
// Helpers shared by the instruction executors (instructions.cpp, gpsimd.cpp).
#include <ATen/Functions.h>
#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "nki/fp8.h"
#include "nki/program.h"

namespace neuronx::nki {

inline at::Tensor f32(const at::Tensor& t) { return to_f32(t); }

// Writes result into dst (rounding to dst's dtype); a mask keeps dst where false.
// A destination dim of stride 0 writes one address repeatedly: the last value
// stays, as on hardware (kernels use such a dst when only a reduction matters).
inline void write(const Instruction& ins, const at::Tensor& dst, const at::Tensor& result) {
  at::Tensor d = dst;
  at::Tensor r = result.sizes() == dst.sizes() ? result : result.reshape(dst.sizes());
  std::optional<at::Tensor> mask = ins.mask;
  for (int64_t i = 0; i < d.dim(); ++i)
    if (d.stride(i) == 0 && d.size(i) > 1) {
      const int64_t last = d.size(i) - 1;
      d = d.narrow(i, 0, 1);
      r = r.narrow(i, last, 1);
      if (mask) mask = mask->narrow(i, last, 1);
    }
  // float to integer rounds to nearest, ties to even, as the engines do (a plain cast truncates)
  if (!c10::isFloatingType(d.scalar_type()) && d.scalar_type() != at::kBool && c10::isFloatingType(r.scalar_type()))
    r = at::round(r);
  if (mask) {
    // (on the bytes: ATen's where has no kernel for the e4m3 tiles' dtype)
    at::Tensor bits = d.scalar_type() == kNkiE4m3 ? d.view(at::kByte) : d;
    bits.copy_(at::where(*mask, to_dtype(r, d.scalar_type()).view(bits.scalar_type()), bits));
  } else {
    store(d, r);
  }
}

// A (P, 1)-style per-partition operand shaped to broadcast over t's free dims.
inline at::Tensor per_partition(const at::Tensor& s, const at::Tensor& t) {
  std::vector<int64_t> shape(t.dim(), 1);
  shape[0] = s.size(0);
  return f32(s).reshape(shape);
}

// The GpSimd Engine's selection instructions (gpsimd.cpp): max8, find_index8,
// match_replace8, gather, local_gather, stream_shuffle, sequence_bounds.
// False when the kind is not one of them.
bool execute_gpsimd(const Instruction& ins, const std::vector<at::Tensor>& v);
// The engines' random number generators (prng.cpp).
bool execute_prng(const Instruction& ins, const std::vector<at::Tensor>& v, RunState& state);
// The microscaling instructions (mx.cpp): quantize_mx, nc_matmul_mx.
bool execute_mx(const Instruction& ins, const std::vector<at::Tensor>& v);

}  // namespace neuronx::nki
