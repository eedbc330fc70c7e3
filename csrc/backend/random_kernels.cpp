// Random ops' device kernels (device_kernels.h). ATen's CPU kernels call the generator once per
// 32-bit draw (a branch and a state update each, under the generator's lock, one element at a
// time); the stream is the same when generated a block of 624 words at a time, which is how
// mt19937 is defined. Before a kernel is used its output is compared once per process with ATen's
// CPU kernel on a probe: ATen takes another algorithm on some CPUs (MKL's generator on Intel), and
// there the CPU kernel keeps running.
#include "backend/device_kernels.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Dispatch.h>
#include <ATen/core/Generator.h>
#include <ATen/core/MT19937RNGEngine.h>
#include <ATen/ops/bernoulli.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>

#include <algorithm>
#include <cmath>
#include <mutex>

// (-O2 leaves these loops scalar: the stream's throughput is the point of this file.)
#pragma GCC optimize("O3")

namespace neuronx {

namespace {

constexpr int kN = at::MERSENNE_STATE_N;  // 624
constexpr int kM = at::MERSENNE_STATE_M;  // 397

inline uint32_t twisted(uint32_t u, uint32_t v) {
  return (((u & 0x80000000u) | (v & 0x7fffffffu)) >> 1) ^ ((v & 1u) ? 0x9908b0dfu : 0u);
}

// The next 624 words of the state, in place (mt19937's recurrence).
__attribute__((always_inline)) inline void twist(std::array<uint32_t, kN>& s) {
  int j = 0;
  for (; j < kN - kM; ++j) s[j] = s[j + kM] ^ twisted(s[j], s[j + 1]);
  for (; j < kN - 1; ++j) s[j] = s[j + kM - kN] ^ twisted(s[j], s[j + 1]);
  s[kN - 1] = s[kM - 1] ^ twisted(s[kN - 1], s[0]);
}

inline uint32_t temper(uint32_t y) {
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  return y ^ (y >> 18);
}

// n draws of e, as n calls of e() would return them, and e advanced past them. ATen's engine
// twists when a call finds left_ decremented to 0, then reads state_[next_++]: between twists,
// left_ - 1 words state_[next_..] remain (next_ + left_ - 1 == 624).
__attribute__((target_clones("avx512f", "avx2", "default")))
void draw(at::mt19937& e, uint32_t* __restrict__ out, int64_t n) {
  at::mt19937_data_pod d = e.data();
  const bool fresh = d.left_ == 1 && d.next_ == 0;  // (as seeded: the next draw twists first)
  if (!fresh && (d.left_ < 1 || d.left_ > kN || static_cast<int64_t>(d.next_) + d.left_ - 1 != kN)) {
    for (int64_t i = 0; i < n; ++i) out[i] = e();  // (a state ATen's engine would not produce)
    return;
  }
  while (n > 0) {
    if (d.left_ == 1) {
      twist(d.state_);
      d.left_ = kN + 1;  // the next draw's decrement leaves kN, as in ATen's engine
      d.next_ = 0;
    }
    const int64_t run = std::min<int64_t>(d.left_ - 1, n);
    const uint32_t* __restrict__ s = d.state_.data() + d.next_;
    for (int64_t i = 0; i < run; ++i) out[i] = temper(s[i]);
    out += run;
    n -= run;
    d.next_ += static_cast<uint32_t>(run);
    d.left_ -= static_cast<int>(run);
  }
  e.set_data(d);
}

// out[i] = (u_i < p) for contiguous out, u_i = ((w_2i << 32 | w_2i+1) & (2^53 - 1)) * 2^-53 as ATen's
// uniform_real_distribution<double> makes it from random64(). u < p is x < p * 2^53 (both sides
// scaled exactly), and for an integer x, x < ceil(p * 2^53).
template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default")))
void fill_bernoulli(T* out, int64_t n, double p, at::CPUGeneratorImpl* gen) {
  constexpr uint64_t kMask = (uint64_t{1} << 53) - 1;
  const uint64_t threshold = static_cast<uint64_t>(std::ceil(std::ldexp(p, 53)));
  constexpr int64_t kChunk = 1024;
  uint32_t w[2 * kChunk];
  std::lock_guard<std::mutex> lock(gen->mutex_);
  at::mt19937 e = gen->engine();
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t m = std::min(kChunk, n - i);
    draw(e, w, 2 * m);
    for (int64_t k = 0; k < m; ++k) {
      const uint64_t x = ((static_cast<uint64_t>(w[2 * k]) << 32) | w[2 * k + 1]) & kMask;
      out[i + k] = static_cast<T>(x < threshold);
    }
  }
  gen->set_engine(e);
}

bool fill_bernoulli_tensor(const at::Tensor& out, double p, at::CPUGeneratorImpl* gen) {
  const at::ScalarType t = out.scalar_type();
  switch (t) {  // ATen's dispatch list (all types and bool, bfloat16, half); others: its kernel raises
    case at::kByte: case at::kChar: case at::kShort: case at::kInt: case at::kLong: case at::kFloat:
    case at::kDouble: case at::kBool: case at::kBFloat16: case at::kHalf:
      break;
    default:
      return false;
  }
  bool done = false;
  AT_DISPATCH_ALL_TYPES_AND3(at::ScalarType::Bool, at::ScalarType::BFloat16, at::ScalarType::Half,
                             out.scalar_type(), "neuron_bernoulli", [&] {
                               fill_bernoulli(out.data_ptr<scalar_t>(), out.numel(), p, gen);
                               done = true;
                             });
  return done;
}

// Whether fill_bernoulli draws what ATen's CPU kernel draws here: 1500 elements from a fresh
// generator (five twists), then the generators' next words.
bool bernoulli_matches_cpu() {
  at::Generator a = at::make_generator<at::CPUGeneratorImpl>(20251205), b = at::make_generator<at::CPUGeneratorImpl>(20251205);
  at::Tensor ref = at::empty({1500}, at::kFloat).bernoulli_(0.37, a);
  at::Tensor ours = at::empty({1500}, at::kFloat);
  fill_bernoulli_tensor(ours, 0.37, b.get<at::CPUGeneratorImpl>());
  return at::equal(ref, ours) && a.get<at::CPUGeneratorImpl>()->random() == b.get<at::CPUGeneratorImpl>()->random();
}

}  // namespace

bool bernoulli_scalar_kernel(c10::ArrayRef<at::Tensor> outs, c10::ArrayRef<c10::IValue> args) {
  // (self, float p, Generator? generator)
  if (outs.size() != 1 || args.size() != 3 || !args[1].isDouble()) return false;
  const at::Tensor& out = outs[0];
  if (!out.defined() || !out.is_contiguous() || out.is_conj() || out.is_neg()) return false;
  const double p = args[1].toDouble();
  if (!(p >= 0 && p <= 1)) return false;  // (ATen's kernel raises its error)
  static const bool same = bernoulli_matches_cpu();
  if (!same) return false;
  const std::optional<at::Generator> g = args[2].isNone() ? std::nullopt : std::optional(args[2].toGenerator());
  auto* gen = at::get_generator_or_default<at::CPUGeneratorImpl>(g, at::detail::getDefaultCPUGenerator());
  return fill_bernoulli_tensor(out, p, gen);
}

}  // namespace neuronx
