#pragma once
// Per-device random generators. Kernels on the simulated device are ATen's
// CPU kernels, so a neuron generator wraps a CPU (mt19937) generator: with the
// same seed, random ops on neuron produce the same values as on CPU.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>

namespace neuronx {

class NeuronGeneratorImpl final : public c10::GeneratorImpl {
 public:
  explicit NeuronGeneratorImpl(c10::DeviceIndex d, uint64_t seed = c10::default_rng_seed_val);
  void set_current_seed(uint64_t seed) override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }
  // The CPU generator that kernels on the queue draw from.
  const at::Generator& cpu_generator() const { return cpu_; }

 private:
  NeuronGeneratorImpl* clone_impl() const override;
  // Host-side state changes must not race queued random kernels: drain first.
  void drain() const;
  mutable at::Generator cpu_;
};

const at::Generator& default_generator(c10::DeviceIndex d);
at::Generator new_generator(c10::DeviceIndex d);
// Resolves a generator argument of a random op to the CPU generator its
// kernel must use on device d (the device default when none is given).
at::Generator kernel_generator(const std::optional<at::Generator>& g, c10::DeviceIndex d);

}  // namespace neuronx
