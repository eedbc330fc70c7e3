// The device allocator (c10::DeviceAllocator, so torch.accelerator.memory_*
// work) and the pinned host allocator, both thin adapters over the runtime.
#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>

#include <cstring>

#include "backend/kernel_scratch.h"
#include "backend/allocator.h"
#include "backend/common.h"
#include "backend/seen_values.h"
#include "runtime/host_allocator.h"

namespace neuronx {

namespace {

void device_delete(void* handle) {
  forget_seen_values(handle);
  rt::CachingAllocator::release(handle);
}

c10::CachingAllocator::Stat to_c10(const rt::Stat& s) {
  c10::CachingAllocator::Stat o;
  o.current = s.current;
  o.peak = s.peak;
  o.allocated = s.allocated;
  o.freed = s.freed;
  return o;
}

void copy_array(c10::CachingAllocator::StatArray& dst, const rt::StatArray& src) {
  for (size_t i = 0; i < src.size(); ++i) dst[i] = to_c10(src[i]);
}

class NeuronDeviceAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t n) override { return allocate_on(n, current_device()); }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    // Both sides are device memory: order after queued work, then copy.
    translate([] { rt::synchronize_all(); });
    std::memcpy(dest, src, count);
  }
  bool initialized() override { return rt::is_initialized(); }
  void emptyCache(c10::MempoolId_t) override {
    if (!rt::is_initialized()) return;
    for (int i = 0; i < rt::device_count(); ++i) runtime_device(i).allocator().empty_cache();
    empty_kernel_scratch();
  }
  void recordStream(const c10::DataPtr& ptr, c10::Stream s) override { record_stream_use(ptr, s); }
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex d) override {
    const rt::AllocatorStats s = runtime_device(d).allocator().stats();
    c10::CachingDeviceAllocator::DeviceStats o;
#define NEURONX_COPY(f) copy_array(o.f, s.f);
    NEURONX_ALLOCATOR_STAT_ARRAYS(NEURONX_COPY)
#undef NEURONX_COPY
#define NEURONX_COPY(f) o.f = to_c10(s.f);
    NEURONX_ALLOCATOR_STATS(NEURONX_COPY)
#undef NEURONX_COPY
#define NEURONX_COPY(f) o.f = s.f;
    NEURONX_ALLOCATOR_COUNTERS(NEURONX_COPY)
#undef NEURONX_COPY
    o.max_split_size = s.max_split_size;
    return o;
  }
  void resetAccumulatedStats(c10::DeviceIndex d) override {
    runtime_device(d).allocator().reset_accumulated_stats();
  }
  void resetPeakStats(c10::DeviceIndex d) override { runtime_device(d).allocator().reset_peak_stats(); }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex d) override {
    auto& a = runtime_device(d).allocator();
    const size_t total = a.capacity();
    const size_t cap = a.limit() ? a.limit() : total;
    const size_t reserved = a.reserved();
    return {cap > reserved ? cap - reserved : 0, total};
  }
};

NeuronDeviceAllocator g_device_allocator;

void host_delete(void* p) { rt::HostAllocator::instance().free(p); }

class NeuronHostAllocator final : public at::HostAllocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    void* p = translate([&] { return rt::HostAllocator::instance().malloc(n); });
    return {p, p, &host_delete, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &host_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
  // Pinned buffers used by queued copies are kept alive by the copy task.
  bool record_event(void*, void*, c10::Stream) override { return true; }
  void empty_cache() override { rt::HostAllocator::instance().empty_cache(); }
  at::HostStats get_stats() override {
    const rt::HostAllocatorStats s = rt::HostAllocator::instance().stats();
    at::HostStats o;
    o.active_requests.current = s.allocations;
    o.active_bytes.current = s.allocated_bytes;
    o.active_bytes.peak = s.peak_allocated_bytes;
    o.allocated_bytes.current = s.reserved_bytes;
    o.num_host_alloc = s.num_host_alloc;
    o.num_host_free = s.num_host_free;
    return o;
  }
  void reset_accumulated_stats() override { rt::HostAllocator::instance().reset_accumulated_stats(); }
  void reset_peak_stats() override { rt::HostAllocator::instance().reset_peak_stats(); }
};

NeuronHostAllocator g_host_allocator;

}  // namespace

c10::Allocator* device_allocator() { return &g_device_allocator; }

c10::DataPtr allocate_on(size_t n, c10::DeviceIndex d) {
  const CurrentStream s = current_stream(d);
  void* handle = nullptr;
  void* p = translate([&] { return s.device->allocator().malloc(n, &handle, s.queue); });
  return {p, handle, &device_delete, c10::Device(kNeuron, d)};
}

const rt::Queue* allocation_stream(const c10::DataPtr& p) {
  return p.get_deleter() == &device_delete ? rt::CachingAllocator::stream_of(p.get_context()) : nullptr;
}

void record_stream_use(const c10::DataPtr& p, c10::Stream s) {
  TORCH_CHECK(s.device_type() == kNeuron, "record_stream: expected a neuron stream, got ", s);
  if (p.get_deleter() != &device_delete) return;  // not from this allocator (e.g. a view of host memory)
  rt::Queue& q = translate([&]() -> rt::Queue& { return runtime_device(s.device_index()).queue(static_cast<uint64_t>(s.id())); });
  rt::CachingAllocator::record_stream(p.get_context(), &q);
}
at::HostAllocator* host_allocator() { return &g_host_allocator; }
bool is_pinned_ptr(const void* p) { return rt::HostAllocator::instance().is_pinned(p); }

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_device_allocator);
REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, &g_host_allocator);

}  // namespace neuronx
