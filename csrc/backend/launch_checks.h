#pragma once
// What the eager path checks on the host before it queues a kernel, from
// operand metadata alone (no device data): what CUDA checks on the host, and
// where the CPU kernel's output layout must be asked for rather than predicted.
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <vector>

#include "backend/common.h"

namespace neuronx {

struct OpAnalysis;

// Drops warnings: for kernels run only to check (meta kernels, probes),
// whose warnings the real run gives anyway.
struct DiscardWarnings : c10::WarningHandler {
  void process(const c10::Warning&) override {}
};

// Holds warnings back: replay() hands them to the handler that was current before, or they
// are dropped with the handler (a call whose result is thrown away and run again).
struct HeldWarnings : c10::WarningHandler {
  std::vector<c10::Warning> held;
  void process(const c10::Warning& w) override { held.push_back(w); }
  void replay() const {
    for (const auto& w : held) c10::warn(w);
  }
};

// Same sizes, and the same strides wherever a size is not 1.
bool same_layout(c10::IntArrayRef sizes_a, c10::IntArrayRef strides_a, c10::IntArrayRef sizes_b,
                 c10::IntArrayRef strides_b);

// A channels_last (2-D or 3-D) operand that is not also contiguous.
bool has_channels_last_operand(c10::ArrayRef<c10::IValue> args);

// Advanced indexing (a.indexing != kNone): false if the CPU kernel would
// raise for these shapes, or if a boolean mask makes the result's shape
// depend on data; the caller then takes the synchronous path.
bool indexing_checks_pass(const OpAnalysis& a, c10::ArrayRef<c10::IValue> args);

// Advanced indexing on device d: false if an index tensor holds a value out
// of range for its dimension. Only an index whose seen values (seen_values.h)
// reach outside the range is waited for and read; others pass unread (a bad
// value the host never saw fails in the kernel, reported at a later sync).
bool index_values_in_range(c10::ArrayRef<c10::IValue> args, c10::DeviceIndex d);

// The CPU kernel's checks of scalar arguments that the meta kernel lacks
// (uniform_'s from <= to): the op runs on empty host tensors with the same
// scalars, so a bad argument raises here with CPU's error.
void probe_scalar_checks(const OpAnalysis& a, c10::ArrayRef<c10::IValue> args);

// args[1] (a mask) broadcasts to args[0]'s shape without growing it.
bool mask_broadcasts_to_self(c10::ArrayRef<c10::IValue> args);

}  // namespace neuronx
