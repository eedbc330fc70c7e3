// Per-thread current device and stream, and error translation.
#include "backend/common.h"

#include <array>

namespace neuronx {

namespace {
constexpr int kMaxDevices = 64;
thread_local c10::DeviceIndex t_device = 0;
thread_local std::array<uint64_t, kMaxDevices> t_stream{};  // 0 = default queue
}  // namespace

void rethrow_runtime_error(const rt::Error& e) {
  switch (e.code()) {
    case rt::ErrorCode::kOutOfMemory:
      TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
    case rt::ErrorCode::kInvalidArgument:
      TORCH_CHECK(false, e.what());
    case rt::ErrorCode::kKernelFailed:
      TORCH_CHECK(false, e.what(),
                  "\nneuron kernels run asynchronously, so the failing op may be earlier than this "
                  "line. Set NEURON_LAUNCH_BLOCKING=1 to raise at the faulting op.");
    case rt::ErrorCode::kBadFork:
    case rt::ErrorCode::kInternal:
      TORCH_CHECK(false, e.what());
  }
  TORCH_CHECK(false, e.what());
}

rt::Device& runtime_device(c10::DeviceIndex d) {
  return translate([&]() -> rt::Device& { return rt::device(d); });
}

c10::DeviceIndex current_device() { return t_device; }

void set_current_device(c10::DeviceIndex d) {
  runtime_device(d);  // validates the index with a clear message
  t_device = d;
}

uint64_t current_stream_id(c10::DeviceIndex d) {
  TORCH_CHECK(d >= 0 && d < kMaxDevices, "invalid neuron device index ", static_cast<int>(d));
  return t_stream[d];
}

void set_current_stream_id(c10::DeviceIndex d, uint64_t id) {
  TORCH_CHECK(d >= 0 && d < kMaxDevices, "invalid neuron device index ", static_cast<int>(d));
  t_stream[d] = id;
}

rt::Queue& current_queue(c10::DeviceIndex d) {
  rt::Device& dev = runtime_device(d);
  return translate([&]() -> rt::Queue& { return dev.queue(t_stream[d]); });
}

c10::Stream make_stream(c10::DeviceIndex d, uint64_t id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNeuron, d), static_cast<c10::StreamId>(id));
}

}  // namespace neuronx
