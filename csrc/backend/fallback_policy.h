#pragma once
// What the eager fallback knows about particular operators beyond their
// schemas, in one table: each entry names an operator (all overloads of
// "aten::name", or one "aten::name.overload") and says why it is there.
// Nothing else in the fallback compares operator names.
#include <c10/util/ArrayRef.h>

#include "backend/device_kernels.h"

#include <cstdint>
#include <string>

namespace neuronx {

enum PolicyFlag : uint32_t {
  kHostIndices = 1u << 0,       // CUDA accepts index tensors on the host here
  kIndexGet = 1u << 1,          // advanced indexing, reading: host checks first
  kIndexPut = 1u << 2,          // advanced indexing, writing: host checks first
  kFill = 1u << 3,              // writes a value the host knows (seen_values.h)
  kFloatValuesShape = 1u << 4,  // float scalar values decide output shapes
  kSyncOnly = 1u << 5,          // meta kernel disagrees with CPU for some inputs
  kEvalStatsEmpty = 1u << 6,    // batch norm in eval: CPU returns empty saved stats
  kRouteDirect = 1u << 7,       // composite kernel calls CPU stubs on its arguments
  kProbeScalars = 1u << 8,      // CPU checks scalar values the meta kernel does not
  kMaskToSelf = 1u << 9,        // in place: the mask (operand 1) must broadcast to self
  kHostCopy = 1u << 10,         // quantized tensors: copy_'s backend half runs as a host copy
  kHostCopyResize = 1u << 11,   // ... and resizes the destination first
  kDeviceKernel = 1u << 12,     // a device kernel runs in place of CPU's (the entry's `kernel`)
};

struct FallbackPolicy {
  const char* op;  // "aten::index" (every overload) or "aten::mode.values"
  uint32_t flags;
  const char* why;
  DeviceKernel kernel = nullptr;  // (an overload's entry) runs in place of its CPU kernel
};

// Every entry (for registration and for the test that each names an op).
c10::ArrayRef<FallbackPolicy> fallback_policies();

// The flags for an operator: its overload's entry and its name's entry.
uint32_t policy_flags(const std::string& name, const std::string& overload);

// The device kernel of an operator overload (its own entry's), or nullptr.
DeviceKernel device_kernel(const std::string& name, const std::string& overload);

// Names of the flags set in `flags` ("host_indices", ...), for Python.
std::string policy_flag_names(uint32_t flags);

}  // namespace neuronx
