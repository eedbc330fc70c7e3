#pragma once
// Errors raised by the runtime. Torch-free: the backend layer maps them onto
// the PyTorch exception types (OutOfMemoryError, RuntimeError, ...).
#include <stdexcept>
#include <string>

namespace neuronx::rt {

enum class ErrorCode {
  kInvalidArgument,  // bad env value, bad device index, bad handle
  kOutOfMemory,      // device capacity exceeded
  kKernelFailed,     // a queued task threw; surfaced at a synchronization
  kBadFork,          // runtime used in a forked child after init
  kInternal,
};

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& what, int category = 0)
      : std::runtime_error(what), code_(code), category_(category) {}
  ErrorCode code() const noexcept { return code_; }
  // kKernelFailed: the failing kernel's KernelError category (0 if none).
  int category() const noexcept { return category_; }

 private:
  ErrorCode code_;
  int category_;
};

// Thrown by a kernel to say what kind of error it hit; the category (chosen
// by the layer above, e.g. index / value / type errors) travels with the
// queue's recorded failure to the synchronization that reports it.
struct KernelError : std::runtime_error {
  KernelError(const std::string& what, int category) : std::runtime_error(what), category(category) {}
  int category;
};

// A task failure recorded on a queue; kept until a synchronization reports it.
struct TaskError {
  std::string op;       // op name of the failing task ("aten::index_select")
  std::string message;  // what the kernel said
  uint64_t origin = 0;  // where the host enqueued it (Kernel::origin), 0 if unknown
  int category = 0;     // KernelError category of the failure
  std::string describe() const;
};

}  // namespace neuronx::rt
