#include "backend/generator.h"

#include <deque>
#include <mutex>

#include "backend/common.h"

namespace neuronx {

NeuronGeneratorImpl::NeuronGeneratorImpl(c10::DeviceIndex d, uint64_t seed)
    : c10::GeneratorImpl(c10::Device(kNeuron, d), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      cpu_(at::make_generator<at::CPUGeneratorImpl>(seed)) {}

at::Generator NeuronGeneratorImpl::cpu_generator() const {
  std::lock_guard<std::mutex> g(swap_mu_);
  return cpu_;
}

void NeuronGeneratorImpl::install(at::Generator g) {
  std::lock_guard<std::mutex> lk(swap_mu_);
  cpu_ = std::move(g);
}

void NeuronGeneratorImpl::drain() const {
  if (!rt::is_initialized()) return;
  {
    std::lock_guard<std::mutex> g(swap_mu_);
    if (c10::raw::intrusive_ptr::use_count(cpu_.unsafeGetGeneratorImpl()) == 1) return;  // no kernel holds it
  }
  // Callers hold mutex_ (Note [Acquire lock when using random generators]); Python's generator
  // methods take it with the GIL held, and waiting for the queues drops the GIL. Waiting with
  // mutex_ held would deadlock against a thread that holds the GIL and wants mutex_: let it go
  // while waiting, and take it back after the GIL (the order Python's methods use).
  std::mutex& held = const_cast<std::mutex&>(mutex_);
  held.unlock();
  try {
    // Their errors stay for the next synchronization the user makes.
    for (rt::Queue* q : runtime_device(device().index()).live_queues()) q->wait_idle();
  } catch (...) {
    held.lock();
    throw;
  }
  held.lock();
}

void NeuronGeneratorImpl::set_current_seed(uint64_t seed) { install(at::make_generator<at::CPUGeneratorImpl>(seed)); }
uint64_t NeuronGeneratorImpl::current_seed() const { return cpu_generator().current_seed(); }
uint64_t NeuronGeneratorImpl::seed() {
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>();
  const uint64_t s = g.seed();
  install(std::move(g));
  return s;
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
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>();
  g.unsafeGetGeneratorImpl()->set_state(new_state);
  install(std::move(g));
}
c10::intrusive_ptr<c10::TensorImpl> NeuronGeneratorImpl::get_state() const {
  drain();
  at::Generator g = cpu_generator();
  std::lock_guard<std::mutex> lk(g.mutex());
  return g.unsafeGetGeneratorImpl()->get_state();
}

NeuronGeneratorImpl* NeuronGeneratorImpl::clone_impl() const {
  drain();
  auto* copy = new NeuronGeneratorImpl(device().index());
  at::Generator g = cpu_generator();
  std::lock_guard<std::mutex> lk(g.mutex());
  copy->cpu_ = g.clone();
  return copy;
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
