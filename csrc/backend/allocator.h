#pragma once
#include <c10/core/Allocator.h>
#include <c10/core/Stream.h>

namespace at { struct HostAllocator; }
namespace neuronx::rt { class Queue; }
namespace neuronx {
// A device buffer of n bytes on device d, for the current stream there: the device allocator's
// allocate() without making d the current device first.
c10::DataPtr allocate_on(size_t n, c10::DeviceIndex d);
// The stream a device buffer was allocated for (null: not from the device allocator).
const rt::Queue* allocation_stream(const c10::DataPtr& p);
// Tensor.record_stream: the buffer is also used on stream s (see rt::CachingAllocator).
void record_stream_use(const c10::DataPtr& p, c10::Stream s);
at::HostAllocator* host_allocator();
bool is_pinned_ptr(const void* p);
}  // namespace neuronx
