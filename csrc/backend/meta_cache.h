#pragma once
// Output metadata per op and input signature. Meta kernels (many of them
// Python references) cost tens of microseconds; a training loop repeats the
// same signatures, so the eager path pays that once per signature.
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/common.h"
#include "backend/tensor_views.h"

namespace neuronx {

// Shared by the host (which copies the shared_ptr per op) and the engine (which reads the
// geometry): aligned so that make_shared puts the fields on lines apart from the reference counts.
struct alignas(64) MetaResult {
  // Per return: nullopt = not a tensor (None); else the tensors (one unless a list).
  std::vector<std::optional<std::vector<Geometry>>> returns;
  std::vector<bool> return_is_list;
  std::vector<std::pair<size_t, Geometry>> written;  // final geometry of out= arguments
  // Set once a call with this signature ran (so its dtypes are known to be
  // supported): later hits skip the per-dtype validation lookup.
  mutable std::atomic<bool> dtypes_validated{false};
  // Resizing out= arguments with this signature: 0 not seen yet (run
  // synchronously, compare the CPU kernel's layout with the meta kernel's),
  // 1 they agree (resize on the host, queue the kernel), 2 always synchronous.
  mutable std::atomic<int> out_resize{0};
  // The CPU kernel chose another layout than the meta kernel for this
  // signature (channels_last kept where contiguous was predicted): later
  // calls run synchronously and adopt the CPU kernel's outputs.
  mutable std::atomic<bool> cpu_layout{false};
};

class MetaCache {
 public:
  static constexpr size_t kMaxEntries = 512;
  // Serializes everything that can change output metadata; false if some
  // argument kind is not understood (then the op is not cached).
  // Floating-point scalar values are left out unless float_values: they
  // decide output shapes only for a few factories (arange, linspace, ...),
  // while optimizers pass a new learning-rate-like value every step.
  static bool make_key(c10::ArrayRef<c10::IValue> args, std::string& key, bool float_values);
  // Only what decides whether the CPU kernel supports a call: operand dtypes
  // and devices, and the kinds of scalar arguments.
  static void make_dtype_key(c10::ArrayRef<c10::IValue> args, std::string& key);
  std::shared_ptr<const MetaResult> find(const std::string& key);
  void insert(const std::string& key, std::shared_ptr<const MetaResult> r);

 private:
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const MetaResult>> map_;
};

}  // namespace neuronx
