#pragma once
#include <cstddef>
#include <utility>
#include <vector>

namespace neuronx::rt {

// A per-thread stash of up to N objects kept for reuse. take() hands one out (a default-constructed
// T when the stash is empty, or after the thread's stash was destroyed at thread exit); keep()
// stores one, or drops it when the stash is full or gone.
template <typename T, size_t N>
class ThreadStash {
 public:
  static T take() {
    std::vector<T>* s = stash();
    if (!s || s->empty()) return T();
    T v = std::move(s->back());
    s->pop_back();
    return v;
  }
  static void keep(T&& v) {
    std::vector<T>* s = stash();
    if (s && s->size() < N) s->push_back(std::move(v));
  }

 private:
  struct Owner {
    std::vector<T> items;
    Owner() { current = &items; }
    ~Owner() {
      current = nullptr;
      dead = true;
    }
  };
  static inline thread_local std::vector<T>* current = nullptr;
  static inline thread_local bool dead = false;
  static std::vector<T>* stash() {
    if (current || dead) return current;
    thread_local Owner owner;
    return current;
  }
};

// Containers made and dropped once per op (a kernel's argument stack, an op's results) keep
// their capacity in a per-thread stash instead of going through malloc every op. take() hands
// out an empty container; give() clears it (destroying its elements now) and keeps it.
// N covers what a full queue holds (each queued kernel has two; rt::Queue::kMaxPending).
template <typename V, size_t N = 4096>
class Recycled {
 public:
  static V take() { return ThreadStash<V, N>::take(); }
  static void give(V&& v) {
    v.clear();
    if (v.capacity() > 0) ThreadStash<V, N>::keep(std::move(v));
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
