// c10::impl::DeviceGuardImplInterface for neuron: devices, streams, events.
// torch.accelerator, torch.Stream/torch.Event and the autograd engine all
// reach the device through this.
#include <c10/core/DeviceCapability.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "backend/allocator.h"
#include "backend/common.h"

namespace neuronx {

namespace {

using EventHandle = std::shared_ptr<rt::Event>;

rt::Event& event_of(void* h) { return **static_cast<EventHandle*>(h); }

// Streams and devices may come without an index (torch.Stream(device="neuron")).
c10::DeviceIndex index_of(c10::Device d) { return d.has_index() ? d.index() : current_device(); }

rt::Queue& queue_of(const c10::Stream& s) {
  rt::Device& dev = runtime_device(s.device_index());
  return translate([&]() -> rt::Queue& { return dev.queue(static_cast<uint64_t>(s.id())); });
}

struct NeuronGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kNeuron; }

  c10::Device exchangeDevice(c10::Device d) const override {
    TORCH_INTERNAL_ASSERT(d.type() == kNeuron);
    const c10::DeviceIndex old = current_device();
    if (index_of(d) != old) set_current_device(index_of(d));
    return c10::Device(kNeuron, old);
  }
  c10::Device getDevice() const override { return c10::Device(kNeuron, current_device()); }
  void setDevice(c10::Device d) const override {
    TORCH_INTERNAL_ASSERT(d.type() == kNeuron);
    set_current_device(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    // Called from guard destructors, which must not throw: warn instead, as
    // CUDA's guard does (C10_CUDA_CHECK_WARN).
    // In a child forked after the device was initialised the op itself raised why; restoring
    // the device there has nothing to restore and would only repeat it.
    if (rt::in_bad_fork()) return;
    try {
      set_current_device(d.index());
    } catch (const c10::Error& e) {
      TORCH_WARN("neuron: could not restore the current device to ", d, ": ", e.what_without_backtrace());
    } catch (const std::exception& e) {
      TORCH_WARN("neuron: could not restore the current device to ", d, ": ", e.what());
    }
  }

  c10::Stream getStream(c10::Device d) const noexcept override {
    const auto i = index_of(d);
    return make_stream(i, current_stream_id(i));
  }
  c10::Stream getDefaultStream(c10::Device d) const override { return make_stream(index_of(d), 0); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high_priority) const override {
    const auto i = index_of(d);
    return make_stream(i, runtime_device(i).next_pool_stream(high_priority ? -1 : 0));
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    const auto i = index_of(d);
    return make_stream(i, runtime_device(i).next_pool_stream(priority));
  }
  c10::DeviceCapability getDeviceCapability(c10::Device) const override {
    c10::DeviceCapability cap;  // every dtype CPU kernels handle, but no quantized types
    cap.capability_data.supported_scalar_types.has_QInt8 = 0;
    cap.capability_data.supported_scalar_types.has_QUInt8 = 0;
    cap.capability_data.supported_scalar_types.has_QInt32 = 0;
    cap.capability_data.supported_scalar_types.has_QUInt4x2 = 0;
    cap.capability_data.supported_scalar_types.has_QUInt2x4 = 0;
    return cap;
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override {
    const c10::DeviceIndex d = s.device_index();
    const uint64_t old = current_stream_id(d);
    set_current_stream_id(d, static_cast<uint64_t>(s.id()));
    return make_stream(d, old);
  }

  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(rt::device_count());
  }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(),
                "Event device index ", static_cast<int>(device_index),
                " does not match recording stream's device index ", static_cast<int>(stream.device_index()), ".");
    if (!*event) *event = new EventHandle(rt::Event::create(flag == c10::EventFlag::BACKEND_DEFAULT));
    rt::Queue& q = queue_of(stream);
    translate([&] { event_of(*event).record(q); });
  }
  void block(void* event, const c10::Stream& stream) const override {
    if (!event) return;
    rt::Queue& q = queue_of(stream);
    event_of(event).block(q);
  }
  bool queryEvent(void* event) const override { return !event || event_of(event).query(); }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<EventHandle*>(event);
  }
  void synchronizeEvent(void* event) const override {
    if (!event) return;
    translate([&] { event_of(event).synchronize(); });
  }
  double elapsedTime(void* e1, void* e2, const c10::DeviceIndex) const override {
    TORCH_CHECK(e1 && e2, "Both events must be recorded before calculating elapsed time.");
    return translate([&] { return rt::Event::elapsed_ms(event_of(e1), event_of(e2)); });
  }

  bool queryStream(const c10::Stream& s) const override { return queue_of(s).query(); }
  void synchronizeStream(const c10::Stream& s) const override {
    rt::Queue& q = queue_of(s);
    translate([&] { q.synchronize(); });
  }
  void synchronizeDevice(const c10::DeviceIndex d) const override {
    rt::Device& dev = runtime_device(d);
    translate([&] { dev.synchronize(); });
  }
  void recordDataPtrOnStream(const c10::DataPtr& p, const c10::Stream& s) const override { record_stream_use(p, s); }
};

}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, NeuronGuardImpl);

}  // namespace neuronx
