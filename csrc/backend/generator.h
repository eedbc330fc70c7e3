#pragma once
// Per-device random generators. Kernels on the simulated device are ATen's
// CPU kernels, so a neuron generator wraps a CPU (mt19937) generator: with the
// same seed, random ops on neuron produce the same values as on CPU.
//
// Its state is CUDA's layout, (seed, offset) as 16 bytes, so that code which moves a device
// generator's offset (DTensor's random-number tracker) works: the offset is the mt19937 stream
// position, in 32-bit draws since seeding. Setting an offset positions the stream there (a
// fresh stream at that point: no cached normal sample); reading one counts the draws since the
// last known position. A state read and set back restores the generator exactly, cached
// normal samples included (the full CPU states handed out recently are kept).
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/core/MT19937RNGEngine.h>

#include <deque>

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
  // The CPU generator a random kernel launched now draws from (it keeps it until it ran).
  at::Generator cpu_generator() const;

 private:
  NeuronGeneratorImpl* clone_impl() const override;
  // Reading the state must see the draws of kernels already queued: waits for them (only if a
  // queued kernel still holds the current CPU generator), with mutex_ (held by the caller)
  // released meanwhile.
  void drain() const;
  // Seeding and setting the state install a new CPU generator instead of changing the one queued
  // kernels hold: they draw from the old one, kernels launched later from the new one, as in
  // program order, and the host does not wait. (Waiting here would hold the generator's mutex,
  // which Python's generator methods take with the GIL held, while dropping the GIL: two threads
  // seeding at once deadlocked.)
  void install(at::Generator g);
  // Restarts the stream accounting at `origin` (offset 0) with this seed.
  void restart(uint64_t seed, const at::mt19937& origin);
  // The current stream position; moves the anchor there (caller holds mutex_, queues drained).
  uint64_t current_offset() const;
  void position_at(uint64_t offset);
  mutable std::mutex swap_mu_;  // guards cpu_ (the handle, not the generator's state)
  at::Generator cpu_;
  // Stream accounting, under mutex_ (Python's generator methods hold it).
  uint64_t seed_;
  at::mt19937 origin_;                 // the engine at offset 0
  mutable at::mt19937 anchor_;         // the engine at anchor_offset_ (a known position)
  mutable uint64_t anchor_offset_ = 0;
  mutable std::deque<std::pair<uint64_t, at::Tensor>> exact_;  // full CPU states by offset, newest last
};

const at::Generator& default_generator(c10::DeviceIndex d);
at::Generator new_generator(c10::DeviceIndex d);
// Resolves a generator argument of a random op to the CPU generator its
// kernel must use on device d (the device default when none is given).
at::Generator kernel_generator(const std::optional<at::Generator>& g, c10::DeviceIndex d);

}  // namespace neuronx
