#include "nki/launch_op.h"

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <mutex>
#include <unordered_map>

namespace neuronx::nki {

namespace {

std::mutex registry_mu;
std::unordered_map<int64_t, std::shared_ptr<const Program>>& registry() {
  static auto* r = new std::unordered_map<int64_t, std::shared_ptr<const Program>>();  // outlives queued work at exit
  return *r;
}

void launch_cpu(at::TensorList hbm, int64_t program) {
  std::vector<at::Tensor> buffers(hbm.begin(), hbm.end());
  registered_program(program)->run(buffers);
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
