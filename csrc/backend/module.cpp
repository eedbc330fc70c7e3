// torch_neuronx._C: the Python-facing entry points of the backend. Only
// control-plane calls live here (device management, memory statistics,
// metrics); the per-op path never enters Python.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <thread>

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <torch/csrc/Event.h>
#include <torch/csrc/Generator.h>

#include "backend/kernel_scratch.h"
#include "backend/generator.h"

#include "backend/bindings.h"
#include "backend/common.h"
#include "backend/fallback_policy.h"
#include "backend/fast_ops.h"
#include "backend/metrics.h"
#include "backend/op_origin.h"
#include "backend/python_hooks.h"
#include "backend/registration.h"
#include "runtime/host_allocator.h"

namespace py = pybind11;

namespace neuronx {

namespace {

py::dict stat_dict(const rt::Stat& s) {
  py::dict d;
  d["current"] = s.current;
  d["peak"] = s.peak;
  d["allocated"] = s.allocated;
  d["freed"] = s.freed;
  return d;
}

py::dict stat_array(const rt::StatArray& a) {
  py::dict d;
  d["all"] = stat_dict(a[rt::kAggregate]);
  d["small_pool"] = stat_dict(a[rt::kSmallPool]);
  d["large_pool"] = stat_dict(a[rt::kLargePool]);
  return d;
}

py::dict memory_stats(int device) {
  const rt::AllocatorStats s = runtime_device(device).allocator().stats();
  py::dict d;
#define NEURONX_EXPORT(f) d[#f] = stat_array(s.f);
  NEURONX_ALLOCATOR_STAT_ARRAYS(NEURONX_EXPORT)
#undef NEURONX_EXPORT
#define NEURONX_EXPORT(f) d[#f] = stat_dict(s.f);
  NEURONX_ALLOCATOR_STATS(NEURONX_EXPORT)
#undef NEURONX_EXPORT
#define NEURONX_EXPORT(f) d[#f] = s.f;
  NEURONX_ALLOCATOR_COUNTERS(NEURONX_EXPORT)
#undef NEURONX_EXPORT
  d["max_split_size"] = s.max_split_size;
  return d;
}

}  // namespace

}  // namespace neuronx

PYBIND11_MODULE(_C, m) {
  using namespace neuronx;
  m.doc() = "torch-neuronx backend (simulated NeuronCore runtime)";
  register_hooks();
  register_direct_fallbacks();
  register_sparse_kernels();
  register_quantized_kernels();
  install_kernel_scratch_allocator();
  init_autocast_dtype();
  set_clear_python_error([] {
    py::gil_scoped_acquire gil;
    PyErr_Clear();
  });
  // Waiting on the device with the GIL held could deadlock: a kernel that
  // finishes may release the last reference to a storage with a Python object.
  rt::set_blocking_hooks(rt::BlockingHooks{
      [] () -> void* { return Py_IsInitialized() && PyGILState_Check() ? PyEval_SaveThread() : nullptr; },
      [](void* token) {
        if (token) PyEval_RestoreThread(static_cast<PyThreadState*>(token));
      }});

  install_op_origins();

  m.def("_device_count", [] { return rt::device_count(); });
  m.def("_is_initialized", [] { return rt::is_initialized(); });
  m.def("_in_bad_fork", [] { return rt::in_bad_fork(); });
  m.def("_init", [] { at::detail::getPrivateUse1Hooks().init(); });
  m.def("_current_device", [] { return static_cast<int>(current_device()); });
  m.def("_set_device", [](int d) { set_current_device(static_cast<c10::DeviceIndex>(d)); });
  // Interruptible from the main thread: Ctrl-C raises KeyboardInterrupt within a slice while the
  // queued work goes on (CUDA's blocking synchronize is not; a user waiting on a long queue can
  // leave). The exit path waits without slices.
  m.def("_synchronize", [](int d, bool interruptible) {
    rt::Device& dev = runtime_device(d);
    while (interruptible) {
      bool idle;
      {
        py::gil_scoped_release nogil;
        idle = dev.wait_idle_for(50'000'000);
      }
      if (idle) break;
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
    py::gil_scoped_release nogil;
    translate([&] { dev.synchronize(); });
  }, py::arg("device"), py::arg("interruptible") = true);
  m.def("_discard_pending", [](int d) { runtime_device(d).discard_pending(); });
  m.def("_device_properties", [](int d) {
    rt::Device& dev = runtime_device(d);
    py::dict p;
    p["name"] = "NeuronCore-v2 (simulated)";
    p["index"] = d;
    p["physical_core"] = dev.physical_core();
    p["total_memory"] = dev.allocator().capacity();
    return p;
  });
  m.def("_default_generator", [](int d) {
    const at::Generator& g = default_generator(static_cast<c10::DeviceIndex>(d));
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(g));
  });
  m.def("_event_elapsed_time", [](py::handle start, py::handle end) {
    for (py::handle h : {start, end})
      TORCH_CHECK(PyObject_TypeCheck(h.ptr(), &THPEventType), "elapsed_time expects torch.Event objects");
    const c10::Event& a = reinterpret_cast<THPEvent*>(start.ptr())->event;
    const c10::Event& b = reinterpret_cast<THPEvent*>(end.ptr())->event;
    py::gil_scoped_release nogil;
    return a.elapsedTime(b);
  });
  m.def("_sleep", [](double ms) {
    const auto d = current_device();
    translate([&] {
      current_queue(d).launch(std::make_unique<rt::FunctionKernel>(
          "neuron::sleep", [ms] { std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms)); },
          /*touches_memory=*/false));
    });
  });
  m.def("_stream_priority", [](int64_t stream_id) { return rt::Device::priority_of(static_cast<uint64_t>(stream_id)); });
  m.def("_sim_cores", [] { return rt::config().sim_cores; });
  m.def("_sim_hbm_bytes", [] { return rt::config().hbm_bytes; });

  m.def("_memory_stats", [](int d) { return memory_stats(d); });
  bind_memory_snapshot(m);
  distributed::bind(m);
  compiler::bind(m);
  nki::bind(m);
  // Same code paths as torch.accelerator.empty_cache / mem_get_info.
  m.def("_empty_cache", [] { c10::getDeviceAllocator(kNeuron)->emptyCache(); });
  m.def("_reset_peak_memory_stats", [](int d) { runtime_device(d).allocator().reset_peak_stats(); });
  m.def("_reset_accumulated_memory_stats", [](int d) { runtime_device(d).allocator().reset_accumulated_stats(); });
  m.def("_mem_get_info",
        [](int d) { return c10::getDeviceAllocator(kNeuron)->getMemoryInfo(static_cast<c10::DeviceIndex>(d)); });
  m.def("_set_memory_fraction", [](double fraction, int d) {
    TORCH_CHECK(fraction > 0 && fraction <= 1, "memory fraction must be in (0, 1], got ", fraction);
    auto& a = runtime_device(d).allocator();
    a.set_limit(static_cast<size_t>(fraction * static_cast<double>(a.capacity())));
  });
  m.def("_host_memory_stats", [] {
    const auto s = rt::HostAllocator::instance().stats();
    py::dict d;
#define NEURONX_EXPORT(f) d[#f] = s.f;
    NEURONX_HOST_ALLOCATOR_STATS(NEURONX_EXPORT)
#undef NEURONX_EXPORT
    return d;
  });

  m.def("_metrics", [] {
    const MetricsSnapshot s = metrics_snapshot();
    py::dict d;
    d["ops"] = s.ops;
    d["syncs"] = s.syncs;
    d["aliases"] = s.aliases;
    const KernelScratchStats k = kernel_scratch_stats();
    py::dict ks;
    ks["idle_bytes"] = k.idle_bytes;
    ks["idle_blocks"] = k.idle_blocks;
    ks["fresh"] = k.fresh;
    ks["reused"] = k.reused;
    ks["evicted_bytes"] = k.evicted_bytes;
    ks["placed"] = k.placed;
    d["kernel_scratch"] = ks;
    return d;
  });
  m.def("_reset_metrics", &reset_metrics);
  m.def("_fallback_policies", [] {
    std::vector<std::tuple<std::string, std::string, std::string>> out;
    for (const FallbackPolicy& p : fallback_policies()) out.emplace_back(p.op, policy_flag_names(p.flags), p.why);
    return out;
  });
  m.def("_fast_ops", [] {  // {op: calls through its unboxed entry point}
    std::map<std::string, uint64_t> out;
    for (const FastOp& f : fast_ops())
      out[std::string(f.name) + (*f.overload_name ? std::string(".") + f.overload_name : "")] =
          f.calls->load(std::memory_order_relaxed);
    return out;
  });
  m.def("_pending_tasks", [](int d) {
    std::vector<std::pair<uint64_t, std::vector<std::string>>> out;
    for (rt::Queue* q : runtime_device(d).live_queues()) {
      std::vector<std::string> names;
      q->inspect([&](const rt::Task& t) {
        if (t.kind == rt::Task::Kind::kKernel) names.emplace_back(t.kernel->name());
        else names.emplace_back(t.kind == rt::Task::Kind::kRecord ? "<event record>" : "<event wait>");
      });
      out.emplace_back(q->id(), std::move(names));
    }
    return out;
  });
}
