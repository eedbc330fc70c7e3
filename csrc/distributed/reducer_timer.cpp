// DDP's runtime statistics on neuron (forward, backward compute and communication times, in
// DDPLoggingData): the reducer creates a timer for its parameters' device type; without one for
// PrivateUse1 it collects nothing and warns once. Like CUDA's, this one records a timing event
// on the current stream at each point, so the figures are device time.
#include <c10/core/Event.h>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

#include <array>

#include "backend/common.h"

namespace neuronx {

namespace {

class NeuronTimer final : public c10d::Timer {
 public:
  explicit NeuronTimer(c10::Device device) : device_(device) {}

  void record(Event event) override {
    Timer::record(event);  // the host-side time, which the logger also reads
    c10::DeviceGuard guard(device_);
    const c10::DeviceIndex d = device_.index();
    event_of(event).record(make_stream(d, current_stream_id(d)));
  }

  std::optional<int64_t> measureDifference(Event start, Event end) override {
    c10::Event& a = event_of(start);
    c10::Event& b = event_of(end);
    if (!a.was_marked_for_recording() || !b.was_marked_for_recording()) return std::nullopt;
    a.synchronize();
    b.synchronize();
    const double ms = a.elapsedTime(b);
    if (ms < 0) return std::nullopt;  // the end was recorded before the start this iteration
    return static_cast<int64_t>(ms * 1e6);
  }

 private:
  c10::Event& event_of(Event e) { return events_[static_cast<size_t>(e)]; }
  c10::Device device_;
  std::array<c10::Event, 5> events_{
      c10::Event(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT),
      c10::Event(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT),
      c10::Event(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT),
      c10::Event(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT),
      c10::Event(c10::DeviceType::PrivateUse1, c10::EventFlag::BACKEND_DEFAULT)};
};

}  // namespace

}  // namespace neuronx

namespace c10d {
namespace {
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, neuronx::NeuronTimer);
}  // namespace
}  // namespace c10d
