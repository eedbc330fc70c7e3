#include "distributed/reduce_ops.h"

#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>

#include "backend/common.h"
#include "backend/tensor_views.h"

namespace neuronx::distributed {

void check_reduce_op(const char* name, const c10d::ReduceOp& op, const std::vector<at::Tensor>& ts) {
  for (const auto& t : ts) {
    if (op == c10d::ReduceOp::BAND || op == c10d::ReduceOp::BOR || op == c10d::ReduceOp::BXOR)
      TORCH_CHECK_VALUE(c10::isIntegralType(t.scalar_type(), /*includeBool=*/true), name,
                        ": bitwise reductions need integer or bool tensors, got ", t.scalar_type());
    if (op == c10d::ReduceOp::PREMUL_SUM)
      TORCH_CHECK_VALUE(c10::isFloatingType(t.scalar_type()) || c10::isComplexType(t.scalar_type()), name,
                        ": PREMUL_SUM needs floating-point tensors, got ", t.scalar_type());
  }
}

c10d::ReduceOp transport_op(const c10d::ReduceOp& op) {
  if (op == c10d::ReduceOp::AVG || op == c10d::ReduceOp::PREMUL_SUM) return c10d::ReduceOp(c10d::ReduceOp::SUM);
  return op;
}

void premultiply(const c10d::ReduceOp& op, at::Tensor& t) {
  if (op != c10d::ReduceOp::PREMUL_SUM) return;
  auto* s = dynamic_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
  TORCH_CHECK(s, "PREMUL_SUM without a factor");
  if (s->tensor_factor.defined()) {
    const at::Tensor& f = s->tensor_factor;
    t.mul_((f.device().type() == kNeuron ? cpu_alias(f) : f).to(t.scalar_type()));  // read only
  } else {
    t.mul_(s->double_factor);
  }
}

void average(const c10d::ReduceOp& op, at::Tensor& t, int size) {
  if (op != c10d::ReduceOp::AVG) return;
  if (c10::isIntegralType(t.scalar_type(), /*includeBool=*/true)) t.div_(size, "trunc");
  else t.div_(size);
}

std::vector<at::Tensor> premultiplied(const c10d::ReduceOp& op, const std::vector<at::Tensor>& ts) {
  if (op != c10d::ReduceOp::PREMUL_SUM) return ts;
  std::vector<at::Tensor> out;
  for (const auto& t : ts) {
    at::Tensor c = t.clone();
    premultiply(op, c);
    out.push_back(std::move(c));
  }
  return out;
}

bool reducible(const at::Tensor& t, const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: case c10d::ReduceOp::PRODUCT:
      return true;
    case c10d::ReduceOp::MIN: case c10d::ReduceOp::MAX:
      return !t.is_complex();
    case c10d::ReduceOp::BAND: case c10d::ReduceOp::BOR: case c10d::ReduceOp::BXOR:
      return c10::isIntegralType(t.scalar_type(), /*includeBool=*/true);
    default:
      return false;
  }
}

void reduce_into(at::Tensor& acc, const at::Tensor& other, const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: acc.add_(other); break;
    case c10d::ReduceOp::PRODUCT: acc.mul_(other); break;
    case c10d::ReduceOp::MIN: at::minimum_out(acc, acc, other); break;
    case c10d::ReduceOp::MAX: at::maximum_out(acc, acc, other); break;
    case c10d::ReduceOp::BAND: acc.bitwise_and_(other); break;
    case c10d::ReduceOp::BOR: acc.bitwise_or_(other); break;
    case c10d::ReduceOp::BXOR: acc.bitwise_xor_(other); break;
    default: TORCH_INTERNAL_ASSERT(false, "reduce_into: unsupported reduce op");
  }
}

}  // namespace neuronx::distributed
