// torch.profiler support: a Kineto PrivateUse1 activity profiler, so device
// kernels, copies and their queues appear in torch.profiler traces, linked to
// the CPU ops that launched them; and the legacy ProfilerStubs behind
// torch.autograd.profiler.profile(use_device="neuron").
//
// The runtime reports every executed kernel to a task observer (installed
// only while a session records) with its queue and steady-clock times; the
// launching host op is identified by the correlation id Kineto pushes on the
// op's thread, captured at launch by the runtime's launch-tag hook.
#include <IActivityProfiler.h>
#include <libkineto.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include "backend/common.h"
#include "runtime/event.h"

namespace neuronx {

namespace {

using libkineto::ActivityType;

struct KernelRecord {
  std::string name;
  int device;
  uint64_t queue;
  int64_t enqueue_ns, start_ns, end_ns;
  uint64_t correlation;
  bool failed, skipped;
};

std::mutex g_records_mu;
std::vector<KernelRecord> g_records;  // guarded by g_records_mu

// Kineto pushes the running op's correlation id on the op's thread. The epoch
// drops entries left by an op that straddled the end of a previous session
// (its pop arrives after that session is gone).
std::atomic<uint64_t> g_epoch{0};
thread_local std::vector<uint64_t> t_correlation;
thread_local uint64_t t_epoch = 0;

void sync_epoch() {
  const uint64_t e = g_epoch.load(std::memory_order_relaxed);
  if (t_epoch != e) {
    t_correlation.clear();
    t_epoch = e;
  }
}

uint64_t launch_tag() {
  sync_epoch();
  return t_correlation.empty() ? 0 : t_correlation.back();
}

void observe(const rt::TaskRecord& r) {
  KernelRecord k{r.name, r.device, r.queue_id, r.enqueue_ns, r.start_ns, r.end_ns, r.correlation, r.failed, r.skipped};
  std::lock_guard<std::mutex> g(g_records_mu);
  g_records.push_back(std::move(k));
}

int64_t system_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Waits for queued work on every device (without raising its errors: those
// belong to the user's next synchronize), so kernels launched inside the
// profiled region are recorded before the session stops.
void drain_devices() {
  if (!rt::is_initialized() || rt::in_bad_fork()) return;
  for (int d = 0; d < rt::device_count(); ++d)
    for (rt::Queue* q : rt::device(d).live_queues()) q->wait_idle();
}

bool is_copy(const std::string& name) { return name.rfind("neuron::copy_", 0) == 0; }

class NeuronProfilerSession final : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    {
      std::lock_guard<std::mutex> g(g_records_mu);
      g_records.clear();
    }
    g_epoch.fetch_add(1);
    rt::set_task_observer(&observe, &launch_tag);
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    drain_devices();
    rt::set_task_observer(nullptr);
    // The runtime stamps with the steady clock; Kineto wants Unix-epoch ns.
    clock_offset_ = system_ns() - rt::now_ns();
    {
      std::lock_guard<std::mutex> g(g_records_mu);
      records_.swap(g_records);
      g_records.clear();
    }
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override { return {}; }

  void processTrace(libkineto::ActivityLogger& logger) override { processTrace(logger, nullptr, 0, 0); }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback cpu_op,
                    int64_t window_start, int64_t window_end) override {
    buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
    buffer_->span = libkineto::TraceSpan(window_start, window_end, "neuron");
    buffer_->gpuOpCount = 0;
    static std::atomic<uint32_t> next_flow{1};  // flow ids must be unique within a trace
    for (const KernelRecord& r : records_) {
      // modeled engine steps sit on their own tracks, without launch arrows of their own
      const bool modeled = r.queue >= rt::kModeledTrackBase;
      const libkineto::ITraceActivity* op =
          !modeled && cpu_op && r.correlation ? cpu_op(static_cast<int32_t>(r.correlation)) : nullptr;
      const uint32_t flow = op ? next_flow.fetch_add(1) : 0;
      if (op) {
        // The launch on the host thread, like cudaLaunchKernel: the start of
        // the arrow to the kernel in the trace viewer.
        buffer_->emplace_activity(buffer_->span, ActivityType::PRIVATEUSE1_RUNTIME,
                                  is_copy(r.name) ? "neuronMemcpyAsync" : "neuronLaunchKernel");
        auto& l = *buffer_->activities.back();
        l.startTime = r.enqueue_ns + clock_offset_;
        l.endTime = l.startTime + 1;
        l.id = static_cast<int32_t>(r.correlation);
        l.device = libkineto::processId();
        l.resource = op->resourceId();
        l.threadId = op->getThreadId();
        l.linked = op;
        l.flow.id = flow;
        l.flow.type = libkineto::kLinkAsyncCpuGpu;
        l.flow.start = 1;
        l.log(logger);
      }
      buffer_->emplace_activity(buffer_->span, is_copy(r.name) ? ActivityType::GPU_MEMCPY : ActivityType::CONCURRENT_KERNEL,
                                r.name);
      auto& k = *buffer_->activities.back();
      k.startTime = r.start_ns + clock_offset_;
      k.endTime = std::max(r.end_ns, r.start_ns) + clock_offset_;
      k.id = static_cast<int32_t>(r.correlation);
      k.device = r.device;  // the trace's "process": one per device
      k.resource = static_cast<int32_t>(r.queue);  // its "thread": one track per queue (stream)
      k.threadId = static_cast<int32_t>(r.queue);
      k.linked = op;
      if (op) {
        k.flow.id = flow;
        k.flow.type = libkineto::kLinkAsyncCpuGpu;
        k.flow.start = 0;
      }
      if (modeled) k.addMetadataQuoted("timing", "modeled by the NKI cost model");
      else k.addMetadata("stream", std::to_string(r.queue));
      k.addMetadata("device", std::to_string(r.device));
      k.addMetadata("queued_us", std::to_string((r.start_ns - r.enqueue_ns) / 1000));
      if (r.failed) k.addMetadataQuoted("status", "failed");
      if (r.skipped) k.addMetadataQuoted("status", "skipped after an earlier failure");
      k.log(logger);
      buffer_->gpuOpCount++;
      queues_.emplace(r.device, r.queue);
    }
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    const int d = queues_.empty() ? 0 : queues_.begin()->first;
    return std::make_unique<libkineto::DeviceInfo>(
        libkineto::DeviceInfo{d, 1000 + d, "neuron:" + std::to_string(d), "NeuronCore " + std::to_string(d)});
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> out;
    for (const auto& [dev, q] : queues_) {
      std::string name = q == 0 ? "stream 0 (default)" : "stream " + std::to_string(q);
      if (q >= rt::kModeledTrackBase) name = rt::track_name(q);
      out.push_back(libkineto::ResourceInfo{static_cast<int64_t>(q), static_cast<int64_t>(q), dev, name});
    }
    return out;
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return std::move(buffer_); }

  void pushCorrelationId(uint64_t id) override {
    sync_epoch();
    t_correlation.push_back(id);
  }
  void popCorrelationId() override {
    sync_epoch();
    if (!t_correlation.empty()) t_correlation.pop_back();
  }

 private:
  std::vector<KernelRecord> records_;
  std::set<std::pair<int, uint64_t>> queues_;
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
  int64_t clock_offset_ = 0;
};

class NeuronActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<ActivityType>& availableActivities() const override { return activities_; }
  // Kineto configures every registered child for every trace; only traces
  // that ask for device activity (ProfilerActivity.PrivateUse1) get a session.
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<ActivityType>& types,
                                                                 const libkineto::Config&) override {
    if (!types.count(ActivityType::CONCURRENT_KERNEL)) return nullptr;
    return std::make_unique<NeuronProfilerSession>();
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t, int64_t, const std::set<ActivityType>& types,
                                                                 const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_{"neuron"};
  std::set<ActivityType> activities_{ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY,
                                     ActivityType::PRIVATEUSE1_RUNTIME};
};

// Legacy profiler (use_device="neuron", use_kineto=False): a timing event
// recorded on the current queue at each op's start and end; the op's device
// time is the time between them, as with CUDA events.
struct Marker {
  std::shared_ptr<rt::Event> event;
};

class NeuronProfilerStubs final : public torch::profiler::impl::ProfilerStubs {
 public:
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    const c10::DeviceIndex d = current_device();
    if (device) *device = d;
    auto m = std::make_shared<Marker>();
    m->event = rt::Event::create(/*timing=*/true);
    translate([&] { m->event->record(current_queue(d)); });
    if (cpu_ns) *cpu_ns = system_ns();
    *event = std::static_pointer_cast<void>(m);
  }
  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* a,
                const torch::profiler::impl::ProfilerVoidEventStub* b) const override {
    auto* ma = static_cast<const Marker*>(a->get());
    auto* mb = static_cast<const Marker*>(b->get());
    return translate([&] {
      mb->event->synchronize();
      return static_cast<float>(rt::Event::elapsed_ms(*ma->event, *mb->event) * 1000.0);  // microseconds
    });
  }
  void mark(const char*) const override {}
  void rangePush(const char*) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }
  void onEachDevice(std::function<void(int)> op) const override {
    for (int d = 0; d < rt::device_count(); ++d) op(d);
  }
  void synchronize() const override { translate([] { rt::synchronize_all(); }); }
};

NeuronProfilerStubs g_stubs;

struct RegisterStubs {
  RegisterStubs() { torch::profiler::impl::registerPrivateUse1Methods(&g_stubs); }
} g_register_stubs;

}  // namespace

}  // namespace neuronx

namespace torch::profiler::impl {
using NeuronActivityProfiler = ::neuronx::NeuronActivityProfiler;
REGISTER_PRIVATEUSE1_PROFILER(NeuronActivityProfiler);
}  // namespace torch::profiler::impl
