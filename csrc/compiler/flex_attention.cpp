// The neuronx::flex_attention ops (flex_attention.h): validate, lay out the arguments, run the
// program's generated kernel over parallel_for. Registered for CPU: the compiled program runs
// them, like every op it does not lower itself, on CPU views of device memory.
#include "compiler/flex_attention.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <mutex>
#include <numeric>
#include <unordered_map>

namespace neuronx::compiler {

namespace {

std::mutex kernels_mu;

std::unordered_map<std::string, std::unique_ptr<FlexKernels>>& kernels() {
  static auto* m = new std::unordered_map<std::string, std::unique_ptr<FlexKernels>>();
  return *m;
}

// A new tensor of `sizes` laid out in the stride order of `like` (FlexAttention's outputs follow
// the query's, with the last dim innermost).
at::Tensor empty_like_order(at::IntArrayRef sizes, const at::Tensor& like, at::ScalarType dtype) {
  const int64_t n = static_cast<int64_t>(sizes.size());
  std::vector<int64_t> fill(n);
  std::iota(fill.begin(), fill.end(), 0);
  std::stable_sort(fill.begin(), fill.end(), [&](int64_t a, int64_t b) { return like.stride(a) < like.stride(b); });
  if (fill[0] != n - 1) {
    fill.erase(std::find(fill.begin(), fill.end(), n - 1));
    fill.insert(fill.begin(), n - 1);
  }
  std::vector<int64_t> strides(n);
  int64_t s = 1;
  for (int64_t d : fill) {
    strides[d] = s;
    s *= std::max<int64_t>(sizes[d], 1);
  }
  return at::empty_strided(sizes, strides, at::TensorOptions().dtype(dtype));
}

void put_strides(std::vector<double>& sc, int first, const at::Tensor& t) {
  for (int d = 0; d < 4; ++d) sc[first + d] = static_cast<double>(t.stride(d));
}

at::Tensor mask_tensor(const at::Tensor& t) { return t.to(at::kInt).contiguous(); }

struct Layout {
  std::vector<double> sc = std::vector<double>(s_count, 0.0);
  std::vector<char*> ptrs = std::vector<char*>(p_count, nullptr);
  std::vector<NxBuf> score_bufs, mask_bufs;
  std::vector<at::Tensor> keep;  // converted block-mask tensors, alive while the kernel runs
  int32_t out_of_range = 0;
};

std::vector<NxBuf> buffers(at::TensorList ts, int32_t* flag, const char* what) {
  std::vector<NxBuf> out;
  for (const at::Tensor& t : ts) {
    TORCH_CHECK(t.dim() <= 8, "FlexAttention: a captured ", what, " tensor has ", t.dim(), " dims (at most 8)");
    NxBuf b{};
    b.data = static_cast<const char*>(t.const_data_ptr());
    b.rank = t.dim();
    for (int64_t d = 0; d < t.dim(); ++d) {
      b.sizes[d] = t.size(d);
      b.strides[d] = t.stride(d);
    }
    b.out_of_range = flag;
    out.push_back(b);
  }
  if (out.empty()) {  // never read as a tensor; carries the error flag
    out.push_back(NxBuf{});
    out.back().out_of_range = flag;
  }
  return out;
}

// Shapes and the block mask, checked as flex_attention's own checks would report them.
Layout layout(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& kv_num,
              const at::Tensor& kv_idx, const std::optional<at::Tensor>& full_num,
              const std::optional<at::Tensor>& full_idx, at::TensorList score_buffers, at::TensorList mask_buffers,
              double scale, int64_t q_block, int64_t kv_block) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "FlexAttention: query, key and value must be 4-D "
              "[batch, heads, sequence, head_dim]; got ", q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
              "FlexAttention: query, key and value must have one dtype; got ", q.scalar_type(), ", ", k.scalar_type(),
              ", ", v.scalar_type());
  TORCH_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0 && k.size(1) == v.size(1),
              "FlexAttention: the query's heads (", q.size(1), ") must be a multiple of the key's and value's (",
              k.size(1), ", ", v.size(1), ")");
  TORCH_CHECK(k.size(0) == v.size(0) && (k.size(0) == q.size(0) || k.size(0) == 1),
              "FlexAttention: key/value batch ", k.size(0), " does not broadcast to the query's ", q.size(0));
  TORCH_CHECK(k.size(2) == v.size(2) && q.size(3) == k.size(3), "FlexAttention: mismatched key/value shapes ",
              k.sizes(), ", ", v.sizes(), " for query ", q.sizes());
  TORCH_CHECK(kv_num.dim() == 3 && kv_idx.dim() == 4, "FlexAttention: a block mask's kv_num_blocks must be 3-D and "
              "kv_indices 4-D; got ", kv_num.sizes(), ", ", kv_idx.sizes());
  TORCH_CHECK(q_block > 0 && kv_block > 0, "FlexAttention: block sizes must be positive");
  Layout L;
  auto& sc = L.sc;
  sc[s_B] = q.size(0), sc[s_Hq] = q.size(1), sc[s_Hkv] = k.size(1), sc[s_Bk] = k.size(0);
  sc[s_Lq] = q.size(2), sc[s_Lkv] = k.size(2), sc[s_D] = q.size(3), sc[s_Dv] = v.size(3);
  sc[s_QB] = static_cast<double>(q_block), sc[s_KB] = static_cast<double>(kv_block);
  sc[s_MB] = kv_idx.size(0), sc[s_MH] = kv_idx.size(1), sc[s_NQB] = kv_idx.size(2), sc[s_NKB] = kv_idx.size(3);
  sc[s_Scale] = scale;
  TORCH_CHECK((kv_idx.size(0) == 1 || kv_idx.size(0) == q.size(0)) && (kv_idx.size(1) == 1 || kv_idx.size(1) == q.size(1)),
              "FlexAttention: a block mask of shape ", kv_idx.sizes(), " does not broadcast to batch ", q.size(0),
              " and ", q.size(1), " heads");
  TORCH_CHECK(kv_idx.size(2) * q_block >= q.size(2) && kv_idx.size(3) * kv_block >= k.size(2),
              "FlexAttention: the block mask covers ", kv_idx.size(2) * q_block, " queries and ",
              kv_idx.size(3) * kv_block, " keys, fewer than the inputs' ", q.size(2), " and ", k.size(2),
              " (create the block mask for these sequence lengths)");
  TORCH_CHECK(kv_num.sizes() == kv_idx.sizes().slice(0, 3), "FlexAttention: kv_num_blocks ", kv_num.sizes(),
              " does not match kv_indices ", kv_idx.sizes());
  put_strides(sc, s_qs0, q);
  put_strides(sc, s_ks0, k);
  put_strides(sc, s_vs0, v);
  auto lists = [&](const at::Tensor& num, const at::Tensor& idx, int p_num, int p_idx) {
    at::Tensor n = mask_tensor(num), i = mask_tensor(idx);
    // The kernels read indices as given: check them once here.
    const int64_t nkb = i.size(3);
    const int32_t* np = n.const_data_ptr<int32_t>();
    const int32_t* ip = i.const_data_ptr<int32_t>();
    std::vector<int64_t> seen(nkb, -1);  // the row that last listed each block
    for (int64_t r = 0; r < n.numel(); ++r) {
      TORCH_CHECK(np[r] >= 0 && np[r] <= nkb, "FlexAttention: a block mask lists ", np[r], " blocks in a row of ", nkb);
      for (int64_t j = 0; j < np[r]; ++j) {
        const int32_t b = ip[r * nkb + j];
        TORCH_CHECK(b >= 0 && b < nkb, "FlexAttention: block index ", b, " out of range [0, ", nkb, ")");
        TORCH_CHECK(seen[b] != r, "FlexAttention: a block mask row lists block ", b, " twice");
        seen[b] = r;
      }
    }
    L.ptrs[p_num] = static_cast<char*>(n.data_ptr());
    L.ptrs[p_idx] = static_cast<char*>(i.data_ptr());
    L.keep.push_back(n);
    L.keep.push_back(i);
  };
  lists(kv_num, kv_idx, p_KvNum, p_KvIdx);
  if (full_num && full_idx && full_num->defined() && full_idx->defined()) {
    TORCH_CHECK(full_idx->sizes() == kv_idx.sizes() && full_num->sizes() == kv_num.sizes(),
                "FlexAttention: full_kv_num_blocks ", full_num->sizes(), " and full_kv_indices ", full_idx->sizes(),
                " do not match kv_num_blocks ", kv_num.sizes(), " and kv_indices ", kv_idx.sizes());
    lists(*full_num, *full_idx, p_FullKvNum, p_FullKvIdx);
  }
  L.ptrs[p_Q] = static_cast<char*>(const_cast<void*>(q.const_data_ptr()));
  L.ptrs[p_K] = static_cast<char*>(const_cast<void*>(k.const_data_ptr()));
  L.ptrs[p_V] = static_cast<char*>(const_cast<void*>(v.const_data_ptr()));
  L.score_bufs = buffers(score_buffers, &L.out_of_range, "score_mod");
  L.mask_bufs = buffers(mask_buffers, &L.out_of_range, "mask_mod");
  L.ptrs[p_ScoreBufs] = reinterpret_cast<char*>(L.score_bufs.data());
  L.ptrs[p_MaskBufs] = reinterpret_cast<char*>(L.mask_bufs.data());
  return L;
}

// The errors the mods flag while the kernels run (flex_attention_source.cpp: 1 an index out of
// range, 2 an integer division by zero).
void check_mods(const Layout& L) {
  TORCH_CHECK_INDEX(L.out_of_range != 1, "FlexAttention: a score_mod or mask_mod indexed a captured tensor out of range");
  TORCH_CHECK(L.out_of_range != 2, "FlexAttention: a score_mod or mask_mod divided an integer by zero (ZeroDivisionError)");
}

void run(KernelFn fn, Layout& L, int64_t items) {
  at::parallel_for(0, items, 1, [&](int64_t b, int64_t e) { fn(L.ptrs.data(), L.sc.data(), b, e); });
  check_mods(L);
}

// Above this, the backward's per-thread dQ accumulators give way to a second kernel.
constexpr double kGradQueryAccumulatorBytes = 512.0 * 1024 * 1024;

int64_t tiles(int64_t block, int64_t length, int64_t tile) { return (std::min(block, length) + tile - 1) / tile; }

const FlexKernels& checked_kernels(const at::Tensor& q, c10::string_view program) {
  const std::string p(program);
  const std::string head = p.substr(0, p.find('\n'));
  TORCH_CHECK(head.rfind(std::string("flex ") + c10::toString(q.scalar_type()) + " ", 0) == 0,
              "FlexAttention: a program for ", head, " run on ", q.scalar_type(), " inputs");
  return flex_kernels(p, nullptr);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> flex_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& kv_num, const at::Tensor& kv_idx,
    const std::optional<at::Tensor>& full_num, const std::optional<at::Tensor>& full_idx, at::TensorList score_buffers,
    at::TensorList mask_buffers, double scale, int64_t q_block, int64_t kv_block, c10::string_view program) {
  Layout L = layout(q, k, v, kv_num, kv_idx, full_num, full_idx, score_buffers, mask_buffers, scale, q_block, kv_block);
  const FlexKernels& fk = checked_kernels(q, program);
  at::Tensor out = empty_like_order({q.size(0), q.size(1), q.size(2), v.size(3)}, q, q.scalar_type());
  at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, at::TensorOptions().dtype(at::kFloat));
  at::Tensor mx = at::empty({q.size(0), q.size(1), q.size(2)}, at::TensorOptions().dtype(at::kFloat));
  put_strides(L.sc, s_os0, out);
  L.ptrs[p_Out] = static_cast<char*>(out.data_ptr());
  L.ptrs[p_Lse] = static_cast<char*>(lse.data_ptr());
  L.ptrs[p_Max] = static_cast<char*>(mx.data_ptr());
  run(fk.forward, L, q.size(0) * q.size(1) * kv_idx.size(2) * tiles(q_block, q.size(2), kFlexQueryTile));
  return {out, lse, mx};
}

// The block mask transposed: per block of keys, the blocks of queries that list it.
void transpose_lists(Layout& L, int p_num, int p_idx, int p_tnum, int p_tidx) {
  if (!L.ptrs[p_num]) return;
  const int64_t MB = L.sc[s_MB], MH = L.sc[s_MH], NQB = L.sc[s_NQB], NKB = L.sc[s_NKB];
  at::Tensor tn = at::empty({MB, MH, NKB}, at::TensorOptions().dtype(at::kInt)).zero_();
  at::Tensor ti = at::empty({MB, MH, NKB, NQB}, at::TensorOptions().dtype(at::kInt));
  const auto* num = reinterpret_cast<const int32_t*>(L.ptrs[p_num]);
  const auto* idx = reinterpret_cast<const int32_t*>(L.ptrs[p_idx]);
  int32_t* n = tn.data_ptr<int32_t>();
  int32_t* i = ti.data_ptr<int32_t>();
  for (int64_t mh = 0; mh < MB * MH; ++mh)
    for (int64_t qb = 0; qb < NQB; ++qb) {
      const int64_t row = mh * NQB + qb;
      for (int64_t j = 0; j < num[row]; ++j) {
        const int64_t col = mh * NKB + idx[row * NKB + j];
        i[col * NQB + n[col]++] = static_cast<int32_t>(qb);
      }
    }
  L.ptrs[p_tnum] = static_cast<char*>(tn.data_ptr());
  L.ptrs[p_tidx] = static_cast<char*>(ti.data_ptr());
  L.keep.push_back(tn);
  L.keep.push_back(ti);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> flex_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
    const at::Tensor& grad_out, const std::optional<at::Tensor>& grad_lse, const at::Tensor& kv_num,
    const at::Tensor& kv_idx, const std::optional<at::Tensor>& full_num, const std::optional<at::Tensor>& full_idx,
    at::TensorList score_buffers, at::TensorList mask_buffers, double scale, int64_t q_block, int64_t kv_block,
    c10::string_view program) {
  Layout L = layout(q, k, v, kv_num, kv_idx, full_num, full_idx, score_buffers, mask_buffers, scale, q_block, kv_block);
  const FlexKernels& fk = checked_kernels(q, program);
  TORCH_CHECK(fk.grad_query && fk.grad_key_value, "FlexAttention: the program has no score_mod gradient");
  TORCH_CHECK(out.sizes() == at::IntArrayRef({q.size(0), q.size(1), q.size(2), v.size(3)}) && out.sizes() == grad_out.sizes(),
              "FlexAttention backward: out ", out.sizes(), " and grad_out ", grad_out.sizes(), " do not match the inputs");
  TORCH_CHECK(out.scalar_type() == q.scalar_type() && grad_out.scalar_type() == q.scalar_type(),
              "FlexAttention backward: out and grad_out must be ", q.scalar_type());
  // Per query row, once: the logsumexp in natural-log units, Delta = rowsum(dO * O), and the
  // logsumexp's gradient in the same units.
  constexpr double ln2 = 0.69314718055994530942;
  const at::Tensor lse_e = lse.to(at::kFloat).mul(ln2).contiguous();
  TORCH_CHECK(lse_e.sizes() == at::IntArrayRef({q.size(0), q.size(1), q.size(2)}), "FlexAttention backward: logsumexp ",
              lse.sizes(), " does not match the query");
  const at::Tensor delta = grad_out.to(at::kFloat).mul(out.to(at::kFloat)).sum(-1).contiguous();
  at::Tensor glse;
  if (grad_lse && grad_lse->defined()) glse = grad_lse->to(at::kFloat).div(ln2).expand_as(lse_e).contiguous();
  put_strides(L.sc, s_gos0, grad_out);
  L.ptrs[p_GradOut] = static_cast<char*>(const_cast<void*>(grad_out.const_data_ptr()));
  L.ptrs[p_Lse] = static_cast<char*>(const_cast<void*>(lse_e.const_data_ptr()));
  L.ptrs[p_Delta] = static_cast<char*>(const_cast<void*>(delta.const_data_ptr()));
  L.ptrs[p_GradLse] = glse.defined() ? static_cast<char*>(glse.data_ptr()) : nullptr;
  at::Tensor dq = empty_like_order(q.sizes(), q, q.scalar_type());
  at::Tensor dk = empty_like_order(k.sizes(), k, k.scalar_type());
  at::Tensor dv = empty_like_order(v.sizes(), v, v.scalar_type());
  put_strides(L.sc, s_gqs0, dq);
  put_strides(L.sc, s_gks0, dk);
  put_strides(L.sc, s_gvs0, dv);
  L.ptrs[p_GradQ] = static_cast<char*>(dq.data_ptr());
  L.ptrs[p_GradK] = static_cast<char*>(dk.data_ptr());
  L.ptrs[p_GradV] = static_cast<char*>(dv.data_ptr());
  transpose_lists(L, p_KvNum, p_KvIdx, p_QNum, p_QIdx);
  transpose_lists(L, p_FullKvNum, p_FullKvIdx, p_FullQNum, p_FullQIdx);
  const int64_t kv_items = k.size(0) * k.size(1) * kv_idx.size(3) * tiles(kv_block, k.size(2), kFlexBackwardKeyTile);
  const int threads = std::max(1, std::min<int>(at::get_num_threads(), static_cast<int>(kv_items)));
  if (static_cast<double>(threads) * static_cast<double>(q.numel()) * sizeof(float) > kGradQueryAccumulatorBytes) {
    run(fk.grad_query, L, q.size(0) * q.size(1) * kv_idx.size(2) * tiles(q_block, q.size(2), kFlexQueryTile));
    run(fk.grad_key_value, L, kv_items);
    return {dq, dk, dv};
  }
  // One pass: dQ summed over per-thread float accumulators.
  std::vector<at::Tensor> acc(at::get_num_threads());
  at::parallel_for(0, kv_items, 1, [&](int64_t b, int64_t e) {
    at::Tensor& mine = acc.at(at::get_thread_num());
    if (!mine.defined()) mine = at::zeros(q.sizes(), at::TensorOptions().dtype(at::kFloat));
    std::vector<char*> ptrs = L.ptrs;
    ptrs[p_GradQAcc] = static_cast<char*>(mine.data_ptr());
    fk.grad_key_value(ptrs.data(), L.sc.data(), b, e);
  });
  check_mods(L);
  at::Tensor sum;
  for (const at::Tensor& a : acc)
    if (a.defined()) sum = sum.defined() ? sum.add_(a) : a;
  if (sum.defined()) dq.copy_(sum);
  else dq.zero_();
  return {dq, dk, dv};
}

}  // namespace

const FlexKernels& flex_kernels(const std::string& program, BuildStats* stats) {
  std::lock_guard<std::mutex> g(kernels_mu);
  auto it = kernels().find(program);
  if (it != kernels().end()) return *it->second;
  const bool backward = program.rfind("flex ", 0) == 0 && program.substr(0, program.find('\n')).back() == '1';
  std::vector<std::string> names{"nx_flex_forward"};
  if (backward) names.insert(names.end(), {"nx_flex_grad_query", "nx_flex_grad_key_value"});
  auto k = std::make_unique<FlexKernels>();
  BuildStats local;
  auto fns = KernelCache::instance().load({flex_attention_source(program)}, {names}, k->libraries, stats ? *stats : local);
  k->forward = fns.at(0).at(0);
  if (backward) {
    k->grad_query = fns[0].at(1);
    k->grad_key_value = fns[0].at(2);
  }
  return *kernels().emplace(program, std::move(k)).first->second;
}

TORCH_LIBRARY(neuronx, m) {
  m.def("flex_attention(Tensor query, Tensor key, Tensor value, Tensor kv_num_blocks, Tensor kv_indices, "
        "Tensor? full_kv_num_blocks, Tensor? full_kv_indices, Tensor[] score_mod_buffers, Tensor[] mask_mod_buffers, "
        "float scale, int q_block, int kv_block, str program) -> (Tensor, Tensor, Tensor)");
  m.def("flex_attention_backward(Tensor query, Tensor key, Tensor value, Tensor out, Tensor logsumexp, "
        "Tensor grad_out, Tensor? grad_logsumexp, Tensor kv_num_blocks, Tensor kv_indices, Tensor? full_kv_num_blocks, "
        "Tensor? full_kv_indices, Tensor[] score_mod_buffers, Tensor[] mask_mod_buffers, float scale, int q_block, "
        "int kv_block, str program) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(neuronx, CPU, m) {
  m.impl("flex_attention", &flex_forward);
  m.impl("flex_attention_backward", &flex_backward);
}

}  // namespace neuronx::compiler
