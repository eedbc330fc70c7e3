#pragma once
// The range of integer values the host has seen written into a device
// storage (copies from CPU, fills with a scalar). Advanced indexing uses it to
// decide, without reading device memory, whether an index may be out of
// range; only then does it wait for the index and check it at the op, as CPU
// does, instead of leaving the error to the kernel and the next
// synchronization (CUDA's device-side assert).
//
// A hint, never a fact: a write the host did not see (a kernel's output)
// leaves it stale. A stale range costs one needless wait, or leaves an error
// to surface at the next synchronization; it never changes a result.
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <optional>
#include <utility>

namespace neuronx {

// After host -> device copies (src on CPU), device copies and fills of dst.
void note_host_copy(const at::Tensor& dst, const at::Tensor& src);
void note_device_copy(const at::Tensor& dst, const at::Tensor& src);
void note_fill(const at::Tensor& dst, const c10::IValue& value);

// The [min, max] seen for t's storage, if any write was seen.
std::optional<std::pair<int64_t, int64_t>> seen_values(const at::Tensor& t);

// The values of t (waited for and read): replaces the seen range when t
// covers its whole storage.
void note_checked(const at::Tensor& t, int64_t lo, int64_t hi);

// The allocator frees a block: whatever was seen in it is gone.
void forget_seen_values(const void* block);

}  // namespace neuronx
