#pragma once
// Scalar programs: small straight-line functions of 0-d values (FlexAttention's score_mod,
// mask_mod and the score_mod's gradient), compiled into generated kernels as inline C++
// functions evaluated once per attention score. Inputs are 0-d values or captured buffers
// (tensors read at index operands); every node is an op of the op table with a ProgramForm.
// Floating values are computed in float (bfloat16 and float16 ones too, unrounded: FlexAttention's
// working precision), integers in int64.
#include <c10/core/ScalarType.h>

#include <string>
#include <vector>

#include "compiler/graph.h"

namespace neuronx::compiler {

struct ScalarProgram {
  struct Input {
    c10::ScalarType dtype;
    int rank;  // a captured buffer's rank; the function's own parameters are 0-d (rank 0, not buffers)
  };
  struct Step {
    OpId id;
    std::string target;
    c10::ScalarType dtype;  // of its result
    std::vector<Arg> args;  // schema order, defaults filled in; kValue: a program value
  };
  std::vector<Input> inputs;  // program values 0..n-1; step k defines value n + k
  std::vector<Step> steps;
  std::vector<int> outputs;   // value ids; -1 for None
};

// Parses one program of the text form torch_neuronx/compile/export.py writes (one line per
// input, step and output); advances `pos` past it. Raises (c10::Error) naming what it could not
// take: an op without a program form, a malformed line.
ScalarProgram parse_program(const std::vector<std::string>& lines, size_t& pos);

// The C++ type a program value of this dtype is computed in.
const char* program_type(c10::ScalarType t);

// `static inline <ret> <name>(<params>, const NxBuf* bufs)`: the program's first output. The
// first params.size() inputs are the parameters (C++ declarations, e.g. "float score"); the
// rest are buffers bufs[0..] read through NxBuf accessors (flex_attention_source.cpp).
std::string emit_program(const ScalarProgram& p, const std::string& name, const std::string& ret,
                         const std::vector<std::string>& params);

}  // namespace neuronx::compiler
