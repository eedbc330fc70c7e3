// Per-thread current device and stream, and error translation.
#include "backend/common.h"

#include <array>
#include <cstdlib>

namespace neuronx {

namespace {
constexpr int kMaxDevices = 64;
thread_local c10::DeviceIndex t_device = -1;  // -1: the process default

// A process launched by torchrun (LOCAL_RANK set) starts on neuron:{LOCAL_RANK}
// (modulo the visible cores), so per-rank code that uses the current device,
// as accelerate's MULTI_NEURON state does, lands on its own core. Otherwise 0.
c10::DeviceIndex process_default_device() {
  static const c10::DeviceIndex d = [] {
    const char* lr = std::getenv("LOCAL_RANK");
    const int n = rt::device_count();
    if (!lr || n <= 0) return c10::DeviceIndex{0};
    char* end = nullptr;
    const long v = std::strtol(lr, &end, 10);
    if (end == lr || *end != '\0' || v < 0) return c10::DeviceIndex{0};
    return static_cast<c10::DeviceIndex>(v % n);
  }();
  return d;
}
thread_local std::array<uint64_t, kMaxDevices> t_stream{};  // 0 = default queue
}  // namespace

KernelErrorKind kernel_error_kind(const c10::Error& e) {
  if (dynamic_cast<const c10::IndexError*>(&e)) return KernelErrorKind::kIndex;
  if (dynamic_cast<const c10::ValueError*>(&e)) return KernelErrorKind::kValue;
  if (dynamic_cast<const c10::TypeError*>(&e)) return KernelErrorKind::kType;
  if (dynamic_cast<const c10::NotImplementedError*>(&e)) return KernelErrorKind::kNotImplemented;
  if (dynamic_cast<const c10::LinAlgError*>(&e)) return KernelErrorKind::kLinAlg;  // torch.linalg.LinAlgError
  return KernelErrorKind::kOther;
}

void rethrow_runtime_error(const rt::Error& e) {
  switch (e.code()) {
    case rt::ErrorCode::kOutOfMemory:
      TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
    case rt::ErrorCode::kInvalidArgument:
      TORCH_CHECK(false, e.what());
    case rt::ErrorCode::kKernelFailed: {
      // Raise the kernel's own exception type (IndexError for an index out of
      // range, as on CPU), with where to look.
      const char* hint =
          "\nneuron kernels run asynchronously, so the failing op may be earlier than this "
          "line. Set NEURON_LAUNCH_BLOCKING=1 to raise at the faulting op.";
      switch (static_cast<KernelErrorKind>(e.category())) {
        case KernelErrorKind::kIndex:
          TORCH_CHECK_INDEX(false, e.what(), hint);
        case KernelErrorKind::kValue:
          TORCH_CHECK_VALUE(false, e.what(), hint);
        case KernelErrorKind::kType:
          TORCH_CHECK_TYPE(false, e.what(), hint);
        case KernelErrorKind::kNotImplemented:
          TORCH_CHECK_NOT_IMPLEMENTED(false, e.what(), hint);
        case KernelErrorKind::kLinAlg:
          TORCH_CHECK_LINALG(false, e.what(), hint);
        case KernelErrorKind::kOther:
          break;
      }
      TORCH_CHECK(false, e.what(), hint);
      break;  // unreachable: TORCH_CHECK(false) throws
    }
    case rt::ErrorCode::kBadFork:
    case rt::ErrorCode::kInternal:
      TORCH_CHECK(false, e.what());
  }
  TORCH_CHECK(false, e.what());
}

rt::Device& runtime_device(c10::DeviceIndex d) {
  return translate([&]() -> rt::Device& { return rt::device(d); });
}

c10::DeviceIndex current_device() { return t_device >= 0 ? t_device : process_default_device(); }

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

CurrentStream current_stream(c10::DeviceIndex d) {
  // Every op asks for it (to queue its kernel, to allocate its outputs): remember the last
  // answer per thread. Queues live as long as their device; a forked child still gets its error.
  thread_local c10::DeviceIndex last_device = -1;
  thread_local uint64_t last_id = 0;
  thread_local CurrentStream last{};
  if (d == last_device && last.queue && t_stream[d] == last_id && !rt::in_bad_fork()) return last;
  rt::Device& dev = runtime_device(d);
  rt::Queue& q = translate([&]() -> rt::Queue& { return dev.queue(t_stream[d]); });
  last_device = d;
  last_id = t_stream[d];
  last = {&dev, &q};
  return last;
}

rt::Queue& current_queue(c10::DeviceIndex d) { return *current_stream(d).queue; }

c10::Stream make_stream(c10::DeviceIndex d, uint64_t id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNeuron, d), static_cast<c10::StreamId>(id));
}

}  // namespace neuronx
