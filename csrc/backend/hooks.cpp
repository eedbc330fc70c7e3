// at::PrivateUse1HooksInterface: availability, generators, pinned memory,
// lazy initialization.
#include <ATen/detail/PrivateUse1HooksInterface.h>

#include <ATen/core/CachingHostAllocator.h>

#include "backend/allocator.h"
#include "backend/common.h"
#include "backend/registration.h"
#include "backend/tensor_views.h"
#include "backend/generator.h"
#include "runtime/host_allocator.h"

namespace neuronx {

namespace {

struct NeuronHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return rt::device_count() > 0 && !rt::in_bad_fork(); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex d) const override {
    init();
    return default_generator(d);
  }
  at::Generator getNewGenerator(c10::DeviceIndex d) const override { return new_generator(d); }
  at::Device getDeviceFromPtr(void* data) const override {
    for (int i = 0; i < rt::device_count(); ++i)
      if (runtime_device(i).allocator().owns(data)) return c10::Device(kNeuron, i);
    TORCH_CHECK(false, "pointer ", data, " is not neuron device memory");
  }
  bool isPinnedPtr(const void* data) const override { return is_pinned_ptr(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return host_allocator(); }
  bool hasPrimaryContext(c10::DeviceIndex d) const override {
    return rt::is_initialized() && d >= 0 && d < rt::device_count();
  }
  void init() const override {
    translate([] {
      rt::check_usable();
      if (rt::device_count() > 0) rt::device(0);
    });
  }
  c10::DeviceIndex deviceCount() const override { return static_cast<c10::DeviceIndex>(rt::device_count()); }
  void setCurrentDevice(c10::DeviceIndex d) const override { set_current_device(d); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    const c10::DeviceIndex old = current_device();
    set_current_device(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override;
};

}  // namespace


void NeuronHooks::resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const {
  resize_storage_bytes(storage.unsafeGetStorageImpl(), newsize);
}

void register_hooks() {
  static NeuronHooks hooks;
  at::RegisterPrivateUse1HooksInterface(&hooks);
}

}  // namespace neuronx
