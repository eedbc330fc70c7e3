#include "backend/generator.h"

#include <deque>
#include <mutex>

#include "backend/common.h"

namespace neuronx {

NeuronGeneratorImpl::NeuronGeneratorImpl(c10::DeviceIndex d, uint64_t seed)
    : c10::GeneratorImpl(c10::Device(kNeuron, d), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      cpu_(at::make_generator<at::CPUGeneratorImpl>(seed)) {}

void NeuronGeneratorImpl::drain() const {
  if (!rt::is_initialized()) return;
  // Queued random kernels draw from this generator: let them finish first.
  // Their errors stay for the next synchronization the user makes.
  for (rt::Queue* q : runtime_device(device().index()).live_queues()) q->wait_idle();
}

void NeuronGeneratorImpl::set_current_seed(uint64_t seed) {
  drain();
  std::lock_guard<std::mutex> g(cpu_.mutex());
  cpu_.set_current_seed(seed);
}
uint64_t NeuronGeneratorImpl::current_seed() const { return cpu_.current_seed(); }
uint64_t NeuronGeneratorImpl::seed() {
  drain();
  std::lock_guard<std::mutex> g(cpu_.mutex());
  return cpu_.seed();
}
void NeuronGeneratorImpl::set_offset(uint64_t) {
  TORCH_CHECK(false, "neuron generators are mt19937 (like CPU) and have no Philox offset; "
                     "use get_state()/set_state() instead");
}
uint64_t NeuronGeneratorImpl::get_offset() const {
  TORCH_CHECK(false, "neuron generators are mt19937 (like CPU) and have no Philox offset; "
                     "use get_state()/set_state() instead");
}
void NeuronGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  drain();
  std::lock_guard<std::mutex> g(cpu_.mutex());
  cpu_.unsafeGetGeneratorImpl()->set_state(new_state);
}
c10::intrusive_ptr<c10::TensorImpl> NeuronGeneratorImpl::get_state() const {
  drain();
  std::lock_guard<std::mutex> g(cpu_.mutex());
  return cpu_.unsafeGetGeneratorImpl()->get_state();
}
NeuronGeneratorImpl* NeuronGeneratorImpl::clone_impl() const {
  drain();
  auto* g = new NeuronGeneratorImpl(device().index());
  std::lock_guard<std::mutex> lk(cpu_.mutex());
  g->cpu_ = cpu_.clone();
  return g;
}

const at::Generator& default_generator(c10::DeviceIndex d) {
  static std::once_flag once;
  static std::deque<at::Generator>* gens = nullptr;
  std::call_once(once, [] {
    gens = new std::deque<at::Generator>();
    for (int i = 0; i < rt::device_count(); ++i)
      gens->push_back(at::make_generator<NeuronGeneratorImpl>(static_cast<c10::DeviceIndex>(i)));
  });
  if (d < 0) d = current_device();
  TORCH_CHECK(d >= 0 && d < static_cast<int>(gens->size()), "invalid neuron device index ",
              static_cast<int>(d), " for a generator: ", gens->size(), " device(s) visible");
  return (*gens)[d];
}

at::Generator new_generator(c10::DeviceIndex d) {
  if (d < 0) d = current_device();
  runtime_device(d);
  return at::make_generator<NeuronGeneratorImpl>(d);
}

at::Generator kernel_generator(const std::optional<at::Generator>& g, c10::DeviceIndex d) {
  const at::Generator& src = (g.has_value() && g->defined()) ? *g : default_generator(d);
  TORCH_CHECK(src.device().type() == kNeuron,
              "Expected a 'neuron' device type for generator but found '", src.device().type(), "'");
  return src.get<NeuronGeneratorImpl>()->cpu_generator();
}

}  // namespace neuronx
