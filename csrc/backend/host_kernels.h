#pragma once
// Tensor kinds the device keeps in its memory but computes on the host
// (sparse, quantized): their ops run as CPU's kernels for that kind.
#include <torch/library.h>

#include <string>

namespace neuronx {

// CompositeExplicitAutograd kernels serve every backend key of a kind by
// default, and they are written for dense tensors (sum() of a sparse tensor
// would return garbage): on every aten op for which CPU has a `host_key`
// kernel and `key` has none, registers `fn` for `key` instead.
template <void (*fn)(const c10::OperatorHandle&, c10::Stack*)>
void register_where_host_has_kernel(c10::DispatchKey host_key, c10::DispatchKey key) {
  auto* lib = new torch::Library(torch::Library::IMPL, "aten", key, __FILE__, __LINE__);  // lives as long as the process
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const auto& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto h = dispatcher.findSchema(name);
    if (!h || h->hasKernelForDispatchKey(key) || !h->hasKernelForDispatchKey(host_key)) continue;
    const std::string full = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
    lib->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<fn>());
  }
}

}  // namespace neuronx
