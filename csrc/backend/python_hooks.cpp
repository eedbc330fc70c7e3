#include "backend/python_hooks.h"

#include <atomic>

namespace neuronx {

namespace {
std::atomic<VoidFn> g_clear_python_error{nullptr};
}  // namespace

void set_clear_python_error(VoidFn fn) { g_clear_python_error.store(fn); }

void clear_python_error() {
  if (VoidFn fn = g_clear_python_error.load()) fn();
}

}  // namespace neuronx
