// The generated FlexAttention kernels (flex_attention.h): the score_mod, mask_mod and joint as
// inline functions, then the forward and the two backward kernels over them. Math in float
// (FlexAttention's working precision for float32, bfloat16 and float16 inputs); block GEMMs by
// the BLAS torch ships (sgemm), from one thread each (the kernels run inside parallel_for).
#include <c10/util/Exception.h>

#include <sstream>

#include "compiler/codegen.h"
#include "compiler/flex_attention.h"
#include "compiler/scalar_program.h"

namespace neuronx::compiler {

namespace {

#define NEURONX_STR2(x) #x
#define NEURONX_STR(x) NEURONX_STR2(x)

const char* kHelpers = R"(#include <ATen/native/CPUBlas.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <type_traits>
template <typename T> struct NxAt {  // a captured tensor read at indices (negative ones wrap, as torch)
  const NxBuf& b;
  explicit NxAt(const NxBuf& buf) : b(buf) {}
  template <typename... I> auto operator()(I... idx) const {
    const int64_t ix[] = {0, static_cast<int64_t>(idx)...};
    int64_t off = 0;
    for (int64_t d = 0; d < static_cast<int64_t>(sizeof...(I)); ++d) {
      int64_t i = ix[d + 1];
      if (i < 0) i += b.sizes[d];
      if (i < 0 || i >= b.sizes[d]) { __atomic_store_n(b.out_of_range, 1, __ATOMIC_RELAXED); return decltype(load(0))(0); }
      off += i * b.strides[d];
    }
    return load(off);
  }
  auto load(int64_t off) const {
    const T v = reinterpret_cast<const T*>(b.data)[off];
    if constexpr (std::is_same_v<T, c10::BFloat16> || std::is_same_v<T, c10::Half>) return static_cast<float>(v);
    else return v;
  }
};
template <typename T> static inline T nx_bitwise_not(T a) { if constexpr (std::is_same_v<T, bool>) return !a; else return ~a; }
// The kernel's error flag (NxBuf::out_of_range), for the integer divisions of the mods.
static thread_local int32_t* nx_error = nullptr;
template <typename B> static inline bool nx_zero_divisor(B b) {
  if (b != 0) return false;
  if (nx_error) __atomic_store_n(nx_error, 2, __ATOMIC_RELAXED);
  return true;
}
template <typename A, typename B> static inline auto nx_floor_divide(A a, B b) {
  if constexpr (std::is_integral_v<A> && std::is_integral_v<B>) { if (nx_zero_divisor(b)) return decltype(a / b)(0); auto q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }
  else return std::floor(a / b);
}
template <typename A, typename B> static inline auto nx_remainder(A a, B b) {
  if constexpr (std::is_integral_v<A> && std::is_integral_v<B>) { if (nx_zero_divisor(b)) return decltype(a % b)(0); auto r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
  else { auto r = std::fmod(a, b); return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
}
// C[M, N] (+)= A[M, K] B[K, N], row-major with leading dims: oneDNN's batch-reduce GEMM micro-kernel
// (as ATen's CPU flash attention uses; several times faster than a BLAS call at tile sizes).
static inline void nx_mm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
                         float* C, int64_t ldc, bool accumulate) {
  at::native::cpublas::brgemm(M, N, K, lda, ldb, ldc, accumulate, A, B, C, false);
}
// dst[j, i] = src[i, j] for i < rows, j < cols (leading dims lds, ldd).
static inline void nx_transpose(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst, int64_t ldd) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[j * ldd + i] = src[i * lds + j];
}
// n rows from row r0 of a matrix (row stride rs, column stride cs) into dst[n, cols] (float).
static inline void nx_load(const nx_t* base, int64_t r0, int64_t n, int64_t rs, int64_t cs, int64_t cols, float* dst) {
  for (int64_t i = 0; i < n; ++i) {
    const nx_t* src = base + (r0 + i) * rs;
    float* d = dst + i * cols;
    if constexpr (std::is_same_v<nx_t, float>) { if (cs == 1) { std::memcpy(d, src, cols * sizeof(float)); continue; } }
    for (int64_t j = 0; j < cols; ++j) d[j] = static_cast<float>(src[j * cs]);
  }
}
// The same rows transposed: dst[cols, n] with leading dim ldd (a GEMM's right operand).
static inline void nx_load_t(const nx_t* base, int64_t r0, int64_t n, int64_t rs, int64_t cs, int64_t cols, float* dst, int64_t ldd) {
  for (int64_t i = 0; i < n; ++i) {
    const nx_t* src = base + (r0 + i) * rs;
    for (int64_t j = 0; j < cols; ++j) dst[j * ldd + i] = static_cast<float>(src[j * cs]);
  }
}
// The same rows as a float matrix with leading dimension ld: in place when stored as float with
// unit column stride, else copied into buf.
static inline const float* nx_rows(const nx_t* base, int64_t r0, int64_t n, int64_t rs, int64_t cs, int64_t cols, float* buf, int& ld) {
  if constexpr (std::is_same_v<nx_t, float>) {
    if (cs == 1 && rs >= cols && rs <= (1 << 30)) { ld = static_cast<int>(rs); return reinterpret_cast<const float*>(base + r0 * rs); }
  }
  nx_load(base, r0, n, rs, cs, cols, buf);
  ld = static_cast<int>(cols);
  return buf;
}
static inline void nx_store(nx_t* base, int64_t r0, int64_t n, int64_t rs, int64_t cs, int64_t cols, const float* src) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < cols; ++j) base[(r0 + i) * rs + j * cs] = static_cast<nx_t>(src[i * cols + j]);
}
// s[c] = exp(s[c] - mx) for c < n; returns their sum.
static inline float nx_exp_sum(float* s, int64_t n, float mx) {
  using Vec = at::vec::Vectorized<float>;
  int64_t c = 0;
  Vec acc(0.f);
  for (; c + Vec::size() <= n; c += Vec::size()) {
    const Vec e = (Vec::loadu(s + c) - Vec(mx)).exp_u20();
    e.store(s + c);
    acc = acc + e;
  }
  float lanes[Vec::size()];
  acc.store(lanes);
  float sum = 0;
  for (int k = 0; k < Vec::size(); ++k) sum += lanes[k];
  for (; c < n; ++c) { s[c] = std::exp(s[c] - mx); sum += s[c]; }
  return sum;
}
static inline float nx_max(const float* s, int64_t n, float m) {
  using Vec = at::vec::Vectorized<float>;
  int64_t c = 0;
  Vec acc(m);
  for (; c + Vec::size() <= n; c += Vec::size()) acc = at::vec::maximum(acc, Vec::loadu(s + c));
  float lanes[Vec::size()];
  acc.store(lanes);
  for (int k = 0; k < Vec::size(); ++k) m = std::max(m, lanes[k]);
  for (; c < n; ++c) m = std::max(m, s[c]);
  return m;
}
// Calls fn(full, start, n) for each tile of at most `tile` rows in the blocks (of `block` rows,
// `length` in all) that row `row` of a block mask's lists names: the partial blocks' list, then
// the full blocks' (num/idx[1], null when the mask has none).
template <typename F>
static inline void nx_for_tiles(const int32_t* const* num, const int32_t* const* idx, int64_t row, int64_t blocks,
                                int64_t block, int64_t length, int64_t tile, F&& fn) {
  for (int full = 0; full < 2; ++full) {
    if (!num[full]) continue;
    const int32_t* list = idx[full] + row * blocks;
    for (int64_t j = 0; j < num[full][row]; ++j) {
      const int64_t start = list[j] * block, stop = std::min(start + block, length);
      for (int64_t t0 = start; t0 < stop; t0 += tile) fn(full != 0, t0, std::min(tile, stop - t0));
    }
  }
}
#define NX_I(name) static_cast<int64_t>(sc[s_##name])
static constexpr float NX_LN2 = 0.69314718055994530942f;
static constexpr float NX_INF = std::numeric_limits<float>::infinity();
)";

// Shared by the three kernels: the arguments by name.
const char* kUnpack = R"(  const int64_t B = sc[s_B], Hq = sc[s_Hq], Hkv = sc[s_Hkv], Bk = sc[s_Bk], Lq = sc[s_Lq], Lkv = sc[s_Lkv];
  const int64_t D = sc[s_D], Dv = sc[s_Dv], QB = sc[s_QB], KB = sc[s_KB], NQB = sc[s_NQB], NKB = sc[s_NKB];
  const int64_t MB = sc[s_MB], MH = sc[s_MH], G = Hq / Hkv;
  (void)Lq; (void)Lkv;
  const float scale = static_cast<float>(sc[s_Scale]);
  const nx_t* q = reinterpret_cast<const nx_t*>(ptrs[p_Q]);
  const nx_t* k = reinterpret_cast<const nx_t*>(ptrs[p_K]);
  const nx_t* v = reinterpret_cast<const nx_t*>(ptrs[p_V]);
  const NxBuf* sbufs = reinterpret_cast<const NxBuf*>(ptrs[p_ScoreBufs]);
  const NxBuf* mbufs = reinterpret_cast<const NxBuf*>(ptrs[p_MaskBufs]);
  nx_error = sbufs[0].out_of_range;
  const int32_t* kvn[2] = {reinterpret_cast<const int32_t*>(ptrs[p_KvNum]), reinterpret_cast<const int32_t*>(ptrs[p_FullKvNum])};
  const int32_t* kvi[2] = {reinterpret_cast<const int32_t*>(ptrs[p_KvIdx]), reinterpret_cast<const int32_t*>(ptrs[p_FullKvIdx])};
  const int64_t TQ = NX_TQ;
  (void)B; (void)Bk; (void)MB; (void)kvn; (void)kvi;
)";

const char* kForward = R"(
// A row of scores in place: s[c] = score_mod(s[c] * scale) at key k0 + c, -inf where the
// mask_mod (partial blocks only) says no; returns max(m, the row's max). One loop per step, so
// each vectorizes (a running max in the score loop would be a serial chain).
static inline float nx_scores(float* s, int64_t n, float scale, bool full, int64_t b, int64_t h, int64_t qi, int64_t k0, float m,
                              const NxBuf* sbufs, const NxBuf* mbufs) {
  for (int64_t c = 0; c < n; ++c) s[c] = nx_score(s[c] * scale, b, h, qi, k0 + c, sbufs);
  if (!full)
    for (int64_t c = 0; c < n; ++c)
      if (!nx_mask(b, h, qi, k0 + c, mbufs)) s[c] = -NX_INF;
  return nx_max(s, n, m);
}
extern "C" void nx_flex_forward(char* const* ptrs, const double* sc, int64_t begin, int64_t end) {
NX_UNPACK
  const int64_t TK = NX_TK;
  nx_t* out = reinterpret_cast<nx_t*>(ptrs[p_Out]);
  float* lse = reinterpret_cast<float*>(ptrs[p_Lse]);
  float* mxo = reinterpret_cast<float*>(ptrs[p_Max]);
  const int64_t tiles = (std::min(QB, Lq) + TQ - 1) / TQ;
  std::vector<float> Qf(TQ * D), Kt(D * TK), Vf(TK * Dv), S(TQ * TK), acc(TQ * Dv), m(TQ), l(TQ);
  for (int64_t w = begin; w < end; ++w) {
    const int64_t t = w % tiles, qb = (w / tiles) % NQB, h = (w / tiles / NQB) % Hq, b = w / tiles / NQB / Hq;
    const int64_t q0 = qb * QB + t * TQ, q1 = std::min({qb * QB + QB, Lq, q0 + TQ});
    if (q0 >= q1) continue;
    const int64_t rows = q1 - q0, hk = h / G, bk = Bk == 1 ? 0 : b;
    nx_load(q + b * NX_I(qs0) + h * NX_I(qs1), q0, rows, sc[s_qs2], sc[s_qs3], D, Qf.data());
    std::fill(m.begin(), m.end(), -NX_INF);
    std::fill(l.begin(), l.end(), 0.f);
    std::fill(acc.begin(), acc.end(), 0.f);
    const int64_t mrow = ((MB == 1 ? 0 : b) * MH + (MH == 1 ? 0 : h)) * NQB + qb;
    nx_for_tiles(kvn, kvi, mrow, NKB, KB, Lkv, TK, [&](bool full, int64_t k0, int64_t cols) {
      int ldv;
      nx_load_t(k + bk * NX_I(ks0) + hk * NX_I(ks1), k0, cols, sc[s_ks2], sc[s_ks3], D, Kt.data(), TK);
      const float* Vp = nx_rows(v + bk * NX_I(vs0) + hk * NX_I(vs1), k0, cols, sc[s_vs2], sc[s_vs3], Dv, Vf.data(), ldv);
      nx_mm(rows, cols, D, Qf.data(), D, Kt.data(), TK, S.data(), TK, false);
      for (int64_t i = 0; i < rows; ++i) {
        float* s = S.data() + i * TK;
        const float mx = nx_scores(s, cols, scale, full, b, h, q0 + i, k0, m[i], sbufs, mbufs);
        if (mx == -NX_INF) { std::fill(s, s + cols, 0.f); continue; }
        const float alpha = std::exp(m[i] - mx);
        l[i] = l[i] * alpha + nx_exp_sum(s, cols, mx);
        m[i] = mx;
        if (alpha != 1.f) for (int64_t d = 0; d < Dv; ++d) acc[i * Dv + d] *= alpha;
      }
      nx_mm(rows, Dv, cols, S.data(), TK, Vp, ldv, acc.data(), Dv, true);
    });
    for (int64_t i = 0; i < rows; ++i) {
      const float inv = l[i] > 0 ? 1.f / l[i] : 0.f;
      for (int64_t d = 0; d < Dv; ++d) acc[i * Dv + d] *= inv;
      const int64_t r = (b * Hq + h) * Lq + q0 + i;
      lse[r] = l[i] > 0 ? (m[i] + std::log(l[i])) / NX_LN2 : -NX_INF;
      mxo[r] = m[i] / NX_LN2;
    }
    nx_store(out + b * NX_I(os0) + h * NX_I(os1), q0, rows, sc[s_os2], sc[s_os3], Dv, acc.data());
  }
  at::native::cpublas::brgemm_release();
}
)";

// Per tile of queries: what both backward kernels need about its rows.
const char* kBackwardCommon = R"(
// A tile of query rows as the backward reads it: Q and dO (in place when float, else copied),
// and per row the natural-log logsumexp, Delta = rowsum(dO * O) and the logsumexp's gradient
// (computed once by the op: p_Lse, p_Delta, p_GradLse hold them per query row).
struct NxRows {
  std::vector<float> qbuf, obuf;
  const float *Q = nullptr, *dO = nullptr, *lse = nullptr, *delta = nullptr, *glse = nullptr;
  int ldq = 0, ldo = 0;
  NxRows(int64_t TQ, int64_t D, int64_t Dv) : qbuf(TQ * D), obuf(TQ * Dv) {}
};
static inline void nx_load_rows(NxRows& r, char* const* ptrs, const double* sc, int64_t b, int64_t h, int64_t q0, int64_t rows) {
  const int64_t Hq = sc[s_Hq], Lq = sc[s_Lq], D = sc[s_D], Dv = sc[s_Dv];
  r.Q = nx_rows(reinterpret_cast<const nx_t*>(ptrs[p_Q]) + b * NX_I(qs0) + h * NX_I(qs1), q0, rows, sc[s_qs2], sc[s_qs3], D, r.qbuf.data(), r.ldq);
  r.dO = nx_rows(reinterpret_cast<const nx_t*>(ptrs[p_GradOut]) + b * NX_I(gos0) + h * NX_I(gos1), q0, rows, sc[s_gos2], sc[s_gos3], Dv, r.obuf.data(), r.ldo);
  const int64_t at = (b * Hq + h) * Lq + q0;
  r.lse = reinterpret_cast<const float*>(ptrs[p_Lse]) + at;
  r.delta = reinterpret_cast<const float*>(ptrs[p_Delta]) + at;
  r.glse = ptrs[p_GradLse] ? reinterpret_cast<const float*>(ptrs[p_GradLse]) + at : nullptr;
}
// S = Q K^T and dP = dO V^T for a tile pair (Kt, Vt: K and V transposed, leading dim ld), then
// in place: dP -> P (softmax probabilities) and S -> dS * scale (the gradient at the score
// before score_mod, zero where masked, times the scale every use of it takes); X: scratch (the
// scaled scores).
static inline void nx_tile_grads(const NxRows& r, const float* Kt, const float* Vt, float* S, float* dP, float* X, int64_t ld, int64_t rows, int64_t cols,
                                 int64_t D, int64_t Dv, float scale, bool full, int64_t b, int64_t h, int64_t q0, int64_t k0,
                                 const NxBuf* sbufs, const NxBuf* mbufs) {
  nx_mm(rows, cols, D, r.Q, r.ldq, Kt, ld, S, ld, false);
  nx_mm(rows, cols, Dv, r.dO, r.ldo, Vt, ld, dP, ld, false);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t qi = q0 + i;
    float* x = X + i * ld;
    float* p = S + i * ld;
    float* dp = dP + i * ld;
    for (int64_t c = 0; c < cols; ++c) x[c] = p[c] * scale;
    for (int64_t c = 0; c < cols; ++c) p[c] = nx_score(x[c], b, h, qi, k0 + c, sbufs);
    if (!full)
      for (int64_t c = 0; c < cols; ++c)
        if (!nx_mask(b, h, qi, k0 + c, mbufs)) p[c] = -NX_INF;
    if (r.lse[i] == -NX_INF) std::fill(p, p + cols, 0.f);
    else nx_exp_sum(p, cols, r.lse[i]);
    const float shift = (r.glse ? r.glse[i] : 0.f) - r.delta[i];
    for (int64_t c = 0; c < cols; ++c) {
      // A VJP is linear in its cotangent: where p is 0 (masked) the gradient is 0.
      const float ds = p[c] != 0.f ? nx_joint(x[c], b, h, qi, k0 + c, p[c] * (dp[c] + shift), sbufs) * scale : 0.f;
      dp[c] = p[c];
      p[c] = ds;
    }
  }
}

extern "C" void nx_flex_grad_query(char* const* ptrs, const double* sc, int64_t begin, int64_t end) {
NX_UNPACK
  const int64_t TK = NX_TKB;
  nx_t* dq = reinterpret_cast<nx_t*>(ptrs[p_GradQ]);
  const int64_t tiles = (std::min(QB, Lq) + TQ - 1) / TQ;
  NxRows r(TQ, D, Dv);
  std::vector<float> Kf(TK * D), Kt(D * TK), Vt(Dv * TK), S(TQ * TK), dP(TQ * TK), X(TQ * TK), dQ(TQ * D);
  for (int64_t w = begin; w < end; ++w) {
    const int64_t t = w % tiles, qb = (w / tiles) % NQB, h = (w / tiles / NQB) % Hq, b = w / tiles / NQB / Hq;
    const int64_t q0 = qb * QB + t * TQ, q1 = std::min({qb * QB + QB, Lq, q0 + TQ});
    if (q0 >= q1) continue;
    const int64_t rows = q1 - q0, hk = h / G, bk = Bk == 1 ? 0 : b;
    nx_load_rows(r, ptrs, sc, b, h, q0, rows);
    std::fill(dQ.begin(), dQ.end(), 0.f);
    const int64_t mrow = ((MB == 1 ? 0 : b) * MH + (MH == 1 ? 0 : h)) * NQB + qb;
    nx_for_tiles(kvn, kvi, mrow, NKB, KB, Lkv, TK, [&](bool full, int64_t k0, int64_t cols) {
      int ldk;
      const float* Kp = nx_rows(k + bk * NX_I(ks0) + hk * NX_I(ks1), k0, cols, sc[s_ks2], sc[s_ks3], D, Kf.data(), ldk);
      nx_load_t(k + bk * NX_I(ks0) + hk * NX_I(ks1), k0, cols, sc[s_ks2], sc[s_ks3], D, Kt.data(), TK);
      nx_load_t(v + bk * NX_I(vs0) + hk * NX_I(vs1), k0, cols, sc[s_vs2], sc[s_vs3], Dv, Vt.data(), TK);
      nx_tile_grads(r, Kt.data(), Vt.data(), S.data(), dP.data(), X.data(), TK, rows, cols, D, Dv, scale, full, b, h, q0, k0, sbufs, mbufs);
      nx_mm(rows, D, cols, S.data(), TK, Kp, ldk, dQ.data(), D, true);
    });
    nx_store(dq + b * NX_I(gqs0) + h * NX_I(gqs1), q0, rows, sc[s_gqs2], sc[s_gqs3], D, dQ.data());
  }
  at::native::cpublas::brgemm_release();
}

extern "C" void nx_flex_grad_key_value(char* const* ptrs, const double* sc, int64_t begin, int64_t end) {
NX_UNPACK
  const int64_t TK = NX_TKB;
  nx_t* dk = reinterpret_cast<nx_t*>(ptrs[p_GradK]);
  nx_t* dv = reinterpret_cast<nx_t*>(ptrs[p_GradV]);
  const int32_t* qn[2] = {reinterpret_cast<const int32_t*>(ptrs[p_QNum]), reinterpret_cast<const int32_t*>(ptrs[p_FullQNum])};
  const int32_t* qix[2] = {reinterpret_cast<const int32_t*>(ptrs[p_QIdx]), reinterpret_cast<const int32_t*>(ptrs[p_FullQIdx])};
  float* dqa = reinterpret_cast<float*>(ptrs[p_GradQAcc]);  // this thread's dQ, or null (a dQ kernel runs)
  const int64_t tiles = (std::min(KB, Lkv) + TK - 1) / TK;
  NxRows r(TQ, D, Dv);
  std::vector<float> Kf(TK * D), Kt(D * TK), Vt(Dv * TK), S(TQ * TK), dP(TQ * TK), X(TQ * TK), T(TK * TQ), dK(TK * D), dV(TK * Dv);
  for (int64_t w = begin; w < end; ++w) {
    // Blocks of keys zigzag (0, last, 1, last - 1, ...): under a causal mask the first ones see
    // the most queries, and parallel_for hands each thread a contiguous range.
    const int64_t z = (w / tiles) % NKB, kb = z % 2 == 0 ? z / 2 : NKB - 1 - z / 2;
    const int64_t t = w % tiles, hk = (w / tiles / NKB) % Hkv, bk = w / tiles / NKB / Hkv;
    const int64_t k0 = kb * KB + t * TK, k1 = std::min({kb * KB + KB, Lkv, k0 + TK});
    if (k0 >= k1) continue;
    const int64_t cols = k1 - k0;
    int ldk;
    const float* Kp = nx_rows(k + bk * NX_I(ks0) + hk * NX_I(ks1), k0, cols, sc[s_ks2], sc[s_ks3], D, Kf.data(), ldk);
    nx_load_t(k + bk * NX_I(ks0) + hk * NX_I(ks1), k0, cols, sc[s_ks2], sc[s_ks3], D, Kt.data(), TK);
    nx_load_t(v + bk * NX_I(vs0) + hk * NX_I(vs1), k0, cols, sc[s_vs2], sc[s_vs3], Dv, Vt.data(), TK);
    std::fill(dK.begin(), dK.end(), 0.f);
    std::fill(dV.begin(), dV.end(), 0.f);
    // A key batch of 1 serves every query batch (broadcast): its gradients sum over them.
    for (int64_t b = Bk == 1 ? 0 : bk; b < (Bk == 1 ? B : bk + 1); ++b) {
      for (int64_t h = hk * G; h < hk * G + G; ++h) {
        const int64_t mcol = ((MB == 1 ? 0 : b) * MH + (MH == 1 ? 0 : h)) * NKB + kb;
        nx_for_tiles(qn, qix, mcol, NQB, QB, Lq, TQ, [&](bool full, int64_t q0, int64_t rows) {
          nx_load_rows(r, ptrs, sc, b, h, q0, rows);
          nx_tile_grads(r, Kt.data(), Vt.data(), S.data(), dP.data(), X.data(), TK, rows, cols, D, Dv, scale, full, b, h, q0, k0, sbufs, mbufs);
          nx_transpose(dP.data(), TK, rows, cols, T.data(), TQ);  // P^T
          nx_mm(cols, Dv, rows, T.data(), TQ, r.dO, r.ldo, dV.data(), Dv, true);
          nx_transpose(S.data(), TK, rows, cols, T.data(), TQ);   // dS^T
          nx_mm(cols, D, rows, T.data(), TQ, r.Q, r.ldq, dK.data(), D, true);
          if (dqa) nx_mm(rows, D, cols, S.data(), TK, Kp, ldk, dqa + ((b * Hq + h) * Lq + q0) * D, D, true);
        });
      }
    }
    nx_store(dk + bk * NX_I(gks0) + hk * NX_I(gks1), k0, cols, sc[s_gks2], sc[s_gks3], D, dK.data());
    nx_store(dv + bk * NX_I(gvs0) + hk * NX_I(gvs1), k0, cols, sc[s_gvs2], sc[s_gvs3], Dv, dV.data());
  }
  at::native::cpublas::brgemm_release();
}
)";

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream is(s);
  for (std::string line; std::getline(is, line);)
    if (!line.empty()) out.push_back(line);
  return out;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}

}  // namespace

std::string flex_attention_source(const std::string& program) {
  const auto lines = split_lines(program);
  TORCH_CHECK(!lines.empty(), "FlexAttention: empty program");
  std::istringstream head(lines[0]);
  std::string tag, dtype;
  int has_joint = 0;
  head >> tag >> dtype >> has_joint;
  TORCH_CHECK(tag == "flex", "FlexAttention: bad program header ", lines[0]);
  const char* storage = dtype == "Float" ? "float" : dtype == "BFloat16" ? "c10::BFloat16" : dtype == "Half" ? "c10::Half" : nullptr;
  TORCH_CHECK(storage, "FlexAttention: no generated kernel for ", dtype, " inputs");
  size_t pos = 1;
  const ScalarProgram score = parse_program(lines, pos), mask = parse_program(lines, pos);
  std::ostringstream os;
  os << kernel_prelude() << NEURONX_STR(NEURONX_NXBUF_DECL) << "\nusing nx_t = " << storage << ";\n";
#define NEURONX_NAME(f) os << "s_" #f ", ";
  os << "enum : int { ";
  NEURONX_FLEX_SCALARS(NEURONX_NAME)
  os << "};\n";
#undef NEURONX_NAME
#define NEURONX_NAME(f) os << "p_" #f ", ";
  os << "enum : int { ";
  NEURONX_FLEX_PTRS(NEURONX_NAME)
  os << "};\n";
#undef NEURONX_NAME
  os << kHelpers;
  os << emit_program(score, "nx_score", "float", {"float score", "int64_t b", "int64_t h", "int64_t q_idx", "int64_t kv_idx"});
  os << emit_program(mask, "nx_mask", "bool", {"int64_t b", "int64_t h", "int64_t q_idx", "int64_t kv_idx"});
  const std::string unpack = replace_all(kUnpack, "NX_TQ", std::to_string(kFlexQueryTile));
  os << replace_all(replace_all(kForward, "NX_UNPACK", unpack), "NX_TK", std::to_string(kFlexKeyTile));
  if (has_joint) {
    const ScalarProgram joint = parse_program(lines, pos);
    os << emit_program(joint, "nx_joint", "float",
                       {"float score", "int64_t b", "int64_t h", "int64_t q_idx", "int64_t kv_idx", "float grad"});
    os << replace_all(replace_all(kBackwardCommon, "NX_UNPACK", unpack), "NX_TKB", std::to_string(kFlexBackwardKeyTile));
  }
  return os.str();
}

}  // namespace neuronx::compiler
