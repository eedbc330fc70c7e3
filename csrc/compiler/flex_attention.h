#pragma once
// FlexAttention (torch.nn.attention.flex_attention under torch.compile): the flex_attention and
// flex_attention_backward higher-order ops are exported as the ops neuronx::flex_attention and
// neuronx::flex_attention_backward, whose last argument is the "program": the query's dtype and
// the score_mod, mask_mod and (backward) the score_mod's gradient as scalar programs
// (scalar_program.h). Each program gets one generated kernel: blocks of queries against the
// blocks of keys the block mask lists, with an online softmax, the score_mod inlined, fully
// masked blocks skipped, partial blocks masked per element by the inlined mask_mod. The
// backward runs two kernels: dQ per block of queries, dK and dV per block of keys (over the
// block mask transposed), so no two threads write the same gradient.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "compiler/kernel_cache.h"

namespace neuronx::compiler {

// A captured tensor a program reads (score_mod_other_buffers, mask_mod_other_buffers). The
// declaration is also emitted into the generated source, from this one macro.
#define NEURONX_NXBUF_DECL                                                                           \
  struct NxBuf {                                                                                     \
    const char* data;                                                                                \
    int64_t sizes[8];                                                                                \
    int64_t strides[8];                                                                              \
    int64_t rank;                                                                                    \
    int32_t* out_of_range; /* the mods' error: 1 index out of range, 2 integer division by zero */    \
  };
NEURONX_NXBUF_DECL

// The kernels' arguments: scalars[s_<name>] (integers as doubles, exact below 2^53) and
// ptrs[p_<name>]. The backward's Lse, Delta and GradLse are float [B, Hq, Lq] in natural log
// units (the forward writes Lse in log2 units, as FlexAttention's kernels do). Strides are in elements; the block mask is [MB, MH, NQB(, NKB)] int32 (MB, MH
// are 1 when broadcast); the transposed lists (backward) are [MB, MH, NKB(, NQB)].
#define NEURONX_FLEX_SCALARS(X)                                                                     \
  X(B) X(Hq) X(Hkv) X(Bk) X(Lq) X(Lkv) X(D) X(Dv) X(QB) X(KB) X(NQB) X(NKB) X(MB) X(MH) X(Scale)    \
  X(qs0) X(qs1) X(qs2) X(qs3) X(ks0) X(ks1) X(ks2) X(ks3) X(vs0) X(vs1) X(vs2) X(vs3)               \
  X(os0) X(os1) X(os2) X(os3) X(gos0) X(gos1) X(gos2) X(gos3) X(gqs0) X(gqs1) X(gqs2) X(gqs3)        \
  X(gks0) X(gks1) X(gks2) X(gks3) X(gvs0) X(gvs1) X(gvs2) X(gvs3)
#define NEURONX_FLEX_PTRS(X)                                                                         \
  X(Q) X(K) X(V) X(Out) X(Lse) X(Max) X(GradOut) X(GradLse) X(GradQ) X(GradK) X(GradV) X(KvNum)     \
  X(KvIdx) X(FullKvNum) X(FullKvIdx) X(QNum) X(QIdx) X(FullQNum) X(FullQIdx) X(ScoreBufs) X(MaskBufs)        \
  X(GradQAcc) X(Delta)

#define NEURONX_FLEX_ENUM(f) s_##f,
enum FlexScalar : int { NEURONX_FLEX_SCALARS(NEURONX_FLEX_ENUM) s_count };
#undef NEURONX_FLEX_ENUM
#define NEURONX_FLEX_ENUM(f) p_##f,
enum FlexPtr : int { NEURONX_FLEX_PTRS(NEURONX_FLEX_ENUM) p_count };
#undef NEURONX_FLEX_ENUM

// Query rows and key rows per tile (the forward's key tile is wider: one GEMM per tile pair).
constexpr int64_t kFlexQueryTile = 64, kFlexKeyTile = 128, kFlexBackwardKeyTile = 128;

struct FlexKernels {
  KernelFn forward = nullptr, grad_query = nullptr, grad_key_value = nullptr;  // backward: when the program has a joint
  std::vector<std::shared_ptr<SharedObject>> libraries;
};

// The generated source of a program (the text the exporter writes).
std::string flex_attention_source(const std::string& program);

// The kernels of a program, generated and built once per process (or loaded from the kernel
// cache); `stats` counts the build when given (a compile), else the build is not counted.
const FlexKernels& flex_kernels(const std::string& program, BuildStats* stats);

}  // namespace neuronx::compiler
