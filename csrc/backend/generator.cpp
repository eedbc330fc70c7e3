#include "backend/generator.h"

#include <cstring>
#include <deque>
#include <mutex>

#include <ATen/EmptyTensor.h>

#include "backend/common.h"

namespace neuronx {

namespace {

constexpr uint64_t kBlock = at::MERSENNE_STATE_N;  // draws per mt19937 twist
constexpr size_t kExactStates = 16;

// Draws consumed from the engine's current block (a fresh engine counts as a used-up block:
// its first draw twists). left_ + next_ == 625 within a block.
uint64_t used_in_block(const at::mt19937_data_pod& d) { return kBlock + 1 - static_cast<uint64_t>(d.left_); }

// `e` moved n draws ahead: whole blocks by twisting, no tempering of skipped draws.
at::mt19937 advance(at::mt19937 e, uint64_t n) {
  at::mt19937_data_pod d = e.data();
  while (n > 0) {
    const uint64_t room = static_cast<uint64_t>(d.left_ - 1);  // draws before the next twist
    if (n <= room) {
      d.left_ -= static_cast<int>(n);
      d.next_ += static_cast<uint32_t>(n);
      break;
    }
    n -= room;
    d.left_ = 1;
    d.next_ += static_cast<uint32_t>(room);
    e.set_data(d);
    e();  // twists, and is the block's first draw
    d = e.data();
    --n;
  }
  e.set_data(d);
  return e;
}

// Draws from `from` to `to`, which is `from` or a later position of the same stream.
uint64_t draws_between(const at::mt19937& from, const at::mt19937& to) {
  at::mt19937_data_pod a = from.data();
  const at::mt19937_data_pod b = to.data();
  const uint64_t start = used_in_block(a);
  uint64_t twists = 0;
  at::mt19937 sim;
  while (a.state_ != b.state_) {
    a.left_ = 1;
    sim.set_data(a);
    sim();
    a = sim.data();
    ++twists;
  }
  const uint64_t end = twists * kBlock + used_in_block(b);
  TORCH_INTERNAL_ASSERT(end >= start, "neuron generator: stream position went backwards");
  return end - start;
}

}  // namespace

NeuronGeneratorImpl::NeuronGeneratorImpl(c10::DeviceIndex d, uint64_t seed)
    : c10::GeneratorImpl(c10::Device(kNeuron, d), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      cpu_(at::make_generator<at::CPUGeneratorImpl>(seed)),
      seed_(seed),
      origin_(seed),
      anchor_(seed) {}

void NeuronGeneratorImpl::restart(uint64_t seed, const at::mt19937& origin) {
  seed_ = seed;
  origin_ = origin;
  anchor_ = origin;
  anchor_offset_ = 0;
  exact_.clear();
}

uint64_t NeuronGeneratorImpl::current_offset() const {
  at::Generator g = cpu_generator();
  std::lock_guard<std::mutex> lk(g.mutex());
  const at::mt19937 now = g.get<at::CPUGeneratorImpl>()->engine();
  anchor_offset_ += draws_between(anchor_, now);
  anchor_ = now;
  return anchor_offset_;
}

void NeuronGeneratorImpl::position_at(uint64_t offset) {
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(seed_);
  for (auto it = exact_.rbegin(); it != exact_.rend(); ++it) {
    if (it->first != offset) continue;
    g.unsafeGetGeneratorImpl()->set_state(*it->second.unsafeGetTensorImpl());  // as read, cached normals too
    anchor_ = g.get<at::CPUGeneratorImpl>()->engine();
    anchor_offset_ = offset;
    install(std::move(g));
    return;
  }
  const bool from_anchor = anchor_offset_ <= offset;
  const at::mt19937 engine =
      advance(from_anchor ? anchor_ : origin_, offset - (from_anchor ? anchor_offset_ : 0));
  g.get<at::CPUGeneratorImpl>()->set_engine(engine);
  anchor_ = engine;
  anchor_offset_ = offset;
  install(std::move(g));
}

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

void NeuronGeneratorImpl::set_current_seed(uint64_t seed) {
  install(at::make_generator<at::CPUGeneratorImpl>(seed));
  restart(seed, at::mt19937(seed));
}
uint64_t NeuronGeneratorImpl::current_seed() const { return seed_; }
uint64_t NeuronGeneratorImpl::seed() {
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>();
  const uint64_t s = g.seed();
  install(std::move(g));
  restart(s, at::mt19937(s));
  return s;
}
void NeuronGeneratorImpl::set_offset(uint64_t offset) { position_at(offset); }
uint64_t NeuronGeneratorImpl::get_offset() const {
  // Python's Generator.get_offset() calls this without the generator's lock (set_offset holds it).
  std::unique_lock<std::mutex> lk(const_cast<std::mutex&>(mutex_));
  drain();
  return current_offset();
}

void NeuronGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  TORCH_CHECK(new_state.dtype() == caffe2::TypeMeta::Make<uint8_t>() && new_state.is_contiguous(),
              "a neuron generator's state is a contiguous uint8 tensor, got ", new_state.dtype());
  if (new_state.numel() == 16) {  // (seed, offset), from get_state
    uint64_t seed_offset[2];
    std::memcpy(seed_offset, new_state.data(), sizeof(seed_offset));
    if (seed_offset[0] != seed_) restart(seed_offset[0], at::mt19937(seed_offset[0]));
    position_at(seed_offset[1]);
    return;
  }
  // A CPU generator's state (torch.get_rng_state()): the stream continues from it, offset 0.
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>();
  g.unsafeGetGeneratorImpl()->set_state(new_state);
  const at::mt19937 engine = g.get<at::CPUGeneratorImpl>()->engine();
  install(std::move(g));
  restart(engine.seed(), engine);
}

c10::intrusive_ptr<c10::TensorImpl> NeuronGeneratorImpl::get_state() const {
  drain();
  const uint64_t offset = current_offset();
  {
    at::Generator g = cpu_generator();
    std::lock_guard<std::mutex> lk(g.mutex());
    if (exact_.empty() || exact_.back().first != offset) {
      exact_.emplace_back(offset, at::Tensor(g.unsafeGetGeneratorImpl()->get_state()));
      if (exact_.size() > kExactStates) exact_.pop_front();
    } else {
      exact_.back().second = at::Tensor(g.unsafeGetGeneratorImpl()->get_state());
    }
  }
  at::Tensor state = at::detail::empty_cpu({16}, at::ScalarType::Byte, std::nullopt, std::nullopt, std::nullopt,
                                           std::nullopt);
  const uint64_t seed_offset[2] = {seed_, offset};
  std::memcpy(state.data_ptr(), seed_offset, sizeof(seed_offset));
  return state.getIntrusivePtr();
}

NeuronGeneratorImpl* NeuronGeneratorImpl::clone_impl() const {
  drain();
  auto* copy = new NeuronGeneratorImpl(device().index());
  at::Generator g = cpu_generator();
  std::lock_guard<std::mutex> lk(g.mutex());
  copy->cpu_ = g.clone();
  copy->seed_ = seed_;
  copy->origin_ = origin_;
  copy->anchor_ = anchor_;
  copy->anchor_offset_ = anchor_offset_;
  copy->exact_ = exact_;
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
