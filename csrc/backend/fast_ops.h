#pragma once
// The ops that get unboxed entry points into the fallback (fast_ops.cpp).
#include <torch/library.h>

#include <atomic>
#include <cstdint>
#include <vector>

namespace neuronx {

struct FastOp {
  const char* name;           // "aten::add"
  const char* overload_name;  // "Tensor"
  void (*register_impl)(torch::Library& lib, const char* op);  // lib.impl(op, <unboxed entry>)
  const std::atomic<uint64_t>* calls;                          // calls through the entry point
};

const std::vector<FastOp>& fast_ops();

}  // namespace neuronx
