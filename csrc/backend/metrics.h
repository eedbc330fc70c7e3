#pragma once
// Counters behind torch_neuronx.metrics(): per-op dispatches by execution
// path, and the host synchronization points the eager path had to make.
#include <atomic>
#include <cstdint>
#include <map>
#include <string>

namespace neuronx {

struct OpCounters {
  std::atomic<uint64_t> async{0};  // enqueued on a stream, returned at once
  std::atomic<uint64_t> sync{0};   // ran after draining the stream (no meta / data-dependent shape)
  std::atomic<uint64_t> view{0};   // metadata only, no kernel
  std::atomic<uint64_t> native{0}; // a backend kernel of its own (copy, empty, item, ...)
  std::atomic<uint64_t> device_kernel{0};  // ran a device kernel in place of CPU's (random_kernels.h)
};

// Stable per-name counters (never freed).
OpCounters& op_counters(const std::string& name);

enum class SyncReason { kCopyToHost, kItem, kDataDependent, kBlockingCopy, kNumReasons };
void count_sync(SyncReason r);

// CPU aliases of device buffers made for kernels that ran on an engine thread: new, or reused
// from a finished kernel (tensor_views.cpp).
void count_alias(bool reused);

struct MetricsSnapshot {
  std::map<std::string, std::map<std::string, uint64_t>> ops;
  std::map<std::string, uint64_t> syncs;
  std::map<std::string, uint64_t> aliases;  // "made", "reused"
};
MetricsSnapshot metrics_snapshot();
void reset_metrics();

}  // namespace neuronx
