#pragma once
// A map from pointers to values for the operands of one op: a linear scan
// while small (most ops have a handful of operands), a hash table once it
// grows (foreach ops, cat and stack pass thousands), so lookups over a whole
// call stay linear in its operand count.
#include <c10/util/SmallVector.h>

#include <unordered_map>
#include <utility>

namespace neuronx {

template <typename K, typename V, size_t kScanLimit = 16>
class SmallIndex {
 public:
  V* find(K key) {
    if (entries_.size() <= kScanLimit) {
      for (auto& [k, v] : entries_)
        if (k == key) return &v;
      return nullptr;
    }
    auto it = hashed_.find(key);
    return it == hashed_.end() ? nullptr : &entries_[it->second].second;
  }
  // Adds key (or replaces its value) and returns the stored value.
  V& put(K key, V value) {
    if (V* v = find(key)) return *v = std::move(value);
    entries_.emplace_back(key, std::move(value));
    if (entries_.size() == kScanLimit + 1)
      for (size_t i = 0; i < entries_.size(); ++i) hashed_.emplace(entries_[i].first, i);
    else if (entries_.size() > kScanLimit + 1)
      hashed_.emplace(key, entries_.size() - 1);
    return entries_.back().second;
  }
  size_t size() const { return entries_.size(); }
  void clear() {
    entries_.clear();
    if (!hashed_.empty()) hashed_.clear();
  }

 private:
  c10::SmallVector<std::pair<K, V>, 4> entries_;
  std::unordered_map<K, size_t> hashed_;
};

}  // namespace neuronx
