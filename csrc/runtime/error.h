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
  Error(ErrorCode code, const std::string& what)
      : std::runtime_error(what), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

// A task failure recorded on a queue; kept until a synchronization reports it.
struct TaskError {
  std::string op;       // op name of the failing task ("aten::index_select")
  std::string message;  // what the kernel said
  std::string origin;   // where the host enqueued it, if known ("train.py:42")
  std::string describe() const;
};

}  // namespace neuronx::rt
