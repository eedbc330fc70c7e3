#pragma once
// Numbers in a compiled graph: conversions between IValue numbers and what
// ATen kernels and the scalar ops (op_table.h) take.
#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

namespace neuronx::compiler {

// A number (int, bool, float or one-element tensor) as a double.
double as_double(const c10::IValue& v);
// A Python number passed where a kernel takes a tensor: a wrapped-number 0-d tensor.
c10::IValue wrapped_number(const c10::IValue& v);

}  // namespace neuronx::compiler
