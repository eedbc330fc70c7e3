#pragma once
// Reduce ops as the neuron c10d backend runs them: which ops an algorithm of
// our own can reduce, the reduction itself, and the AVG and PREMUL_SUM
// steps the transport (which has neither) leaves to us.
#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <vector>

namespace neuronx::distributed {

// Raises a ValueError naming `name` when `op` does not apply to a tensor's dtype.
void check_reduce_op(const char* name, const c10d::ReduceOp& op, const std::vector<at::Tensor>& ts);

// AVG and PREMUL_SUM become SUM on the transport, with a scaling step before
// (premultiply) or after (average) the transfer.
c10d::ReduceOp transport_op(const c10d::ReduceOp& op);
void premultiply(const c10d::ReduceOp& op, at::Tensor& t);
void average(const c10d::ReduceOp& op, at::Tensor& t, int size);
// Reduce-scatter inputs are not written by the collective: premultiplied copies.
std::vector<at::Tensor> premultiplied(const c10d::ReduceOp& op, const std::vector<at::Tensor>& ts);

// Whether reduce_into() implements `op` for `t`'s dtype.
bool reducible(const at::Tensor& t, const c10d::ReduceOp& op);
// acc = op(acc, other), elementwise.
void reduce_into(at::Tensor& acc, const at::Tensor& other, const c10d::ReduceOp& op);

}  // namespace neuronx::distributed
