#pragma once
#include <cstddef>
#include <utility>
#include <vector>

namespace neuronx::rt {

// Containers made and dropped once per op (a kernel's argument stack, an op's results) keep
// their capacity in a per-thread stash instead of going through malloc every op. take() hands
// out an empty container (a fresh one when the stash is empty, or after the thread's stash was
// destroyed at thread exit); give() clears it (destroying its elements now) and keeps it.
// N covers what a full queue holds (each queued kernel has two; rt::Queue::kMaxPending).
template <typename V, size_t N = 4096>
class Recycled {
 public:
  static V take() {
    std::vector<V>* s = stash();
    if (!s || s->empty()) return V();
    V v = std::move(s->back());
    s->pop_back();
    return v;
  }
  static void give(V&& v) {
    v.clear();
    std::vector<V>* s = stash();
    if (s && s->size() < N && v.capacity() > 0) s->push_back(std::move(v));
  }

 private:
  struct Owner {
    std::vector<V> items;
    Owner() { current = &items; }
    ~Owner() {
      current = nullptr;
      dead = true;
    }
  };
  static inline thread_local std::vector<V>* current = nullptr;
  static inline thread_local bool dead = false;
  static std::vector<V>* stash() {
    if (current || dead) return current;
    thread_local Owner owner;
    return current;
  }
};

// An object's container borrowed from Recycled for one scope.
template <typename V>
struct RecycledScope {
  V value = Recycled<V>::take();
  RecycledScope() = default;
  RecycledScope(const RecycledScope&) = delete;
  RecycledScope& operator=(const RecycledScope&) = delete;
  ~RecycledScope() { Recycled<V>::give(std::move(value)); }
};

}  // namespace neuronx::rt
