#pragma once
// What the compiler knows about each op, in one table: a node's target is
// mapped to an OpId when the graph is built, and passes, code generation and
// the executable ask the table instead of comparing names. Its clients: the
// compile tier's passes and code generator today; the adaptive-eager tier and
// the kernel language generate code from the same lowerings.
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace neuronx::compiler {

enum class OpId : uint8_t {
  kOther = 0,  // not in the table: a library call
  // Pointwise, lowered.
  kAdd, kSub, kAddScalar, kSubScalar, kMul, kMulScalar, kDiv, kDivScalar, kMaximum, kMinimum, kPowTensorScalar,
  kNeg, kAbs, kExp, kLog, kSqrt, kRsqrt, kReciprocal, kSin, kCos, kTanh, kErf, kLog1p, kExpm1, kSigmoid, kSilu,
  kRelu, kGelu,
  // Row reductions and the loss fused after log_softmax.
  kSoftmax, kLogSoftmax, kLayerNorm, kNllLossForward,
  // GEMMs and convolutions (epilogue fusion onto oneDNN).
  kMm, kAddmm, kConvolution,
  // Views the passes look through.
  kView, kUnsafeView, kPermute,
  // Run by our neuron kernels instead of CPU's (see Node::neuron_kernel).
  kHistc, kFusedAttentionOverrideable, kFusedAttentionOverrideableBackward,
  // Kept whole by the decompositions: one library kernel beats its decomposition.
  kLayerNormBackward, kSoftmaxBackward, kLogSoftmaxBackward, kNllLossBackward, kBatchNorm, kBatchNormBackward,
  kBatchNormLegit, kBatchNormLegitFunctional, kBatchNormLegitNoTraining, kConvolutionBackward,
  kEmbeddingDenseBackward, kBmm, kBaddbmm, kMatmul, kLinear, kGeluBackward, kSiluBackward, kMseLoss,
  kMseLossBackward, kGroupNorm, kGroupNormBackward, kCrossEntropyLoss, kFlashAttentionCpu,
  kFlashAttentionCpuBackward, kThresholdBackward,
  // Scalar ops Dynamo leaves over symbolic sizes and floats (host work at launch).
  kSymSize, kSymStride, kSymNumel, kScalarAdd, kScalarSub, kScalarMul, kScalarTrueDiv, kScalarFloorDiv, kScalarMod,
  kScalarNeg, kScalarPow, kSymFloat, kSymInt, kTrunc, kFloor, kCeil, kScalarSqrt, kSymMax, kSymMin, kSymSum, kEq, kNe, kLt,
  kLe, kGt, kGe,
  // Elementwise ops only scalar programs use (FlexAttention's score and mask mods, evaluated per
  // element over typed C++ scalars; see program_form).
  kEqTensor, kEqScalar, kNeTensor, kNeScalar, kLtTensor, kLtScalar, kLeTensor, kLeScalar, kGtTensor, kGtScalar,
  kGeTensor, kGeScalar, kBitwiseAnd, kBitwiseAndScalar, kBitwiseOr, kBitwiseOrScalar, kBitwiseXor, kBitwiseNot,
  kLogicalAnd, kLogicalOr, kLogicalNot, kWhere, kRsubScalar, kFloorDivide, kRemainder, kRemainderScalar, kIndexTensor,
  kToCopy, kClone, kAlias, kDetach, kLiftFreshCopy, kFull, kScalarTensor, kOnes, kNewOnes, kZeros, kNewZeros,
  // FlexAttention, lowered to a generated kernel with its mods inlined (flex_attention.h).
  kFlexAttention, kFlexAttentionBackward,
  kCount
};

// C++ source over operand expressions.
using Expr = std::function<std::string(const std::vector<std::string>&)>;
// A scalar op over its (number) arguments.
using ScalarFn = std::function<c10::IValue(const std::vector<c10::IValue>&)>;

enum class Reduction : uint8_t { kNone, kSoftmax, kLogSoftmax, kLayerNorm };
// How a scalar program (scalar_program.h) evaluates the op on typed C++ scalars: kArithmetic
// casts its operands to the result type first (int / int is a true division when the result is
// floating point); kCompare takes them as they are (C++ promotes as torch does); kSelect is
// where(cond, a, b); kGather reads a captured buffer at the index operands; kCast is a copy to
// the result type; kFill a 0-d constant (expr over args[fill_arg], or over nothing).
enum class ProgramForm : uint8_t { kNone, kArithmetic, kCompare, kSelect, kGather, kCast, kFill };
enum class Gemm : uint8_t { kNone, kMm, kAddmm, kConvolution };
// How a node runs when it is not lowered: ATen's CPU kernel on the device's
// memory, or our neuron kernel (written against ATen ops) on the CPU views.
enum class NotLowered : uint8_t { kCpuKernel, kNeuronKernel, kNeuronKernelForIntegralInput };

struct OpInfo {
  OpId id = OpId::kOther;
  const char* target = "";  // "aten::add.Tensor"; scalar ops: "add", "sym_size"
  // Pointwise lowering: `operands` leading args (tensors or numbers); expr in scalar C++,
  // vexpr over at::vec::Vectorized (ATen's own vectorized math). gelu's depends on its
  // `approximate` argument (gelu_expr in codegen.cpp).
  int operands = 0;
  Expr expr, vexpr;
  Reduction reduction = Reduction::kNone;
  bool loss = false;           // the nll_loss fused after a log_softmax row group
  const char* post_op = "";    // the oneDNN eltwise post-op an epilogue of this op becomes
  Gemm gemm = Gemm::kNone;
  bool reshape_view = false;   // a view that only reshapes (the view between a GEMM and its epilogue)
  NotLowered not_lowered = NotLowered::kCpuKernel;
  bool keep_whole = false;     // the decompositions leave it whole
  ScalarFn scalar;             // scalar ops
  // Its lowering rounds exactly as ATen's eager CPU kernel does, element for element, whatever
  // the vector/scalar split (correctly rounded IEEE operations): the adaptive-eager tier fuses
  // only these, so that fused results are bitwise eager's (tests/test_adaptive.py checks each).
  bool eager_exact = false;
  bool eager_exact_bf16 = false;  // ...also in bfloat16 (each result rounded to bfloat16)
  int exact_if_one = -1;       // ...when this operand (add/sub's alpha) is 1
  // Scalar programs: the form, and how many leading args are operands of `expr`.
  ProgramForm program_form = ProgramForm::kNone;
  int program_operands = 0;
  int fill_arg = -1;  // kFill: the argument holding the value
  // A FlexAttention op the compiler builds a generated kernel for (flex_attention.h).
  bool flex_attention = false;
  // Batch norm: in eval mode ATen's CPU kernel returns empty saved statistics where the meta
  // kernels traced for neuron give [C] (outputs 1 and 2).
  bool empty_eval_stats = false;
  // An op whose out= kernel computes this one, given this op's arguments and `out_as_arg`
  // (relu: clamp_min.out(self, 0), CPU's own relu): ATen's relu.out computes into new memory
  // and copies.
  const char* out_as = "";
  int64_t out_as_arg = 0;
  bool pointwise() const { return operands > 0 || id == OpId::kGelu; }
};

// The op a node target names (OpId::kOther when the table does not list it).
OpId op_id(std::string_view target);
// The op whose in-place form `target` is ("aten::add_.Tensor" -> kAdd, "aten::relu_" -> kRelu;
// ATen's naming rule), or kOther.
OpId inplace_op_id(std::string_view target);
const OpInfo& op_info(OpId id);
// Every entry, in OpId order (exported to Python).
const std::vector<OpInfo>& op_table();

}  // namespace neuronx::compiler
