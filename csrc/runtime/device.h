#pragma once
// The simulated NeuronCores of this process and their queues.
//
// Nothing starts until first use (lazy init), so importing the package and
// forking DataLoader workers before any device work is free. A child forked
// after initialization cannot use the device (its worker threads are gone);
// it gets a clear error instead of a hang.
#include <array>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/caching_allocator.h"
#include "runtime/config.h"
#include "runtime/queue.h"

namespace neuronx::rt {

class Device {
 public:
  static constexpr int kPoolSize = 32;        // streams per priority level, as CUDA
  static constexpr int kPriorityLevels = 2;   // 0 (normal) and -1 (high)

  Device(int index, int physical, size_t hbm);
  int index() const { return index_; }
  int physical_core() const { return physical_; }
  CachingAllocator& allocator() { return allocator_; }

  // Stream ids: 0 is the default queue; 1 + level * kPoolSize + i are pool
  // queues (level 0: priority 0, level 1: priority -1).
  Queue& queue(uint64_t id);
  Queue& default_queue() { return queue(0); }
  // The queue collectives run on, served by its own engine (a "collective
  // core") so that communication overlaps compute. Not a user stream.
  static constexpr uint64_t kCollectiveQueueId = 1 + kPriorityLevels * kPoolSize;
  Queue& collective_queue();
  uint64_t next_pool_stream(int priority);
  static bool valid_stream_id(uint64_t id);
  static int priority_of(uint64_t id);
  std::vector<Queue*> live_queues();

  // Waits for every queue; throws the first recorded failure (clearing it).
  void synchronize();
  // Waits at most timeout_ns for every queue to go idle; true if they did (errors stay).
  bool wait_idle_for(int64_t timeout_ns);
  // Queue::discard_pending on every compute queue (not collectives: peers wait for them).
  void discard_pending();

 private:
  const int index_, physical_;
  CachingAllocator allocator_;
  std::mutex mu_;
  std::array<std::unique_ptr<Queue>, 1 + kPriorityLevels * kPoolSize> queues_;
  std::unique_ptr<Queue> collective_;
  std::array<std::atomic<uint32_t>, kPriorityLevels> next_{};
  // Declared last so they are destroyed first: an engine's worker drains and
  // walks the queues above (and frees into allocator_) until it is joined.
  Engine compute_;
  Engine collectives_;
};

// Process-wide registry. Throws rt::Error with the configuration problem if
// the environment is invalid, or kBadFork in a forked child.
int device_count() noexcept;          // 0 when the environment is invalid
const std::string& config_error();    // why device_count() is 0, if it is
Device& device(int index);            // initializes lazily; validates index
bool is_initialized();
bool in_bad_fork();
void check_usable();                  // throws kBadFork/kInvalidArgument
void synchronize_all();

}  // namespace neuronx::rt
