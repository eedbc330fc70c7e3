// The NeuronCore-v4 microscaling (OCP MX) instructions: quantize_mx (Vector
// Engine) and nc_matmul_mx (Tensor Engine). MX data is packed four elements to
// a word (fp8: a 32-bit word, element j in byte j; fp4: a 16-bit word, element j
// in nibble j); scales are 8-bit exponents (value 2^(s-127)), one per group of
// 8 partitions x 4 elements, kept in the quadrant the group came from: the
// scale of data partition p is at scale partition 32*(p/32) + (p%32)/8.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <c10/util/Exception.h>

#include "nki/exec_util.h"

namespace neuronx::nki {

namespace {

enum Format : int64_t { kE4m3fn = 0, kE5m2 = 1, kE2m1 = 2 };

at::Tensor rows(const at::Tensor& t) { return t.reshape({t.size(0), -1}); }

int64_t scale_row(int64_t group) { return (group / 4) * 32 + group % 4; }

// The bytes of a tile of 8-bit scale exponents (uint8 or float8_e8m0fnu).
at::Tensor scale_bytes(const at::Tensor& t) { return t.scalar_type() == at::kByte ? t : t.view(at::kByte); }

// Packed words (P, W) -> their elements as fp32 (P, W, 4).
at::Tensor unpack(const at::Tensor& words, int64_t format) {
  const int64_t P = words.size(0), W = words.size(1);
  if (format == kE2m1) {
    at::Tensor w = words.contiguous().view(at::kShort).to(at::kInt).bitwise_and(0xFFFF);
    std::vector<at::Tensor> nib;
    for (int64_t j = 0; j < 4; ++j) nib.push_back(w.bitwise_right_shift(4 * j).bitwise_and(0xF));
    at::Tensor n = at::stack(nib, -1);  // (P, W, 4) codes: sign, 2 exponent bits, 1 mantissa bit
    static const float kValues[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
    at::Tensor table = at::tensor(c10::ArrayRef<float>(kValues, 8));
    at::Tensor mag = table.index({n.bitwise_and(7).to(at::kLong)});
    return at::where(n.bitwise_and(8).ne(0), -mag, mag);
  }
  at::Tensor bytes = words.contiguous().view(at::kByte).reshape({P, W, 4});
  return bytes.view(format == kE4m3fn ? at::kFloat8_e4m3fn : at::kFloat8_e5m2).to(at::kFloat);
}

// (P, W) scale factors for the data partitions 0..P-1 from the quadrant layout.
at::Tensor scale_factors(const at::Tensor& scale, int64_t P, int64_t W) {
  at::Tensor s = rows(scale_bytes(scale));
  std::vector<int64_t> idx;
  for (int64_t p = 0; p < P; ++p) idx.push_back(scale_row(p / 8));
  at::Tensor e = s.index_select(0, at::tensor(idx, at::kLong)).narrow(1, 0, W).to(at::kFloat);
  return at::exp2(e - 127.0);
}

// dst (P, F/4) words, src (P, F), dst_scale: the group's largest fp32 exponent
// less the format's largest (8 for e4m3fn, 15 for e5m2), values divided by
// the scale, clipped to the format's largest finite value and rounded.
void quantize_mx(const Instruction& ins, const std::vector<at::Tensor>& v) {
  const int64_t format = ins.ints.at(0);
  const int64_t emax = format == kE4m3fn ? 8 : 15;
  const double vmax = format == kE4m3fn ? 448.0 : 57344.0;
  at::Tensor x = f32(rows(v[1])).contiguous();
  const int64_t P = x.size(0), F = x.size(1);
  at::Tensor exp = x.view(at::kInt).bitwise_right_shift(23).bitwise_and(0xFF);
  at::Tensor block = exp.reshape({P / 8, 8, F / 4, 4}).amax({1, 3});  // (P/8, F/4)
  at::Tensor factor = at::exp2(block.to(at::kDouble) - (emax + 127));
  at::Tensor full = factor.repeat_interleave(8, 0).repeat_interleave(4, 1);
  at::Tensor q = at::clamp(x.to(at::kDouble) / full, -vmax, vmax).to(at::kFloat);
  at::Tensor packed = q.to(format == kE4m3fn ? at::kFloat8_e4m3fn : at::kFloat8_e5m2).view(at::kByte).view(at::kInt);
  v[0].copy_(packed.view(v[0].scalar_type()).reshape(v[0].sizes()));  // the operands are 2-D views
  at::Tensor scale = at::clamp(block - emax, 0, 255).to(at::kByte);
  at::Tensor dst_scale = scale_bytes(v[2]);
  for (int64_t g = 0; g < P / 8; ++g) dst_scale.select(0, scale_row(g)).narrow(0, 0, F / 4).copy_(scale[g]);
}

// dst (M, N) [+]= sum over partitions k and packed elements j of
// stationary[k, m, j] * moving[k, n, j], each dequantized by its group's scale.
void matmul_mx(const Instruction& ins, const std::vector<at::Tensor>& v) {
  const at::Tensor& dst = v[0];
  at::Tensor s = rows(v[1]), m = rows(v[2]);
  const int64_t K = s.size(0), M = s.size(1), N = m.size(1);
  at::Tensor sv = unpack(s, ins.ints.at(1)) * scale_factors(v[3], K, M).unsqueeze(-1);
  at::Tensor mv = unpack(m, ins.ints.at(2)) * scale_factors(v[4], K, N).unsqueeze(-1);
  at::Tensor r = at::mm(sv.permute({0, 2, 1}).reshape({K * 4, M}).t(), mv.permute({0, 2, 1}).reshape({K * 4, N}));
  if (ins.ints.at(0)) r = r + f32(dst).reshape(r.sizes());
  write(ins, dst, r);
}

}  // namespace

bool execute_mx(const Instruction& ins, const std::vector<at::Tensor>& v) {
  switch (ins.kind) {
    case Kind::kQuantizeMx: quantize_mx(ins, v); return true;
    case Kind::kMatmulMx: matmul_mx(ins, v); return true;
    default: return false;
  }
}

}  // namespace neuronx::nki
