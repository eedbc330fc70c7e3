#include "nki/fp8.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <limits>

namespace neuronx::nki {

namespace {

// e4m3 and e4m3fn share every bit pattern below exponent 15; there e4m3 has ±infinity (mantissa 0)
// and NaN, where e4m3fn has 256..448 and one NaN.
at::Tensor decode_e4m3(const at::Tensor& bits) {
  at::Tensor b = bits.view(at::kByte);
  at::Tensor v = b.view(at::kFloat8_e4m3fn).to(at::kFloat);
  at::Tensor top = b.bitwise_and(0x78).eq(0x78);
  at::Tensor inf = at::where(b.bitwise_and(0x80).ne(0), -std::numeric_limits<float>::infinity(),
                             std::numeric_limits<float>::infinity());
  at::Tensor special = at::where(b.bitwise_and(7).eq(0), inf, std::numeric_limits<float>::quiet_NaN());
  return at::where(top, special, v);
}

// Round to nearest even as e4m3fn does; from 248 (halfway from 240 to the next power of two) the
// value is infinity, NaN stays NaN.
at::Tensor encode_e4m3(const at::Tensor& x) {
  at::Tensor f = x.to(at::kFloat);
  at::Tensor b = f.to(at::kFloat8_e4m3fn).view(at::kByte);
  at::Tensor sign = at::where(f.signbit(), 0x80, 0).to(at::kByte);
  b = at::where(f.abs().ge(248.0), sign.bitwise_or(0x78), b);
  b = at::where(f.isnan(), at::full_like(b, 0x7F), b);
  return b.view(kNkiE4m3);
}

}  // namespace

at::Tensor to_f32(const at::Tensor& t) {
  if (t.scalar_type() == at::kFloat) return t;
  if (t.scalar_type() == kNkiE4m3) return decode_e4m3(t);
  return t.to(at::kFloat);
}

at::Tensor to_dtype(const at::Tensor& src, at::ScalarType dtype) {
  if (src.scalar_type() == dtype) return src;
  if (dtype == kNkiE4m3) return encode_e4m3(to_f32(src));
  if (src.scalar_type() == kNkiE4m3) return decode_e4m3(src).to(dtype);
  return src.to(dtype);
}

void store(const at::Tensor& dst, const at::Tensor& src) {
  if (src.scalar_type() == dst.scalar_type() || (dst.scalar_type() != kNkiE4m3 && src.scalar_type() != kNkiE4m3))
    dst.copy_(src);
  else
    dst.copy_(to_dtype(src, dst.scalar_type()));
}

}  // namespace neuronx::nki
