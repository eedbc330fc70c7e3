#include "nki/launch_op.h"

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <mutex>
#include <unordered_map>

#include "nki/cost_model.h"
#include "nki/target.h"
#include "runtime/event.h"
#include "runtime/queue.h"

namespace neuronx::nki {

namespace {

std::mutex registry_mu;
std::unordered_map<int64_t, std::shared_ptr<const Program>>& registry() {
  static auto* r = new std::unordered_map<int64_t, std::shared_ptr<const Program>>();  // outlives queued work at exit
  return *r;
}

// The cost model's placement of a program's instructions, computed once per program (and target).
const CostReport& modeled(int64_t program, const Program& p) {
  static std::mutex mu;
  static auto* cache = new std::unordered_map<int64_t, std::pair<int, CostReport>>();
  std::lock_guard<std::mutex> g(mu);
  const Target& t = target();
  auto it = cache->find(program);
  if (it == cache->end() || it->second.first != t.nc_version)
    it = cache->insert_or_assign(program, std::make_pair(t.nc_version, model_cost(p, t))).first;
  return it->second.second;
}

// Under torch.profiler: each instruction on a track per engine, at its modeled time from the
// launch's start (the simulated run's own duration is the kernel's record on its stream).
void report_modeled_steps(int64_t program, const Program& p, int64_t start_ns) {
  const CostReport& r = modeled(program, p);
  for (int e = 0; e < kModeledEngines; ++e)
    rt::set_track_name(rt::kModeledTrackBase + e, std::string(engine_name(static_cast<Engine>(e))) +
                                                      (e == static_cast<int>(Engine::kDma) ? " queues" : " engine") +
                                                      " (modeled)");
  for (const ModeledStep& s : r.steps)
    rt::report_track_step(s.name.c_str(), rt::kModeledTrackBase + static_cast<uint64_t>(s.engine),
                          start_ns + static_cast<int64_t>(s.start_ns), start_ns + static_cast<int64_t>(s.end_ns));
}

void launch_cpu(at::TensorList hbm, int64_t program) {
  std::vector<at::Tensor> buffers(hbm.begin(), hbm.end());
  const auto p = registered_program(program);
  const int64_t start = rt::now_ns();
  p->run(buffers);
  if (rt::observing()) report_modeled_steps(program, *p, start);
}

void launch_meta(at::TensorList, int64_t) {}

}  // namespace

int64_t register_program(std::shared_ptr<const Program> p) {
  std::lock_guard<std::mutex> g(registry_mu);
  static int64_t next = 1;
  registry().emplace(next, std::move(p));
  return next++;
}

std::shared_ptr<const Program> registered_program(int64_t id) {
  std::lock_guard<std::mutex> g(registry_mu);
  auto it = registry().find(id);
  TORCH_CHECK(it != registry().end(), "no NKI program ", id, " is registered");
  return it->second;
}

TORCH_LIBRARY(nki, m) { m.def("launch(Tensor(a!)[] hbm, int program) -> ()"); }
TORCH_LIBRARY_IMPL(nki, CPU, m) { m.impl("launch", &launch_cpu); }
TORCH_LIBRARY_IMPL(nki, Meta, m) { m.impl("launch", &launch_meta); }

}  // namespace neuronx::nki
