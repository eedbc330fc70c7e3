// The engines' pseudo-random number generators (Gen-2 nisa.rng, rand2, set_rng_seed,
// rand_set_state, rand_get_state): XORWOW, one state of six 32-bit words (x0..x4, the Weyl
// counter d) per compute lane. The GpSimd Engine has one lane per partition, the Vector Engine
// four (element j of a partition draws from lane j % 4).
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <c10/util/Exception.h>

#include <cstring>

#include "nki/exec_util.h"

namespace neuronx::nki {

namespace {

constexpr int64_t kWords = 6;

int64_t lanes(int64_t engine) { return engine == 1 ? 1 : 4; }  // 1: GpSimd, else Vector

uint32_t xorwow(uint32_t* s) {
  uint32_t t = s[4];
  const uint32_t x0 = s[0];
  s[4] = s[3];
  s[3] = s[2];
  s[2] = s[1];
  s[1] = x0;
  t ^= t >> 2;
  t ^= t << 1;
  t ^= x0 ^ (x0 << 4);
  s[0] = t;
  s[5] += 362437u;
  return t + s[5];
}

// Every lane's state from one 32-bit seed (splitmix64 over seed and lane), never all zero.
void seed_all(std::vector<uint32_t>& st, uint64_t seed, int64_t n_lanes, int64_t partitions) {
  st.assign(static_cast<size_t>(partitions * n_lanes * kWords), 0);
  for (int64_t l = 0; l < partitions * n_lanes; ++l) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(l + 1);
    for (int64_t w = 0; w < kWords; ++w) {
      z += 0x9E3779B97F4A7C15ull;
      uint64_t y = z;
      y = (y ^ (y >> 30)) * 0xBF58476D1CE4E5B9ull;
      y = (y ^ (y >> 27)) * 0x94D049BB133111EBull;
      st[static_cast<size_t>(l * kWords + w)] = static_cast<uint32_t>(y ^ (y >> 31)) | (w == 0 ? 1u : 0u);
    }
  }
}

std::vector<uint32_t>& state_of(RunState& state, int64_t engine, int64_t partitions) {
  std::vector<uint32_t>& st = state.prng[engine == 1 ? 1 : 0];
  if (st.empty()) seed_all(st, state.seed + static_cast<uint64_t>(engine), lanes(engine), partitions);
  TORCH_CHECK(static_cast<int64_t>(st.size()) >= partitions * lanes(engine) * kWords,
              "random generator state covers fewer partitions than the instruction uses");
  return st;
}

// (P, F) draws of 32 random bits, in each partition's element order.
at::Tensor draw(RunState& state, int64_t engine, int64_t P, int64_t F) {
  std::vector<uint32_t>& st = state_of(state, engine, 128);
  at::Tensor out = at::empty({P, F}, at::TensorOptions().dtype(at::kLong));
  auto* o = out.data_ptr<int64_t>();
  const int64_t L = lanes(engine);
  for (int64_t p = 0; p < P; ++p)
    for (int64_t j = 0; j < F; ++j) o[p * F + j] = xorwow(&st[static_cast<size_t>((p * L + j % L) * kWords)]);
  return out;
}

}  // namespace

// ints: [op (0 rng, 1 rand2, 2 set_rng_seed, 3 rand_set_state, 4 rand_get_state), engine, has min/max tiles]
bool execute_prng(const Instruction& ins, const std::vector<at::Tensor>& v, RunState& state) {
  if (ins.kind != Kind::kPrng) return false;
  const int64_t op = ins.ints.at(0), engine = ins.ints.at(1);
  const at::Tensor& t = v.at(0);
  const int64_t P = t.size(0), F = t.numel() / std::max<int64_t>(P, 1);
  switch (op) {
    case 0: {  // 32 random bits per element, truncated to dst's integer type (its low bits)
      at::Tensor bits = draw(state, engine, P, F);
      const int64_t width = static_cast<int64_t>(t.element_size()) * 8;
      if (width < 32) bits = bits.bitwise_and((int64_t{1} << width) - 1);
      if (c10::isSignedType(t.scalar_type()) && width <= 32)
        bits = at::where(bits >= (int64_t{1} << (width - 1)), bits - (int64_t{1} << width), bits);
      t.copy_(bits.reshape(t.sizes()).to(t.scalar_type()));
      return true;
    }
    case 1: {  // uniform in [min, max]: the top 24 bits as a fraction
      at::Tensor u = draw(state, engine, P, F).bitwise_right_shift(8).to(at::kDouble) * (1.0 / 16777216.0);
      at::Tensor lo, hi;
      if (ins.ints.at(2)) {
        lo = f32(v.at(1)).reshape({P, 1}).to(at::kDouble);
        hi = f32(v.at(2)).reshape({P, 1}).to(at::kDouble);
      } else {
        lo = at::scalar_tensor(ins.scalars.at(0), at::kDouble);
        hi = at::scalar_tensor(ins.scalars.at(1), at::kDouble);
      }
      write(ins, t, (lo + u * (hi - lo)).to(at::kFloat).reshape(t.sizes()));
      return true;
    }
    case 2: {  // one seed for every lane
      const auto seed = static_cast<uint32_t>(t.reshape({-1})[0].to(at::kLong).item<int64_t>());
      seed_all(state.prng[engine == 1 ? 1 : 0], seed, lanes(engine), 128);
      return true;
    }
    case 3: {  // each partition's lanes from its row of uint32 words
      std::vector<uint32_t>& st = state_of(state, engine, 128);
      at::Tensor words = t.reshape({P, -1}).contiguous().view(at::kInt);
      TORCH_CHECK(words.size(1) == lanes(engine) * kWords, ins.name, ": src_seeds needs ",
                  lanes(engine) * kWords, " uint32 per partition, got ", words.size(1));
      std::memcpy(st.data(), words.data_ptr(), static_cast<size_t>(P * words.size(1)) * 4);
      return true;
    }
    default: {  // the lanes' state into dst
      std::vector<uint32_t>& st = state_of(state, engine, 128);
      TORCH_CHECK(F == lanes(engine) * kWords, ins.name, ": dst needs ", lanes(engine) * kWords,
                  " uint32 per partition, got ", F);
      at::Tensor words = at::from_blob(st.data(), {P, F}, at::TensorOptions().dtype(at::kInt)).clone();
      t.copy_(words.view(t.scalar_type()).reshape(t.sizes()));
      return true;
    }
  }
}

}  // namespace neuronx::nki
