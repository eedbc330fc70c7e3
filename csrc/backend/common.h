#pragma once
// Shared by the backend layer (also its precompiled header): the narrow ATen
// headers the glue needs, and the helpers that map runtime concepts onto
// PyTorch's (devices, current stream, errors).
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Stream.h>
#include <c10/util/Exception.h>

#include "runtime/device.h"
#include "runtime/error.h"

namespace neuronx {

constexpr c10::DeviceType kNeuron = c10::DeviceType::PrivateUse1;

// Rethrows a runtime error as the PyTorch exception a user expects
// (torch.OutOfMemoryError, RuntimeError, ...).
[[noreturn]] void rethrow_runtime_error(const rt::Error& e);

// Runs fn, translating rt::Error into PyTorch exceptions.
template <typename F>
decltype(auto) translate(F&& fn) {
  try {
    return fn();
  } catch (const rt::Error& e) {
    rethrow_runtime_error(e);
  }
}

// Categories of rt::KernelError: the c10 exception type a failed kernel raised.
enum class KernelErrorKind : int { kOther = 0, kIndex, kValue, kType, kNotImplemented, kLinAlg };
KernelErrorKind kernel_error_kind(const c10::Error& e);

// Current device of this thread (the guard's notion), initialized lazily.
c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex d);
rt::Device& runtime_device(c10::DeviceIndex d);

// Current stream (queue id) of this thread for device d.
uint64_t current_stream_id(c10::DeviceIndex d);
void set_current_stream_id(c10::DeviceIndex d, uint64_t id);
// The device and its queue for the thread's current stream on device d.
struct CurrentStream {
  rt::Device* device;
  rt::Queue* queue;
};
CurrentStream current_stream(c10::DeviceIndex d);
rt::Queue& current_queue(c10::DeviceIndex d);
c10::Stream make_stream(c10::DeviceIndex d, uint64_t id);

// The device allocator (c10::DeviceAllocator registered for PrivateUse1).
c10::Allocator* device_allocator();

}  // namespace neuronx
