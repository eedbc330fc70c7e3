// max_pool2d_with_indices over contiguous (N)CHW inputs, and its backward over disjoint windows
// (device_kernels.h). ATen's NCHW kernel
// decides every element with a branch on data (`v > max || isnan(v)`), which mispredicts about
// half the time on real activations: 8.6 ms for a 32x32x64x64 input on this machine, against
// 0.9 ms for its channels-last kernel. Here the same decisions are selects, and a 2x2 window of
// stride 2 (the common pooling) has its own loop.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/native/Pool.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/max_pool2d_with_indices.h>
#include <ATen/ops/max_pool2d_with_indices_backward.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>

#include <c10/util/bit_cast.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "backend/device_kernels.h"

// (-O2 leaves the window loops scalar.)
#pragma GCC optimize("O3")

namespace neuronx {

namespace {

struct Window {
  int64_t kH, kW, sH, sW, pH, pW, dH, dW;
};

// An int[2] argument (one value: both dims; none: `dflt`).
bool pair(const c10::IValue& v, int64_t& h, int64_t& w, const int64_t* dflt) {
  if (!v.isIntList()) return false;
  const auto l = v.toIntVector();
  if (l.empty() && dflt) {
    h = dflt[0];
    w = dflt[1];
  } else if (l.size() == 1) {
    h = w = l[0];
  } else if (l.size() == 2) {
    h = l[0];
    w = l[1];
  } else {
    return false;
  }
  return true;
}

// The window's maximum and its flat index in the plane, in ATen's scan order and with its rules:
// the first of equal maxima, the last NaN, and the first in-bounds element when every value is
// -inf.
template <typename T>
inline void take(T v, int64_t i, T& m, int64_t& best) {
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  // Blended with masks, not selected: a compiler turns `t ? v : m` back into a branch.
  const Bits t = static_cast<Bits>((v > m) | (v != v));
  const Bits vb = c10::bit_cast<Bits>(v), mb = c10::bit_cast<Bits>(m);
  m = c10::bit_cast<T>(static_cast<Bits>((vb & (Bits{0} - t)) | (mb & (t - 1))));
  const uint64_t im = uint64_t{0} - static_cast<uint64_t>(t);
  best = static_cast<int64_t>((static_cast<uint64_t>(i) & im) | (static_cast<uint64_t>(best) & ~im));
}

template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default")))
void pool_plane(const T* __restrict__ in, T* __restrict__ out, int64_t* __restrict__ idx, int64_t H, int64_t W, int64_t OH, int64_t OW, const Window& p) {
  const T lowest = -std::numeric_limits<T>::infinity();
  const bool two_by_two = p.kH == 2 && p.kW == 2 && p.sH == 2 && p.sW == 2 && p.pH == 0 && p.pW == 0 && p.dH == 1 &&
                          p.dW == 1;
  for (int64_t oh = 0; oh < OH; ++oh) {
    int64_t ih0 = oh * p.sH - p.pH;
    const int64_t ih1 = std::min(ih0 + (p.kH - 1) * p.dH + 1, H);
    while (ih0 < 0) ih0 += p.dH;
    T* __restrict__ o = out + oh * OW;
    int64_t* __restrict__ x = idx + oh * OW;
    int64_t ow = 0;
    if (two_by_two && ih0 + 1 < ih1) {
      // Element k of the window in scan order: (ih0, c), (ih0, c + 1), (ih0 + 1, c), (ih0 + 1, c + 1).
      // The first is always taken (it beats the initial -inf, or is NaN, or is -inf and its index
      // is the initial one). Independent across outputs, so the loop runs in vector lanes.
      const T* r0 = in + ih0 * W;
      const T* r1 = r0 + W;
      const int64_t full = std::min(OW, W / 2);
      const int64_t row = ih0 * W;
      for (; ow < full; ++ow) {
        const int64_t c = 2 * ow;
        T m = r0[c];
        int32_t k = 0;
        const T v1 = r0[c + 1], v2 = r1[c], v3 = r1[c + 1];
        bool t = v1 > m || v1 != v1;
        m = t ? v1 : m;
        k = t ? 1 : k;
        t = v2 > m || v2 != v2;
        m = t ? v2 : m;
        k = t ? 2 : k;
        t = v3 > m || v3 != v3;
        m = t ? v3 : m;
        k = t ? 3 : k;
        o[ow] = m;
        x[ow] = row + c + (k & 1) + (k >> 1) * W;
      }
    }
    // Outputs whose windows lie inside the row (horizontally): one pass per window element, in
    // scan order, over all of them (vector lanes across outputs; o and x hold the running
    // maxima and their indices).
    const int64_t lo = std::max<int64_t>(ow, (p.pW + p.sW - 1) / p.sW);
    const int64_t last = W + p.pW - (p.kW - 1) * p.dW - 1;  // the last window start inside the row
    const int64_t hi = last < 0 ? 0 : std::min<int64_t>(OW, last / p.sW + 1);
    if (!two_by_two && hi - lo >= 8 && ow == 0) {
      for (int64_t j = lo; j < hi; ++j) {
        o[j] = lowest;
        x[j] = ih0 * W + j * p.sW - p.pW;
      }
      for (int64_t ih = ih0; ih < ih1; ih += p.dH)
        for (int64_t kw = 0; kw < p.kW; ++kw) {
          const int64_t off = ih * W + kw * p.dW - p.pW;
          for (int64_t j = lo; j < hi; ++j) {
            const int64_t i = off + j * p.sW;
            const T v = in[i];
            const bool t = v > o[j] || v != v;
            o[j] = t ? v : o[j];
            x[j] = t ? i : x[j];
          }
        }
    }
    for (; ow < OW; ++ow) {
      if (!two_by_two && hi - lo >= 8 && ow == lo) {
        ow = hi - 1;  // (done above)
        continue;
      }
      int64_t iw0 = ow * p.sW - p.pW;
      const int64_t iw1 = std::min(iw0 + (p.kW - 1) * p.dW + 1, W);
      while (iw0 < 0) iw0 += p.dW;
      T m = lowest;
      int64_t best = ih0 * W + iw0;
      for (int64_t ih = ih0; ih < ih1; ih += p.dH)
        for (int64_t iw = iw0; iw < iw1; iw += p.dW) take(in[ih * W + iw], ih * W + iw, m, best);
      o[ow] = m;
      x[ow] = best;
    }
  }
}

bool run(const at::Tensor& out, const at::Tensor& idx, const at::Tensor& in, const Window& p) {
  const int64_t H = in.size(-2), W = in.size(-1), OH = out.size(-2), OW = out.size(-1);
  const int64_t planes = H * W == 0 ? 0 : in.numel() / (H * W);
  if (OH * OW == 0 || planes == 0) return true;
  AT_DISPATCH_FLOATING_TYPES(in.scalar_type(), "neuron_max_pool2d", [&] {
    const scalar_t* src = in.const_data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    int64_t* ind = idx.data_ptr<int64_t>();
    at::parallel_for(0, planes, std::max<int64_t>(1, 16384 / (OH * OW)), [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c)
        pool_plane(src + c * H * W, dst + c * OH * OW, ind + c * OH * OW, H, W, OH, OW, p);
    });
  });
  return true;
}

// Whether run() gives ATen's values and indices: small integer values (ties everywhere), NaNs and
// -inf, over the windows users write (2x2; 3x3 stride 2 padded, as ResNet's stem; dilated; ceil
// mode; rectangular).
bool matches_cpu() {
  // (values from the index, not a generator: the probe must not move anyone's random stream)
  at::Tensor x = at::arange(2 * 3 * 11 * 13, at::kLong).mul_(40503).remainder_(7).sub_(3).to(at::kFloat);
  x.slice(0, 0, c10::nullopt, 37).fill_(std::numeric_limits<float>::quiet_NaN());
  x.slice(0, 5, c10::nullopt, 41).fill_(-std::numeric_limits<float>::infinity());
  x = x.view({2, 3, 11, 13});
  at::Tensor ninf = at::full({1, 2, 4, 4}, -std::numeric_limits<float>::infinity());
  struct Case {
    at::Tensor in;
    std::vector<int64_t> k, s, pad, d;
    bool ceil;
  };
  const Case cases[] = {{x, {2, 2}, {2, 2}, {0, 0}, {1, 1}, false}, {x, {3, 3}, {2, 2}, {1, 1}, {1, 1}, false},
                        {x, {3, 3}, {1, 1}, {1, 1}, {2, 2}, false}, {x, {2, 2}, {2, 2}, {0, 0}, {1, 1}, true},
                        {x, {2, 3}, {1, 2}, {1, 0}, {1, 1}, true},  {ninf, {2, 2}, {2, 2}, {1, 1}, {1, 1}, false}};
  for (const Case& c : cases) {
    auto [ref, ref_idx] = at::max_pool2d_with_indices(c.in, c.k, c.s, c.pad, c.d, c.ceil);
    at::Tensor out = at::empty_like(ref), idx = at::empty_like(ref_idx);
    run(out, idx, c.in, Window{c.k[0], c.k[1], c.s[0], c.s[1], c.pad[0], c.pad[1], c.d[0], c.d[1]});
    if (!at::equal(ref_idx, idx) || !at::equal(ref.view(at::kInt), out.view(at::kInt))) return false;  // (bits: NaNs)
  }
  return true;
}

// The backward over disjoint windows (stride = kernel, no padding or dilation): every input
// element lies in at most one window, so each is written once, in order: its window's gradient
// where the window's index names it, else 0. ATen zero-fills, then adds each window's gradient at
// its index: 0 + g (so -0 becomes +0, kept here). Returns how many windows' indices were found in
// their windows: fewer than the windows means an index that points elsewhere (indices not from
// the forward), and ATen's kernel must run instead.
template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default")))
int64_t unpool_plane(T* __restrict__ gi, const T* __restrict__ go, const int64_t* __restrict__ idx, int64_t H,
                     int64_t W, int64_t OH, int64_t OW, int64_t kH, int64_t kW) {
  int64_t found = 0;
  const int64_t covered_w = std::min(OW * kW, W);
  for (int64_t h = 0; h < H; ++h) {
    T* __restrict__ row = gi + h * W;
    const int64_t oh = h / kH;
    if (oh >= OH) {
      for (int64_t w = 0; w < W; ++w) row[w] = T(0);
      continue;
    }
    const T* __restrict__ g = go + oh * OW;
    const int64_t* __restrict__ x = idx + oh * OW;
    const int64_t base = h * W;
    if (kW == 2 && covered_w == 2 * OW) {
      for (int64_t ow = 0; ow < OW; ++ow) {
        const int64_t i = base + 2 * ow;
        const T v = T(0) + g[ow];
        const bool a = x[ow] == i, b = x[ow] == i + 1;
        row[2 * ow] = a ? v : T(0);
        row[2 * ow + 1] = b ? v : T(0);
        found += a + b;
      }
    } else {
      for (int64_t w = 0; w < covered_w; ++w) {
        const int64_t ow = w / kW;
        const bool a = x[ow] == base + w;
        row[w] = a ? T(0) + g[ow] : T(0);
        found += a;
      }
    }
    for (int64_t w = covered_w; w < W; ++w) row[w] = T(0);
  }
  return found;
}

// The same over channels-last planes: element (h, w, c) of one image; vector lanes across c.
template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default")))
int64_t unpool_rows_cl(T* __restrict__ gi, const T* __restrict__ go, const int64_t* __restrict__ idx, int64_t h,
                       int64_t H, int64_t W, int64_t C, int64_t OH, int64_t OW, int64_t kH, int64_t kW) {
  int64_t found = 0;
  const int64_t oh = h / kH;
  T* __restrict__ row = gi + h * W * C;
  for (int64_t w = 0; w < W; ++w) {
    T* __restrict__ o = row + w * C;
    const int64_t ow = w / kW;
    if (oh >= OH || ow >= OW) {
      for (int64_t c = 0; c < C; ++c) o[c] = T(0);
      continue;
    }
    const T* __restrict__ g = go + (oh * OW + ow) * C;
    const int64_t* __restrict__ x = idx + (oh * OW + ow) * C;
    const int64_t i = h * W + w;
    for (int64_t c = 0; c < C; ++c) {
      const bool a = x[c] == i;
      o[c] = a ? T(0) + g[c] : T(0);
      found += a;
    }
  }
  return found;
}

// gi = ATen's max_pool2d_with_indices_backward for disjoint kH x kW windows; false (gi partly
// written) when an index lies outside its window.
bool unpool(const at::Tensor& gi, const at::Tensor& go, const at::Tensor& idx, int64_t kH, int64_t kW, bool cl) {
  const int64_t H = gi.size(-2), W = gi.size(-1), OH = go.size(-2), OW = go.size(-1);
  const int64_t images = gi.dim() == 4 ? gi.size(0) : 1, C = gi.size(-3);
  if (gi.numel() == 0) return true;
  std::atomic<int64_t> found{0};
  AT_DISPATCH_FLOATING_TYPES(gi.scalar_type(), "neuron_max_pool2d_backward", [&] {
    scalar_t* dst = gi.data_ptr<scalar_t>();
    const scalar_t* src = go.const_data_ptr<scalar_t>();
    const int64_t* ind = idx.const_data_ptr<int64_t>();
    if (cl) {
      at::parallel_for(0, images * H, std::max<int64_t>(1, 16384 / (W * C)), [&](int64_t b, int64_t e) {
        int64_t f = 0;
        for (int64_t r = b; r < e; ++r) {
          const int64_t n = r / H;
          f += unpool_rows_cl(dst + n * H * W * C, src + n * OH * OW * C, ind + n * OH * OW * C, r % H, H, W, C, OH,
                              OW, kH, kW);
        }
        found += f;
      });
    } else {
      at::parallel_for(0, images * C, std::max<int64_t>(1, 16384 / (H * W)), [&](int64_t b, int64_t e) {
        int64_t f = 0;
        for (int64_t p = b; p < e; ++p)
          f += unpool_plane(dst + p * H * W, src + p * OH * OW, ind + p * OH * OW, H, W, OH, OW, kH, kW);
        found += f;
      });
    }
  });
  return found.load() == images * C * OH * OW;
}

// Whether unpool() gives ATen's gradients (bit for bit) over the forward's own indices, both
// layouts, floor and ceil mode (partial windows, uncovered rows), and steps aside on an index
// outside its window.
bool unpool_matches_cpu() {
  at::Tensor x = at::arange(2 * 3 * 11 * 13, at::kLong).mul_(40503).remainder_(7).sub_(3).to(at::kFloat);
  x.slice(0, 0, c10::nullopt, 37).fill_(std::numeric_limits<float>::quiet_NaN());
  x = x.view({2, 3, 11, 13});
  for (bool cl : {false, true})
    for (int64_t k : {2, 3})
      for (bool ceil : {false, true}) {
        at::Tensor in = cl ? x.contiguous(at::MemoryFormat::ChannelsLast) : x;
        auto [out, idx] = at::max_pool2d_with_indices(in, {k, k}, {k, k}, {0, 0}, {1, 1}, ceil);
        // Gradients with -0 and NaN among them.
        at::Tensor go = at::arange(out.numel(), at::kFloat).remainder_(5).sub_(2).mul_(-0.5).view(out.sizes());
        go.view(-1).slice(0, 0, c10::nullopt, 11).fill_(-0.0);
        go.view(-1).slice(0, 3, c10::nullopt, 17).fill_(std::numeric_limits<float>::quiet_NaN());
        go = cl ? go.contiguous(at::MemoryFormat::ChannelsLast) : go;
        const at::Tensor ref = at::max_pool2d_with_indices_backward(go, in, {k, k}, {k, k}, {0, 0}, {1, 1}, ceil, idx);
        const auto fmt = cl ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
        at::Tensor gi = at::empty(ref.sizes(), ref.options().memory_format(fmt));
        idx = idx.contiguous(fmt);
        if (!unpool(gi, go, idx, k, k, cl) ||
            !at::equal(ref.view(at::kInt), gi.view(at::kInt)))
          return false;
        at::Tensor bad = idx.clone();
        int64_t* first = bad.data_ptr<int64_t>();  // element (0, 0, 0, 0) in either layout
        *first = (*first + 5 * 13) % (11 * 13);     // 5 rows down: outside its window
        if (unpool(gi, go, bad, k, k, cl)) return false;
      }
  return true;
}

}  // namespace

bool max_pool2d_kernel(c10::ArrayRef<at::Tensor> outs, c10::ArrayRef<c10::IValue> args) {
  // (self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, int[2] dilation=1, bool ceil_mode=False)
  if (outs.size() != 2 || args.size() != 6 || !args[0].isTensor()) return false;
  const at::Tensor& in = args[0].toTensor();
  const at::Tensor &out = outs[0], &idx = outs[1];
  if (!out.defined() || !idx.defined() || (in.dim() != 3 && in.dim() != 4) || !in.is_contiguous() ||
      !out.is_contiguous() || !idx.is_contiguous() ||
      (in.scalar_type() != at::kFloat && in.scalar_type() != at::kDouble) || out.scalar_type() != in.scalar_type() ||
      idx.scalar_type() != at::kLong || out.dim() != in.dim() || idx.sizes() != out.sizes() ||
      in.numel() / std::max<int64_t>(1, in.size(-2) * in.size(-1)) !=
          out.numel() / std::max<int64_t>(1, out.size(-2) * out.size(-1)))
    return false;
  Window p{};
  if (!pair(args[1], p.kH, p.kW, nullptr)) return false;
  const int64_t k[2] = {p.kH, p.kW}, zero[2] = {0, 0}, one[2] = {1, 1};
  if (!pair(args[2], p.sH, p.sW, k) || !pair(args[3], p.pH, p.pW, zero) || !pair(args[4], p.dH, p.dW, one))
    return false;
  if (p.kH <= 0 || p.kW <= 0 || p.sH <= 0 || p.sW <= 0 || p.dH <= 0 || p.dW <= 0 || p.pH < 0 || p.pW < 0 ||
      p.pH > p.kH / 2 || p.pW > p.kW / 2)
    return false;  // (ATen's kernel raises its error)
  // The output sizes ATen's shape formula gives (the loops rely on them).
  if (!args[5].isBool()) return false;
  const bool ceil = args[5].toBool();
  auto extent = [&](int64_t size, int64_t k, int64_t pad, int64_t stride, int64_t dil) {
    return at::native::pooling_output_shape<int64_t>(size, k, pad, stride, dil, ceil);
  };
  if (out.size(-2) != extent(in.size(-2), p.kH, p.pH, p.sH, p.dH) ||
      out.size(-1) != extent(in.size(-1), p.kW, p.pW, p.sW, p.dW))
    return false;
  static const bool same = matches_cpu();
  return same && run(out, idx, in, p);
}

}  // namespace neuronx

namespace neuronx {

bool max_pool2d_backward_kernel(c10::ArrayRef<at::Tensor> outs, c10::ArrayRef<c10::IValue> args) {
  // (grad_output, self, int[2] kernel_size, int[2] stride, int[2] padding, int[2] dilation, bool ceil_mode,
  //  indices)
  if (outs.size() != 1 || args.size() != 8 || !args[0].isTensor() || !args[1].isTensor() || !args[7].isTensor() ||
      !args[6].isBool())
    return false;
  const at::Tensor &go = args[0].toTensor(), &in = args[1].toTensor(), &idx = args[7].toTensor(), &gi = outs[0];
  if (!gi.defined() || (in.dim() != 3 && in.dim() != 4) || go.dim() != in.dim() || idx.sizes() != go.sizes() ||
      gi.sizes() != in.sizes() || (in.scalar_type() != at::kFloat && in.scalar_type() != at::kDouble) ||
      go.scalar_type() != in.scalar_type() || gi.scalar_type() != in.scalar_type() || idx.scalar_type() != at::kLong)
    return false;
  // One layout for all three: contiguous, or channels-last (4-D).
  const bool cl = in.dim() == 4 && gi.is_contiguous(at::MemoryFormat::ChannelsLast) && !gi.is_contiguous();
  const auto fmt = cl ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  if (!gi.is_contiguous(fmt) || !go.is_contiguous(fmt) || !idx.is_contiguous(fmt)) return false;
  if (in.dim() == 4 ? go.size(0) != in.size(0) || go.size(1) != in.size(1) : go.size(0) != in.size(0)) return false;
  Window p{};
  if (!pair(args[2], p.kH, p.kW, nullptr)) return false;
  const int64_t k[2] = {p.kH, p.kW}, zero[2] = {0, 0}, one[2] = {1, 1};
  if (!pair(args[3], p.sH, p.sW, k) || !pair(args[4], p.pH, p.pW, zero) || !pair(args[5], p.dH, p.dW, one))
    return false;
  // Disjoint windows only (overlapping ones add up several gradients per element).
  if (p.kH <= 0 || p.kW <= 0 || p.sH != p.kH || p.sW != p.kW || p.pH != 0 || p.pW != 0 || p.dH != 1 || p.dW != 1)
    return false;
  const bool ceil = args[6].toBool();
  // An empty window grid or plane: ATen's checks raise their errors ("Output size is too small").
  if (go.size(-2) <= 0 || go.size(-1) <= 0 || in.size(-2) <= 0 || in.size(-1) <= 0) return false;
  if (go.size(-2) != at::native::pooling_output_shape<int64_t>(in.size(-2), p.kH, 0, p.sH, 1, ceil) ||
      go.size(-1) != at::native::pooling_output_shape<int64_t>(in.size(-1), p.kW, 0, p.sW, 1, ceil))
    return false;
  static const bool same = unpool_matches_cpu();
  return same && unpool(gi, go, idx, p.kH, p.kW, cl);
}

}  // namespace neuronx
