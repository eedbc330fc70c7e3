#include "runtime/device.h"

#include "runtime/event.h"
#include "runtime/telemetry.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <optional>

namespace neuronx::rt {

Device::Device(int index, int physical, size_t hbm)
    : index_(index), physical_(physical), allocator_(index, hbm),
      // The host issues compute ops microseconds apart; collectives come far
      // apart, and a polling thread would take a core from the transport.
      compute_(index, "neuron:" + std::to_string(index) + "/compute"),
      collectives_(index, "neuron:" + std::to_string(index) + "/collectives", 0) {}

Queue& Device::collective_queue() {
  std::lock_guard<std::mutex> g(mu_);
  if (!collective_) collective_ = std::make_unique<Queue>(&collectives_, index_, kCollectiveQueueId, 0);
  return *collective_;
}

bool Device::valid_stream_id(uint64_t id) { return id < 1 + kPriorityLevels * kPoolSize; }

int Device::priority_of(uint64_t id) { return id == 0 ? 0 : -static_cast<int>((id - 1) / kPoolSize); }

Queue& Device::queue(uint64_t id) {
  if (!valid_stream_id(id))
    throw Error(ErrorCode::kInvalidArgument,
                "invalid neuron stream id " + std::to_string(id) + " on neuron:" + std::to_string(index_));
  std::lock_guard<std::mutex> g(mu_);
  auto& slot = queues_[id];
  if (!slot) slot = std::make_unique<Queue>(&compute_, index_, id, priority_of(id));
  return *slot;
}

uint64_t Device::next_pool_stream(int priority) {
  // Any negative priority maps to the high-priority level (CUDA clamps the same way).
  const int level = priority < 0 ? 1 : 0;
  const uint32_t i = next_[level].fetch_add(1) % kPoolSize;
  return 1 + static_cast<uint64_t>(level) * kPoolSize + i;
}

std::vector<Queue*> Device::live_queues() {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<Queue*> out;
  for (auto& q : queues_)
    if (q) out.push_back(q.get());
  if (collective_) out.push_back(collective_.get());
  return out;
}

void Device::synchronize() {
  // Drain every queue even if one failed, then report the first failure.
  std::optional<Error> first;
  for (Queue* q : live_queues()) {
    try {
      q->synchronize();
    } catch (const Error& e) {
      if (!first) first = e;
    }
  }
  if (first) throw *first;
}

bool Device::wait_idle_for(int64_t timeout_ns) {
  const int64_t deadline = now_ns() + timeout_ns;
  for (Queue* q : live_queues())
    if (!q->wait_idle_for(std::max<int64_t>(0, deadline - now_ns()))) return false;
  return true;
}

void Device::discard_pending() {
  for (Queue* q : live_queues())
    if (q != collective_.get()) q->discard_pending();
}

namespace {

std::atomic<bool> g_initialized{false};
std::atomic<bool> g_bad_fork{false};

void on_fork_child() {
  if (g_initialized.load()) g_bad_fork.store(true);
}

struct Registry {
  std::once_flag once;
  std::vector<std::unique_ptr<Device>> devices;
};

Registry& registry() {
  // Leaked: worker threads may still run while static destructors do.
  static Registry* r = new Registry;
  return *r;
}

}  // namespace

int device_count() noexcept {
  const Config& c = config();
  return c.error.empty() ? static_cast<int>(c.visible.size()) : 0;
}

const std::string& config_error() { return config().error; }

bool is_initialized() { return g_initialized.load(); }
bool in_bad_fork() { return g_bad_fork.load(); }

void check_usable() {
  if (g_bad_fork.load())
    throw Error(ErrorCode::kBadFork,
                "Cannot re-initialize neuron in forked subprocess. To use neuron with "
                "multiprocessing, you must use the 'spawn' start method");
  const Config& c = config();
  if (!c.error.empty()) throw Error(ErrorCode::kInvalidArgument, c.error);
}

Device& device(int index) {
  check_usable();
  Registry& r = registry();
  std::call_once(r.once, [&] {
    const Config& c = config();
    telemetry::publish(static_cast<int>(c.visible.size()));
    for (size_t i = 0; i < c.visible.size(); ++i) {
      if (telemetry::CoreCounters* t = telemetry::core(static_cast<int>(i))) {
        t->capacity.store(c.hbm_bytes, std::memory_order_relaxed);
        t->physical_core.store(c.visible[i], std::memory_order_relaxed);
      }
      r.devices.push_back(std::make_unique<Device>(static_cast<int>(i), c.visible[i], c.hbm_bytes));
      CachingAllocator& a = r.devices.back()->allocator();
      if (c.memory_fraction > 0) a.set_limit(static_cast<size_t>(c.memory_fraction * static_cast<double>(c.hbm_bytes)));
      if (c.gc_threshold > 0) a.set_gc_threshold(c.gc_threshold);
    }
    pthread_atfork(nullptr, nullptr, &on_fork_child);
    g_initialized.store(true);
  });
  if (index < 0 || index >= static_cast<int>(r.devices.size()))
    throw Error(ErrorCode::kInvalidArgument,
                "invalid neuron device index " + std::to_string(index) + ": this process sees " +
                    std::to_string(r.devices.size()) +
                    " NeuronCore(s) (valid indices 0.." + std::to_string(static_cast<int>(r.devices.size()) - 1) +
                    "); check NEURON_RT_VISIBLE_CORES and TORCH_NEURONX_SIM_CORES");
  return *r.devices[index];
}

void synchronize_all() {
  for (int i = 0; i < device_count(); ++i) device(i).synchronize();
}

}  // namespace neuronx::rt
