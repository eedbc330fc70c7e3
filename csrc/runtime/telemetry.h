#pragma once
// Per-process device counters published in POSIX shared memory, so that
// neuron-ls / neuron-top (other processes) can see every process using the
// simulated NeuronCores on this machine, as the real tools see the driver.
//
// One segment per process, /dev/shm/torch_neuronx.<pid>, created when the
// process first initializes its devices and unlinked at exit. A process
// killed before exit leaves its segment behind; readers check that the pid
// is alive and remove stale segments.
//
// The layout is fixed (static_asserts below); the Python reader in
// torch_neuronx/tools/telemetry.py mirrors it and checks kMagic/kVersion.
#include <atomic>
#include <cstdint>
#include <string>

namespace neuronx::rt::telemetry {

constexpr uint64_t kMagic = 0x314d4c4554585254ULL;  // "TRXTELM1" little-endian
constexpr uint32_t kVersion = 2;
constexpr int kMaxCores = 64;
constexpr int kCommandBytes = 224;

// Counters of one device (a NeuronCore as this process sees it). Writers use
// relaxed atomic stores/adds; readers may see counters from slightly
// different instants, which a monitoring view tolerates. The host thread and
// the engine threads write every op: each writes its own cache line (one shared
// line moved between the cores on every op). Queued tasks: submitted - started.
struct CoreCounters {
  // Written by host threads.
  alignas(64) std::atomic<int64_t> physical_core;  // -1: slot unused
  std::atomic<uint64_t> capacity;       // bytes of HBM
  std::atomic<uint64_t> reserved;       // bytes held by the caching allocator
  std::atomic<uint64_t> allocated;      // bytes in tensors
  std::atomic<uint64_t> peak_allocated;
  std::atomic<uint64_t> submitted;      // tasks submitted
  // Written by the engine threads (and by the host for kernels it runs inline).
  alignas(64) std::atomic<uint64_t> started;  // tasks taken from the queues
  std::atomic<uint64_t> kernels;        // kernels completed
  std::atomic<uint64_t> busy_ns;        // time the engine spent running tasks
};
static_assert(sizeof(CoreCounters) == 128);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

struct Segment {
  uint64_t magic;
  uint32_t version;
  uint32_t num_cores;
  int64_t pid;
  int64_t start_unix_ns;
  char command[kCommandBytes];
  CoreCounters cores[kMaxCores];
};
static_assert(sizeof(Segment) == 256 + sizeof(CoreCounters) * kMaxCores);

// Creates this process's segment for `num_cores` devices (idempotent).
// Failure (no /dev/shm, TORCH_NEURONX_TELEMETRY=0) disables publishing.
void publish(int num_cores);
// Counters of device `index`, or nullptr when not publishing.
CoreCounters* core(int index);
// "/torch_neuronx.<pid>", the shm_open name.
std::string segment_name(int64_t pid);
// Removes this process's segment now (also done at exit).
void unpublish();

}  // namespace neuronx::rt::telemetry
