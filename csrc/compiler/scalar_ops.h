#pragma once
// Numbers in a compiled graph: the scalar ops Dynamo leaves in graphs over
// symbolic sizes and floats (evaluated by the host at launch), and the
// conversions between IValue numbers and what ATen kernels take.
#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

namespace neuronx::compiler {

// A number (int, bool, float or one-element tensor) as a double.
double as_double(const c10::IValue& v);
// `op` ("add", "floordiv", "sym_max", ...) applied to `args`; ints stay ints.
c10::IValue scalar_op(const std::string& op, const std::vector<c10::IValue>& args);
// A Python number passed where a kernel takes a tensor: a wrapped-number 0-d tensor.
c10::IValue wrapped_number(const c10::IValue& v);

}  // namespace neuronx::compiler
