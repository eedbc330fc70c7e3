#include "backend/seen_values.h"

#include <ATen/ops/aminmax.h>

#include <atomic>
#include <cmath>
#include <mutex>
#include <unordered_map>

namespace neuronx {

namespace {

// Copies larger than this are not scanned (the scan would cost as much as
// the copy); their storage's range becomes unknown.
constexpr int64_t kMaxScanned = 1 << 20;

// Leaked, as the runtime's singletons are: engine threads may free blocks
// while the process exits.
std::mutex& g_mu = *new std::mutex;
auto& g_seen = *new std::unordered_map<const void*, std::pair<int64_t, int64_t>>;  // by allocator block
std::atomic<size_t> g_count{0};  // lets the allocator's free skip the lock

const void* block_of(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return nullptr;
  return t.storage().data_ptr().get_context();
}

// The index dtypes ATen accepts (uint8 indexes as a mask).
bool is_index_dtype(c10::ScalarType s) { return s == c10::kLong || s == c10::kInt; }

// Whether t's elements are all of its storage (writing t replaces every value).
bool covers_storage(const at::Tensor& t) {
  return t.is_non_overlapping_and_dense() &&
         static_cast<size_t>(t.numel()) * t.element_size() == t.storage().nbytes();
}

// lo..hi written into dst; nullopt: values not known to the host.
void note(const at::Tensor& dst, std::optional<std::pair<int64_t, int64_t>> range) {
  const void* block = block_of(dst);
  if (!block || !is_index_dtype(dst.scalar_type())) return;
  const bool whole = covers_storage(dst);
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_seen.find(block);
  if (!range) {
    if (whole && it != g_seen.end()) {  // what was seen is overwritten
      g_seen.erase(it);
      g_count.fetch_sub(1, std::memory_order_relaxed);
    }
    return;
  }
  if (it == g_seen.end()) {
    g_seen.emplace(block, *range);
    g_count.fetch_add(1, std::memory_order_relaxed);
  } else if (whole) {
    it->second = *range;
  } else {
    it->second = {std::min(it->second.first, range->first), std::max(it->second.second, range->second)};
  }
}

}  // namespace

void note_host_copy(const at::Tensor& dst, const at::Tensor& src) {
  if (!is_index_dtype(dst.scalar_type())) return;
  if (!is_index_dtype(src.scalar_type()) || src.numel() == 0 || src.numel() > kMaxScanned) return note(dst, std::nullopt);
  auto [lo, hi] = at::aminmax(src);
  note(dst, std::make_pair(lo.item<int64_t>(), hi.item<int64_t>()));
}

void note_device_copy(const at::Tensor& dst, const at::Tensor& src) {
  if (!is_index_dtype(dst.scalar_type())) return;
  note(dst, is_index_dtype(src.scalar_type()) ? seen_values(src) : std::nullopt);
}

void note_fill(const at::Tensor& dst, const c10::IValue& value) {
  if (!is_index_dtype(dst.scalar_type())) return;
  // The fill converts the value to dst's type (torch.ones fills with 1.0).
  std::optional<double> v;
  if (value.isInt()) {
    v = static_cast<double>(value.toInt());
  } else if (value.isDouble()) {
    v = value.toDouble();
  } else if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    if (t.is_cpu() && t.numel() == 1 && !t.is_complex() && t.scalar_type() != c10::kBool) v = t.item<double>();
  }
  if (!v || !std::isfinite(*v) || std::abs(*v) >= 9.0e18) return note(dst, std::nullopt);
  const auto i = static_cast<int64_t>(std::trunc(*v));
  note(dst, std::make_pair(i, i));
}

std::optional<std::pair<int64_t, int64_t>> seen_values(const at::Tensor& t) {
  if (g_count.load(std::memory_order_relaxed) == 0) return std::nullopt;
  const void* block = block_of(t);
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_seen.find(block);
  if (it == g_seen.end()) return std::nullopt;
  return it->second;
}

void note_checked(const at::Tensor& t, int64_t lo, int64_t hi) {
  if (covers_storage(t)) note(t, std::make_pair(lo, hi));
}

void forget_seen_values(const void* block) {
  if (g_count.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard<std::mutex> g(g_mu);
  if (g_seen.erase(block)) g_count.fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace neuronx
