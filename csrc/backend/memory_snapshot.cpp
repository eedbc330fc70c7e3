// Memory history and snapshots in PyTorch's format (what
// torch.cuda.memory._snapshot() returns), so PyTorch's memory visualizer
// reads ours. Stacks are captured with torch's CapturedTraceback (Python,
// TorchScript and optionally C++ frames) and symbolized in one batch.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <torch/csrc/profiler/combined_traceback.h>

#include <unordered_map>

#include "backend/bindings.h"
#include "backend/common.h"

namespace py = pybind11;

namespace neuronx {

namespace {

struct TracebackContext final : rt::AllocContext {
  explicit TracebackContext(std::shared_ptr<torch::CapturedTraceback> t) : tb(std::move(t)) {}
  std::shared_ptr<torch::CapturedTraceback> tb;
};

std::atomic<bool> g_cpp_frames{false};

std::shared_ptr<rt::AllocContext> capture_python() {
  return std::make_shared<TracebackContext>(
      torch::CapturedTraceback::gather(/*python=*/true, /*script=*/true, g_cpp_frames.load()));
}

rt::HistoryOptions::Context parse_context(const std::optional<std::string>& c) {
  using C = rt::HistoryOptions::Context;
  if (!c) return C::kNone;
  if (*c == "state") return C::kState;
  if (*c == "alloc") return C::kAlloc;
  if (*c == "all") return C::kAll;
  TORCH_CHECK_VALUE(false, "_record_memory_history: context must be None, 'state', 'alloc' or 'all', got '", *c, "'");
}

void record_memory_history(const std::optional<std::string>& enabled, const std::optional<std::string>& context,
                           const std::string& stacks, size_t max_entries, bool clear_history, int device) {
  TORCH_CHECK_VALUE(!enabled || *enabled == "state" || *enabled == "all",
                    "_record_memory_history: enabled must be None, 'state' or 'all', got '", *enabled, "'");
  TORCH_CHECK_VALUE(stacks == "python" || stacks == "all",
                    "_record_memory_history: stacks must be 'python' or 'all', got '", stacks, "'");
  rt::HistoryOptions o;
  o.enabled = enabled.has_value();
  o.trace = enabled && *enabled == "all";
  o.context = parse_context(context);
  o.max_entries = max_entries;
  o.clear = clear_history;
  o.capture = &capture_python;
  g_cpp_frames = stacks == "all";
  runtime_device(device).allocator().record_history(o);
}

// Symbolizes every context of one snapshot in one call (frames are shared).
class Symbolizer {
 public:
  void add(const std::shared_ptr<rt::AllocContext>& c) {
    auto* t = tb(c);
    if (t && index_.emplace(t, order_.size()).second) order_.push_back(t);
  }
  // Frame dicts are built once and shared between the tracebacks using them.
  void run() {
    const torch::SymbolizedTracebacks st = torch::symbolize(order_);
    std::vector<py::dict> all;
    all.reserve(st.all_frames.size());
    for (const auto& f : st.all_frames) {
      py::dict d;
      d["filename"] = f.filename;
      d["line"] = f.lineno;
      d["name"] = f.funcname;
      all.push_back(std::move(d));
    }
    for (const auto& idx : st.tracebacks) {
      py::list frames;
      for (uint64_t i : idx) frames.append(all.at(i));
      frames_.push_back(std::move(frames));
    }
  }
  py::list frames(const std::shared_ptr<rt::AllocContext>& c) const {
    auto* t = tb(c);
    if (!t) return py::list();
    return frames_.at(index_.at(t));
  }

 private:
  static torch::CapturedTraceback* tb(const std::shared_ptr<rt::AllocContext>& c) {
    return c ? static_cast<const TracebackContext&>(*c).tb.get() : nullptr;
  }
  std::vector<torch::CapturedTraceback*> order_;
  std::unordered_map<torch::CapturedTraceback*, size_t> index_;
  std::vector<py::list> frames_;
};

const char* action_name(rt::TraceEntry::Action a) {
  using A = rt::TraceEntry::Action;
  switch (a) {
    case A::kAlloc: return "alloc";
    case A::kFreeRequested: return "free_requested";
    case A::kFreeCompleted: return "free_completed";
    case A::kSegmentAlloc: return "segment_alloc";
    case A::kSegmentFree: return "segment_free";
    case A::kOom: return "oom";
    case A::kSnapshot: return "snapshot";
  }
  return "unknown";
}

// {'segments': [...], 'device_traces': [[...]]} for one device, in the layout
// of c10's CUDA allocator snapshot. Frees are stream-ordered (runtime/caching_allocator.h),
// so the snapshot shows the program's state at this call without waiting for the device.
py::dict snapshot(int device) {
  rt::Device& dev = runtime_device(device);
  rt::CachingAllocator& a = dev.allocator();
  const std::vector<rt::SegmentInfo> segs = a.snapshot();
  const std::vector<rt::TraceEntry> trace = a.trace();
  Symbolizer sym;
  for (const auto& s : segs) {
    sym.add(s.context);
    for (const auto& b : s.blocks) sym.add(b.context);
  }
  for (const auto& e : trace) sym.add(e.context);
  sym.run();

  const py::tuple pool = py::make_tuple(0, 0);
  py::list segments;
  for (const auto& s : segs) {
    py::dict d;
    d["device"] = device;
    d["address"] = s.address;
    d["total_size"] = s.total_size;
    d["allocated_size"] = s.allocated_size;
    d["active_size"] = s.allocated_size;
    d["requested_size"] = s.requested_size;
    d["stream"] = s.stream;
    d["segment_type"] = s.is_large ? "large" : "small";
    d["segment_pool_id"] = pool;
    d["is_expandable"] = false;
    d["frames"] = sym.frames(s.context);
    py::list blocks;
    size_t addr = s.address;
    for (const auto& b : s.blocks) {
      py::dict bd;
      bd["address"] = addr;
      bd["size"] = b.size;
      bd["requested_size"] = b.requested_size;
      bd["state"] = b.pending_free ? "active_pending_free" : b.allocated ? "active_allocated" : "inactive";
      bd["frames"] = sym.frames(b.context);
      blocks.append(bd);
      addr += b.size;
    }
    d["blocks"] = blocks;
    segments.append(d);
  }
  py::list entries;
  for (const auto& e : trace) {
    py::dict d;
    d["action"] = action_name(e.action);
    d["addr"] = e.addr;
    d["size"] = e.size;
    d["stream"] = 0;
    d["time_us"] = e.time_us;
    d["frames"] = sym.frames(e.context);
    if (e.action == rt::TraceEntry::Action::kOom) d["device_free"] = e.device_free;
    entries.append(d);
  }
  py::dict out;
  out["segments"] = segments;
  out["device_traces"] = entries;
  return out;
}

}  // namespace

void bind_memory_snapshot(py::module& m) {
  m.def("_record_memory_history", &record_memory_history, py::arg("enabled"), py::arg("context"),
        py::arg("stacks"), py::arg("max_entries"), py::arg("clear_history"), py::arg("device"));
  m.def("_memory_snapshot", [](int d) { return snapshot(d); });
}

}  // namespace neuronx
