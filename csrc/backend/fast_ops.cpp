// Unboxed entry points for the hottest ops: the same fallback (run_fallback), reached without
// the dispatcher's boxing.
//
// A boxed kernel receives its arguments as an IValue stack the dispatcher builds by copying
// them. Copying a tensor that Python owns takes its reference count from 1 to 2, which in this
// PyTorch increments the Python object's count too, under the GIL (and dropping the copy does
// the same again): two GIL round trips per operand per op. Here the operands are lent to the
// fallback as borrowed IValues (no reference taken, none dropped), and a return that is an
// argument (an in-place op's self) is returned by reference, as ATen's own kernels do.
#include <ATen/ops/_log_softmax_backward_data_ops.h>
#include <ATen/ops/_log_softmax_ops.h>
#include <ATen/ops/_softmax_backward_data_ops.h>
#include <ATen/ops/_softmax_ops.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/addcdiv_ops.h>
#include <ATen/ops/addcmul_ops.h>
#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/bmm_ops.h>
#include <ATen/ops/div_ops.h>
#include <ATen/ops/embedding_dense_backward_ops.h>
#include <ATen/ops/exp_ops.h>
#include <ATen/ops/fill_ops.h>
#include <ATen/ops/gelu_backward_ops.h>
#include <ATen/ops/gelu_ops.h>
#include <ATen/ops/index_select_ops.h>
#include <ATen/ops/lerp_ops.h>
#include <ATen/ops/masked_fill_ops.h>
#include <ATen/ops/mean_ops.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/native_layer_norm_backward_ops.h>
#include <ATen/ops/native_layer_norm_ops.h>
#include <ATen/ops/neg_ops.h>
#include <ATen/ops/relu_ops.h>
#include <ATen/ops/rsqrt_ops.h>
#include <ATen/ops/sigmoid_ops.h>
#include <ATen/ops/silu_ops.h>
#include <ATen/ops/sqrt_ops.h>
#include <ATen/ops/sub_ops.h>
#include <ATen/ops/sum_ops.h>
#include <ATen/ops/tanh_ops.h>
#include <ATen/ops/threshold_backward_ops.h>
#include <ATen/ops/where_ops.h>
#include <ATen/ops/zero_ops.h>
#include <c10/util/MaybeOwned.h>
#include <torch/library.h>

#include <array>
#include <tuple>
#include <type_traits>

#include "backend/fast_ops.h"
#include "backend/op_kernel.h"

namespace neuronx {

namespace {

// The arguments of one call as IValues; tensors are borrowed (no reference count changes),
// everything else is converted as the dispatcher's boxing converts it.
template <size_t N>
class BorrowedArgs {
 public:
  BorrowedArgs() = default;
  BorrowedArgs(const BorrowedArgs&) = delete;
  BorrowedArgs& operator=(const BorrowedArgs&) = delete;
  ~BorrowedArgs() {
    for (size_t i = 0; i < n_; ++i)
      if (borrowed_[i]) v_[i].toTensor().unsafeReleaseTensorImpl();  // lent: not ours to drop
  }
  void push(const at::Tensor& t) {
    borrowed_[n_] = true;
    v_[n_++] = c10::IValue(c10::MaybeOwnedTraits<at::Tensor>::createBorrow(t));
  }
  void push(at::Tensor& t) { push(static_cast<const at::Tensor&>(t)); }  // (not the template's copy)
  void push(const std::optional<at::Tensor>& t) {
    if (t.has_value()) push(*t);
    else ++n_;  // None
  }
  template <typename T>
  void push(T&& v) {
    v_[n_++] = c10::IValue(std::forward<T>(v));
  }
  c10::ArrayRef<c10::IValue> view() const { return c10::ArrayRef<c10::IValue>(v_.data(), n_); }

 private:
  std::array<c10::IValue, N> v_;
  std::array<bool, N> borrowed_{};
  size_t n_ = 0;
};

// The mutable tensor argument at position k (an in-place op's self, an out= argument).
template <typename... Args>
at::Tensor& mutable_argument(size_t k, Args&... args) {
  at::Tensor* found = nullptr;
  size_t i = 0;
  auto visit = [&](auto& arg) {
    if constexpr (std::is_same_v<std::remove_cv_t<std::remove_reference_t<decltype(arg)>>, at::Tensor> &&
                  !std::is_const_v<std::remove_reference_t<decltype(arg)>>)
      if (i == k) found = &arg;
    ++i;
  };
  (visit(args), ...);
  TORCH_INTERNAL_ASSERT(found, "fast_ops: return aliases argument ", k, ", which is not a mutable tensor");
  return *found;
}

template <typename Ret>
struct TakeReturn;

template <>
struct TakeReturn<at::Tensor> {
  static at::Tensor take(std::vector<c10::IValue>& results) { return std::move(results[0]).toTensor(); }
};

template <typename... Ts>
struct TakeReturn<std::tuple<Ts...>> {
  template <size_t... I>
  static std::tuple<Ts...> take(std::vector<c10::IValue>& results, std::index_sequence<I...>) {
    return std::tuple<Ts...>(std::move(results[I]).toTensor()...);
  }
  static std::tuple<Ts...> take(std::vector<c10::IValue>& results) {
    return take(results, std::index_sequence_for<Ts...>{});
  }
};

template <typename Op, typename Sig = typename Op::schema>
struct Unboxed;

template <typename Op, typename Ret, typename... Args>
struct Unboxed<Op, Ret(Args...)> {
  static OpAnalysis& analysis() {
    static OpAnalysis& a =
        op_analysis(c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name));
    return a;
  }

  static inline std::atomic<uint64_t> calls{0};

  static Ret call(Args... args) {
    OpAnalysis& a = analysis();
    calls.fetch_add(1, std::memory_order_relaxed);
    rt::RecycledScope<std::vector<c10::IValue>> scope;
    std::vector<c10::IValue>& results = scope.value;
    {
      BorrowedArgs<sizeof...(Args)> boxed;
      (boxed.push(args), ...);
      run_fallback(a, boxed.view(), results);
    }
    if constexpr (std::is_reference_v<Ret>) {
      // An in-place op or out= form: the op's return is its argument.
      static_assert(std::is_same_v<Ret, at::Tensor&>);
      TORCH_INTERNAL_ASSERT(!a.ret_arg.empty() && a.ret_arg[0] >= 0);
      return mutable_argument(static_cast<size_t>(a.ret_arg[0]), args...);
    } else {
      return TakeReturn<Ret>::take(results);
    }
  }
};

template <typename Op>
FastOp fast_op() {
  return FastOp{Op::name, Op::overload_name, [](torch::Library& lib, const char* name) {
                  lib.impl(name, TORCH_FN(Unboxed<Op>::call));
                },
                &Unboxed<Op>::calls};
}

}  // namespace

const std::vector<FastOp>& fast_ops() {
  // The ops a training step or a tight loop calls most (pointwise, in-place optimizer updates,
  // reductions, matmuls, norms): measured with torch_neuronx.metrics() on nanoGPT and BERT.
  static const std::vector<FastOp> ops = {
      fast_op<at::_ops::add_Tensor>(),         fast_op<at::_ops::add__Tensor>(),
      fast_op<at::_ops::sub_Tensor>(),         fast_op<at::_ops::sub__Tensor>(),
      fast_op<at::_ops::mul_Tensor>(),         fast_op<at::_ops::mul__Tensor>(),
      fast_op<at::_ops::div_Tensor>(),         fast_op<at::_ops::div__Tensor>(),
      fast_op<at::_ops::addcdiv_>(),           fast_op<at::_ops::addcmul_>(),
      fast_op<at::_ops::lerp__Scalar>(),       fast_op<at::_ops::sqrt>(),
      fast_op<at::_ops::rsqrt>(),              fast_op<at::_ops::neg>(),
      fast_op<at::_ops::exp>(),                fast_op<at::_ops::tanh>(),
      fast_op<at::_ops::sigmoid>(),            fast_op<at::_ops::silu>(),
      fast_op<at::_ops::relu>(),               fast_op<at::_ops::gelu>(),
      fast_op<at::_ops::gelu_backward>(),      fast_op<at::_ops::threshold_backward>(),
      fast_op<at::_ops::sum_dim_IntList>(),    fast_op<at::_ops::mean_dim>(),
      fast_op<at::_ops::mm>(),                 fast_op<at::_ops::addmm>(),
      fast_op<at::_ops::bmm>(),                fast_op<at::_ops::_softmax>(),
      fast_op<at::_ops::_log_softmax>(),       fast_op<at::_ops::_softmax_backward_data>(),
      fast_op<at::_ops::_log_softmax_backward_data>(),
      fast_op<at::_ops::native_layer_norm>(),  fast_op<at::_ops::native_layer_norm_backward>(),
      fast_op<at::_ops::where_self>(),         fast_op<at::_ops::fill__Scalar>(),
      fast_op<at::_ops::zero_>(),              fast_op<at::_ops::masked_fill__Scalar>(),
      fast_op<at::_ops::index_select>(),       fast_op<at::_ops::embedding_dense_backward>(),
  };
  return ops;
}

}  // namespace neuronx
