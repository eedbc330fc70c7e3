#include "compiler/op_table.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "compiler/scalar_ops.h"

namespace neuronx::compiler {

namespace {

std::string call(const char* f, const std::string& x) { return std::string(f) + "(" + x + ")"; }

Expr bin(const char* op) {
  return [op](auto& o) { return "(" + o[0] + " " + op + " " + o[1] + ")"; };
}
Expr alpha(const char* op) {  // add/sub with alpha: a op alpha * b
  return [op](auto& o) { return "(" + o[0] + " " + op + " " + o[2] + " * " + o[1] + ")"; };
}
Expr fn(const char* f) {
  return [f](auto& o) { return call(f, o[0]); };
}
Expr method(const char* m) {
  return [m](auto& o) { return "(" + o[0] + ")." + m + "()"; };
}

OpInfo pointwise(OpId id, const char* target, int operands, Expr expr, Expr vexpr) {
  OpInfo i;
  i.id = id;
  i.target = target;
  i.operands = operands;
  i.expr = std::move(expr);
  i.vexpr = std::move(vexpr);
  i.program_form = ProgramForm::kArithmetic;
  i.program_operands = operands;
  return i;
}

// An op of scalar programs only (no fused-loop lowering: `operands` stays 0).
OpInfo program_op(OpId id, const char* target, ProgramForm form, int operands, Expr expr) {
  OpInfo i;
  i.id = id;
  i.target = target;
  i.expr = std::move(expr);
  i.program_form = form;
  i.program_operands = operands;
  return i;
}

OpInfo plain(OpId id, const char* target) {
  OpInfo i;
  i.id = id;
  i.target = target;
  return i;
}

OpInfo whole(OpId id, const char* target) {
  OpInfo i = plain(id, target);
  i.keep_whole = true;
  return i;
}

bool all_ints(const std::vector<c10::IValue>& a) {
  return std::all_of(a.begin(), a.end(), [](const c10::IValue& v) { return v.isInt() || v.isBool(); });
}
c10::IValue number(double x, bool integral) {
  return integral ? c10::IValue(static_cast<int64_t>(x)) : c10::IValue(x);
}
double x(const std::vector<c10::IValue>& a, size_t i) { return as_double(a.at(i)); }

OpInfo scalar(OpId id, const char* target, ScalarFn f) {
  OpInfo i = plain(id, target);
  i.scalar = std::move(f);
  return i;
}
// An arithmetic scalar op: ints stay ints.
OpInfo arithmetic(OpId id, const char* target, double (*f)(double, double)) {
  return scalar(id, target, [f](const auto& a) { return number(f(x(a, 0), a.size() > 1 ? x(a, 1) : 0), all_ints(a)); });
}
OpInfo compare(OpId id, const char* target, bool (*f)(double, double)) {
  return scalar(id, target, [f](const auto& a) { return c10::IValue(f(x(a, 0), x(a, 1))); });
}

using Table = std::vector<OpInfo>;

void set_entry(Table& t, OpInfo i) { t[static_cast<size_t>(i.id)] = std::move(i); }
OpInfo& at(Table& t, OpId id) { return t[static_cast<size_t>(id)]; }

// Pointwise lowerings, and the oneDNN post-ops of the activations an epilogue fuses.
void add_pointwise(Table& t) {
  auto put = [&](OpInfo i) { set_entry(t, std::move(i)); };
  put(pointwise(OpId::kAdd, "aten::add.Tensor", 3, alpha("+"), alpha("+")));
  put(pointwise(OpId::kSub, "aten::sub.Tensor", 3, alpha("-"), alpha("-")));
  put(pointwise(OpId::kAddScalar, "aten::add.Scalar", 3, alpha("+"), alpha("+")));
  put(pointwise(OpId::kSubScalar, "aten::sub.Scalar", 3, alpha("-"), alpha("-")));
  put(pointwise(OpId::kMul, "aten::mul.Tensor", 2, bin("*"), bin("*")));
  put(pointwise(OpId::kMulScalar, "aten::mul.Scalar", 2, bin("*"), bin("*")));
  put(pointwise(OpId::kDiv, "aten::div.Tensor", 2, bin("/"), bin("/")));
  put(pointwise(OpId::kDivScalar, "aten::div.Scalar", 2, bin("/"), bin("/")));
  put(pointwise(OpId::kMaximum, "aten::maximum", 2, [](auto& o) { return "nx_max(" + o[0] + ", " + o[1] + ")"; },
                [](auto& o) { return "at::vec::maximum(" + o[0] + ", " + o[1] + ")"; }));
  put(pointwise(OpId::kMinimum, "aten::minimum", 2, [](auto& o) { return "nx_min(" + o[0] + ", " + o[1] + ")"; },
                [](auto& o) { return "at::vec::minimum(" + o[0] + ", " + o[1] + ")"; }));
  put(pointwise(OpId::kPowTensorScalar, "aten::pow.Tensor_Scalar", 2,
                [](auto& o) { return "std::pow(" + o[0] + ", " + o[1] + ")"; },
                [](auto& o) { return "(" + o[0] + ").pow(" + o[1] + ")"; }));
  put(pointwise(OpId::kNeg, "aten::neg", 1, [](auto& o) { return "(-" + o[0] + ")"; }, method("neg")));
  put(pointwise(OpId::kAbs, "aten::abs", 1, fn("std::abs"), method("abs")));
  put(pointwise(OpId::kExp, "aten::exp", 1, fn("std::exp"), method("exp")));
  put(pointwise(OpId::kLog, "aten::log", 1, fn("std::log"), method("log")));
  put(pointwise(OpId::kSqrt, "aten::sqrt", 1, fn("std::sqrt"), method("sqrt")));
  put(pointwise(OpId::kRsqrt, "aten::rsqrt", 1, [](auto& o) { return "(1 / std::sqrt(" + o[0] + "))"; }, method("rsqrt")));
  put(pointwise(OpId::kReciprocal, "aten::reciprocal", 1, [](auto& o) { return "(1 / " + o[0] + ")"; },
                method("reciprocal")));
  put(pointwise(OpId::kSin, "aten::sin", 1, fn("std::sin"), method("sin")));
  put(pointwise(OpId::kCos, "aten::cos", 1, fn("std::cos"), method("cos")));
  put(pointwise(OpId::kTanh, "aten::tanh", 1, fn("nx_tanh"), fn("nx_vtanh")));  // (codegen's prelude)
  put(pointwise(OpId::kErf, "aten::erf", 1, fn("std::erf"), method("erf")));
  put(pointwise(OpId::kLog1p, "aten::log1p", 1, fn("std::log1p"), method("log1p")));
  put(pointwise(OpId::kExpm1, "aten::expm1", 1, fn("std::expm1"), method("expm1")));
  put(pointwise(OpId::kSigmoid, "aten::sigmoid", 1, [](auto& o) { return "(1 / (1 + std::exp(-" + o[0] + ")))"; },
                [](auto& o) { return "(Vec(1) / (Vec(1) + (" + o[0] + ").neg().exp()))"; }));
  put(pointwise(OpId::kSilu, "aten::silu", 1, [](auto& o) { return "(" + o[0] + " / (1 + std::exp(-" + o[0] + ")))"; },
                [](auto& o) { return "(" + o[0] + " / (Vec(1) + (" + o[0] + ").neg().exp()))"; }));
  put(pointwise(OpId::kRelu, "aten::relu", 1, [](auto& o) { return "nx_relu(" + o[0] + ")"; },
                [](auto& o) { return "at::vec::clamp_min(" + o[0] + ", Vec(0))"; }));
  put(whole(OpId::kGelu, "aten::gelu"));  // lowered by codegen's gelu_expr (its form is an argument)
  // oneDNN post-ops of the activations an epilogue fuses.
  at(t, OpId::kRelu).post_op = "relu";
  at(t, OpId::kRelu).out_as = "aten::clamp_min.out";
  at(t, OpId::kSilu).post_op = "swish";
  at(t, OpId::kTanh).post_op = "tanh";
  at(t, OpId::kSigmoid).post_op = "sigmoid";
  at(t, OpId::kGelu).post_op = "gelu";
  at(t, OpId::kSilu).keep_whole = true;
  // Rounded as eager's kernels round them, element for element: correctly rounded IEEE operations
  // (add/sub only with alpha 1: ATen's vector form of a + alpha*b is a fused multiply-add), and
  // silu, whose vector and scalar forms are ATen's (with eager's vector/scalar split).
  // exp, tanh, sigmoid, gelu, erf, sin, cos, log1p, pow and sqrt are not: ATen's kernels use other
  // forms (float32 gelu is oneDNN's JIT kernel, exp and the like MKL's vector math; tests/
  // test_adaptive.py checks every op listed here; abs runs as abs.out in eager).
  for (OpId id : {OpId::kAdd, OpId::kSub, OpId::kAddScalar, OpId::kSubScalar, OpId::kMul, OpId::kMulScalar, OpId::kDiv,
                  OpId::kDivScalar, OpId::kNeg, OpId::kRelu, OpId::kMaximum, OpId::kMinimum,
                  OpId::kReciprocal, OpId::kRsqrt, OpId::kSilu})
    at(t, id).eager_exact = at(t, id).eager_exact_bf16 = true;
  at(t, OpId::kRsqrt).eager_exact_bf16 = false;  // eager's bfloat16 rsqrt rounds otherwise
  for (OpId id : {OpId::kAdd, OpId::kSub, OpId::kAddScalar, OpId::kSubScalar}) at(t, id).exact_if_one = 2;
}

// Reductions, losses, GEMMs, views, and how ops that are not lowered run.
void add_library_ops(Table& t) {
  auto put = [&](OpInfo i) { set_entry(t, std::move(i)); };
  // Row reductions and the fused loss.
  for (auto [id, target, r] : {std::tuple{OpId::kSoftmax, "aten::_softmax", Reduction::kSoftmax},
                               std::tuple{OpId::kLogSoftmax, "aten::_log_softmax", Reduction::kLogSoftmax},
                               std::tuple{OpId::kLayerNorm, "aten::native_layer_norm", Reduction::kLayerNorm}}) {
    OpInfo i = whole(id, target);
    i.reduction = r;
    put(std::move(i));
  }
  OpInfo nll = whole(OpId::kNllLossForward, "aten::nll_loss_forward");
  nll.loss = true;
  put(std::move(nll));
  // GEMMs and convolutions.
  for (auto [id, target, k] : {std::tuple{OpId::kMm, "aten::mm", Gemm::kMm},
                               std::tuple{OpId::kAddmm, "aten::addmm", Gemm::kAddmm},
                               std::tuple{OpId::kConvolution, "aten::convolution", Gemm::kConvolution}}) {
    OpInfo i = whole(id, target);
    i.gemm = k;
    i.keep_whole = k != Gemm::kConvolution;
    put(std::move(i));
  }
  // Views.
  for (auto [id, target] : {std::pair{OpId::kView, "aten::view"}, std::pair{OpId::kUnsafeView, "aten::_unsafe_view"}}) {
    OpInfo i = plain(id, target);
    i.reshape_view = true;
    put(std::move(i));
  }
  put(plain(OpId::kPermute, "aten::permute"));
  // Our kernels instead of CPU's: the "*_overrideable" ops (SDPA's fused forms, PrivateUse1-only)
  // always; histc when its input is integral (CUDA counts integers, CPU's kernel takes floating
  // point only).
  for (auto [id, target] : {std::pair{OpId::kFusedAttentionOverrideable,
                                      "aten::_scaled_dot_product_fused_attention_overrideable"},
                            std::pair{OpId::kFusedAttentionOverrideableBackward,
                                      "aten::_scaled_dot_product_fused_attention_overrideable_backward"}}) {
    OpInfo i = plain(id, target);
    i.not_lowered = NotLowered::kNeuronKernel;
    put(std::move(i));
  }
  OpInfo histc = plain(OpId::kHistc, "aten::histc");
  histc.not_lowered = NotLowered::kNeuronKernelForIntegralInput;
  put(std::move(histc));
  // Kept whole, run as one library kernel.
  for (auto [id, target] : std::initializer_list<std::pair<OpId, const char*>>{
           {OpId::kLayerNormBackward, "aten::native_layer_norm_backward"},
           {OpId::kSoftmaxBackward, "aten::_softmax_backward_data"},
           {OpId::kLogSoftmaxBackward, "aten::_log_softmax_backward_data"},
           {OpId::kNllLossBackward, "aten::nll_loss_backward"},
           {OpId::kBatchNormBackward, "aten::native_batch_norm_backward"},
           {OpId::kBatchNormLegitFunctional, "aten::_native_batch_norm_legit_functional"},
           {OpId::kConvolutionBackward, "aten::convolution_backward"},
           {OpId::kEmbeddingDenseBackward, "aten::embedding_dense_backward"},
           {OpId::kBmm, "aten::bmm"},
           {OpId::kBaddbmm, "aten::baddbmm"},
           {OpId::kMatmul, "aten::matmul"},
           {OpId::kLinear, "aten::linear"},
           {OpId::kGeluBackward, "aten::gelu_backward"},
           {OpId::kSiluBackward, "aten::silu_backward"},
           {OpId::kMseLoss, "aten::mse_loss"},
           {OpId::kMseLossBackward, "aten::mse_loss_backward"},
           {OpId::kGroupNorm, "aten::native_group_norm"},
           {OpId::kGroupNormBackward, "aten::native_group_norm_backward"},
           {OpId::kCrossEntropyLoss, "aten::cross_entropy_loss"},
           {OpId::kFlashAttentionCpu, "aten::_scaled_dot_product_flash_attention_for_cpu"},
           {OpId::kFlashAttentionCpuBackward, "aten::_scaled_dot_product_flash_attention_for_cpu_backward"},
           // ReLU's backward: one ATen kernel, where its decomposition is a comparison and a
           // where over a bool mask (two passes no fused loop takes).
           {OpId::kThresholdBackward, "aten::threshold_backward"}})
    put(whole(id, target));
  for (auto [id, target] : std::initializer_list<std::pair<OpId, const char*>>{
           {OpId::kBatchNorm, "aten::native_batch_norm"},
           {OpId::kBatchNormLegit, "aten::_native_batch_norm_legit"},
           {OpId::kBatchNormLegitNoTraining, "aten::_native_batch_norm_legit_no_training"}}) {
    OpInfo i = whole(id, target);
    i.empty_eval_stats = true;
    put(std::move(i));
  }
}

void add_scalar_ops(Table& t) {
  auto put = [&](OpInfo i) { set_entry(t, std::move(i)); };
  put(plain(OpId::kSymSize, "sym_size"));
  put(plain(OpId::kSymStride, "sym_stride"));
  put(plain(OpId::kSymNumel, "sym_numel"));
  put(arithmetic(OpId::kScalarAdd, "add", [](double a, double b) { return a + b; }));
  put(arithmetic(OpId::kScalarSub, "sub", [](double a, double b) { return a - b; }));
  put(arithmetic(OpId::kScalarMul, "mul", [](double a, double b) { return a * b; }));
  put(scalar(OpId::kScalarTrueDiv, "truediv", [](const auto& a) { return c10::IValue(x(a, 0) / x(a, 1)); }));
  put(arithmetic(OpId::kScalarFloorDiv, "floordiv", [](double a, double b) { return std::floor(a / b); }));
  put(arithmetic(OpId::kScalarMod, "mod", [](double a, double b) { return a - b * std::floor(a / b); }));
  put(arithmetic(OpId::kScalarNeg, "neg", [](double a, double) { return -a; }));
  put(scalar(OpId::kScalarPow, "pow",
             [](const auto& a) { return number(std::pow(x(a, 0), x(a, 1)), all_ints(a) && x(a, 1) >= 0); }));
  put(scalar(OpId::kSymFloat, "sym_float", [](const auto& a) { return c10::IValue(x(a, 0)); }));
  put(scalar(OpId::kSymInt, "sym_int", [](const auto& a) { return c10::IValue(static_cast<int64_t>(std::trunc(x(a, 0)))); }));
  put(scalar(OpId::kTrunc, "trunc", [](const auto& a) { return c10::IValue(static_cast<int64_t>(std::trunc(x(a, 0)))); }));
  put(scalar(OpId::kFloor, "floor", [](const auto& a) { return c10::IValue(static_cast<int64_t>(std::floor(x(a, 0)))); }));
  put(scalar(OpId::kCeil, "ceil", [](const auto& a) { return c10::IValue(static_cast<int64_t>(std::ceil(x(a, 0)))); }));
  put(scalar(OpId::kScalarSqrt, "sqrt", [](const auto& a) { return c10::IValue(std::sqrt(x(a, 0))); }));
  put(arithmetic(OpId::kSymMax, "sym_max", [](double a, double b) { return std::max(a, b); }));
  put(arithmetic(OpId::kSymMin, "sym_min", [](double a, double b) { return std::min(a, b); }));
  put(scalar(OpId::kSymSum, "sym_sum", [](const auto& a) {  // any number of terms; ints summed exactly
    if (all_ints(a)) {
      int64_t s = 0;
      for (const auto& v : a) s += v.isInt() ? v.toInt() : static_cast<int64_t>(v.toBool());
      return c10::IValue(s);
    }
    double s = 0;
    for (size_t k = 0; k < a.size(); ++k) s += x(a, k);
    return c10::IValue(s);
  }));
  put(compare(OpId::kEq, "eq", [](double a, double b) { return a == b; }));
  put(compare(OpId::kNe, "ne", [](double a, double b) { return a != b; }));
  put(compare(OpId::kLt, "lt", [](double a, double b) { return a < b; }));
  put(compare(OpId::kLe, "le", [](double a, double b) { return a <= b; }));
  put(compare(OpId::kGt, "gt", [](double a, double b) { return a > b; }));
  put(compare(OpId::kGe, "ge", [](double a, double b) { return a >= b; }));
}

// Comparisons, logic, selection, casts and buffer reads of scalar programs (FlexAttention's mods).
void add_program_ops(Table& t) {
  auto put = [&](OpInfo i) { set_entry(t, std::move(i)); };
  auto identity = [](auto& o) { return "(" + o[0] + ")"; };
  for (auto [id, target, op] : std::initializer_list<std::tuple<OpId, const char*, const char*>>{
           {OpId::kEqTensor, "aten::eq.Tensor", "=="}, {OpId::kEqScalar, "aten::eq.Scalar", "=="},
           {OpId::kNeTensor, "aten::ne.Tensor", "!="}, {OpId::kNeScalar, "aten::ne.Scalar", "!="},
           {OpId::kLtTensor, "aten::lt.Tensor", "<"}, {OpId::kLtScalar, "aten::lt.Scalar", "<"},
           {OpId::kLeTensor, "aten::le.Tensor", "<="}, {OpId::kLeScalar, "aten::le.Scalar", "<="},
           {OpId::kGtTensor, "aten::gt.Tensor", ">"}, {OpId::kGtScalar, "aten::gt.Scalar", ">"},
           {OpId::kGeTensor, "aten::ge.Tensor", ">="}, {OpId::kGeScalar, "aten::ge.Scalar", ">="},
           {OpId::kBitwiseAnd, "aten::bitwise_and.Tensor", "&"}, {OpId::kBitwiseAndScalar, "aten::bitwise_and.Scalar", "&"},
           {OpId::kBitwiseOr, "aten::bitwise_or.Tensor", "|"}, {OpId::kBitwiseOrScalar, "aten::bitwise_or.Scalar", "|"},
           {OpId::kBitwiseXor, "aten::bitwise_xor.Tensor", "^"}})
    put(program_op(id, target, ProgramForm::kCompare, 2, bin(op)));
  put(program_op(OpId::kBitwiseNot, "aten::bitwise_not", ProgramForm::kCompare, 1, fn("nx_bitwise_not")));
  put(program_op(OpId::kLogicalAnd, "aten::logical_and", ProgramForm::kCompare, 2,
                 [](auto& o) { return "(static_cast<bool>(" + o[0] + ") && static_cast<bool>(" + o[1] + "))"; }));
  put(program_op(OpId::kLogicalOr, "aten::logical_or", ProgramForm::kCompare, 2,
                 [](auto& o) { return "(static_cast<bool>(" + o[0] + ") || static_cast<bool>(" + o[1] + "))"; }));
  put(program_op(OpId::kLogicalNot, "aten::logical_not", ProgramForm::kCompare, 1,
                 [](auto& o) { return "(!static_cast<bool>(" + o[0] + "))"; }));
  put(program_op(OpId::kWhere, "aten::where.self", ProgramForm::kSelect, 3,
                 [](auto& o) { return "(" + o[0] + " ? " + o[1] + " : " + o[2] + ")"; }));
  put(program_op(OpId::kRsubScalar, "aten::rsub.Scalar", ProgramForm::kArithmetic, 3,
                 [](auto& o) { return "(" + o[1] + " - " + o[2] + " * " + o[0] + ")"; }));
  put(program_op(OpId::kFloorDivide, "aten::floor_divide", ProgramForm::kArithmetic, 2,
                 [](auto& o) { return "nx_floor_divide(" + o[0] + ", " + o[1] + ")"; }));
  for (auto [id, target] : {std::pair{OpId::kRemainder, "aten::remainder.Tensor"},
                            std::pair{OpId::kRemainderScalar, "aten::remainder.Scalar"}})
    put(program_op(id, target, ProgramForm::kArithmetic, 2,
                   [](auto& o) { return "nx_remainder(" + o[0] + ", " + o[1] + ")"; }));
  // index.Tensor(buffer, [i, j, ...]): the program's generator reads the buffer (expr gets the
  // buffer's accessor, then the indices).
  put(program_op(OpId::kIndexTensor, "aten::index.Tensor", ProgramForm::kGather, 2, [](auto& o) {
    std::string e = o[0] + "(";
    for (size_t k = 1; k < o.size(); ++k) e += (k > 1 ? ", " : "") + o[k];
    return e + ")";
  }));
  for (auto [id, target] : {std::pair{OpId::kToCopy, "aten::_to_copy"}, std::pair{OpId::kClone, "aten::clone"},
                            std::pair{OpId::kAlias, "aten::alias"}, std::pair{OpId::kDetach, "aten::detach"},
                            std::pair{OpId::kLiftFreshCopy, "aten::lift_fresh_copy"}})
    put(program_op(id, target, ProgramForm::kCast, 1, identity));
  // 0-d constants (FlexAttention's default mask_mod is full([], True)).
  for (auto [id, target, arg] : {std::tuple{OpId::kFull, "aten::full", 1}, std::tuple{OpId::kScalarTensor, "aten::scalar_tensor", 0}}) {
    OpInfo i = program_op(id, target, ProgramForm::kFill, 0, identity);
    i.fill_arg = arg;
    put(std::move(i));
  }
  for (auto [id, target, value] : {std::tuple{OpId::kOnes, "aten::ones", "1"}, std::tuple{OpId::kNewOnes, "aten::new_ones", "1"},
                                   std::tuple{OpId::kZeros, "aten::zeros", "0"}, std::tuple{OpId::kNewZeros, "aten::new_zeros", "0"}})
    put(program_op(id, target, ProgramForm::kFill, 0, [value](auto&) { return std::string(value); }));
  // The flex_attention higher-order ops, exported as these (flex_attention.h).
  for (auto [id, target] : {std::pair{OpId::kFlexAttention, "neuronx::flex_attention"},
                            std::pair{OpId::kFlexAttentionBackward, "neuronx::flex_attention_backward"}}) {
    OpInfo i = plain(id, target);
    i.flex_attention = true;
    put(std::move(i));
  }
}

Table build() {
  Table t(static_cast<size_t>(OpId::kCount));
  add_pointwise(t);
  add_library_ops(t);
  add_scalar_ops(t);
  add_program_ops(t);
  for (size_t i = 1; i < t.size(); ++i)
    TORCH_INTERNAL_ASSERT(t[i].id == static_cast<OpId>(i), "op table: OpId ", i, " has no entry");
  return t;
}

}  // namespace

const std::vector<OpInfo>& op_table() {
  static const auto* t = new std::vector<OpInfo>(build());
  return *t;
}

OpId op_id(std::string_view target) {
  static const auto* ids = [] {
    auto* m = new std::unordered_map<std::string_view, OpId>();
    for (const auto& i : op_table())
      if (i.id != OpId::kOther) m->emplace(i.target, i.id);
    return m;
  }();
  auto it = ids->find(target);
  return it == ids->end() ? OpId::kOther : it->second;
}

OpId inplace_op_id(std::string_view target) {
  // "ns::name_.overload" or "ns::name_" names the in-place form of "ns::name.overload".
  const size_t dot = target.find('.', target.find("::") == std::string_view::npos ? 0 : target.find("::") + 2);
  const size_t end = dot == std::string_view::npos ? target.size() : dot;
  if (end == 0 || target[end - 1] != '_') return OpId::kOther;
  std::string functional(target.substr(0, end - 1));
  functional += target.substr(end);
  return op_id(functional);
}

const OpInfo& op_info(OpId id) { return op_table()[static_cast<size_t>(id)]; }

}  // namespace neuronx::compiler
