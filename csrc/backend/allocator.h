#pragma once
namespace at { struct HostAllocator; }
namespace neuronx {
at::HostAllocator* host_allocator();
bool is_pinned_ptr(const void* p);
}  // namespace neuronx
