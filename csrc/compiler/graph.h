#pragma once
// The compiler's graph IR: a straight-line program over values (tensors,
// symbolic scalars, constants) in SSA form, as AOTAutograd hands it over
// (functional core ATen plus in-place copies into inputs).
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "compiler/op_table.h"

namespace neuronx::compiler {

// A size or stride that may depend on runtime symbols. Exported as postfix tokens
// ("s:<sym>", "i:<int>", "f:<float>", "+", "*", "//", "%", "neg", ...), kept for dumps and for
// comparing two expressions; resolved once, when the graph is built, into bytecode whose symbol
// operands are indices into the graph's symbols, so a launch evaluates it without parsing.
// Integer expressions run on int64 (sizes past 2^53 stay exact); one with a float constant or a
// true division runs on double and is rounded.
class SymExpr {
 public:
  SymExpr() = default;
  // Raises for an unknown operator, a malformed program or a symbol not in `symbols`.
  SymExpr(std::vector<std::string> postfix, const std::vector<std::string>& symbols);
  static SymExpr constant(int64_t v);
  const std::vector<std::string>& postfix() const { return postfix_; }
  bool is_constant() const { return constant_; }
  int64_t value() const;  // a constant's value (checked)
  // `ints`/`floats`: each symbol's bound value (floats used only by a fractional expression).
  int64_t eval(const std::vector<int64_t>& ints, const std::vector<double>& floats) const;
  bool operator==(const SymExpr& o) const { return postfix_ == o.postfix_; }
  bool operator!=(const SymExpr& o) const { return !(*this == o); }

 private:
  enum class Op : uint8_t { kSymbol, kInt, kFloat, kAdd, kMul, kFloorDiv, kMod, kDiv, kMax, kMin, kPow, kNeg };
  struct Instr {
    Op op;
    int64_t i = 0;  // kSymbol: symbol index; kInt: the value
    double f = 0;   // kFloat
  };
  template <typename T>
  T run(const std::vector<int64_t>& ints, const std::vector<double>& floats) const;
  std::vector<std::string> postfix_;
  std::vector<Instr> code_;
  bool constant_ = true, fractional_ = false;
  int64_t value_ = 0;  // constants are evaluated once
};

struct TensorMeta {
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<SymExpr> sizes, strides;
  bool is_static() const;
  bool is_static_contiguous() const;  // static, with row-major strides
  bool is_static_channels_last() const;  // static 4-D, dense in (N, H, W, C) order
  bool same_sizes(const TensorMeta& other) const;  // the same size expressions
};

// An operand of a node: a value, a constant, or a list mixing both.
struct Arg {
  enum class Kind : uint8_t { kValue, kConstant, kList } kind = Kind::kConstant;
  int value = -1;                 // kValue
  c10::IValue constant;           // kConstant
  std::vector<Arg> items;         // kList
};

struct Node {
  enum class Kind : uint8_t { kAten, kScalarOp } kind = Kind::kAten;
  std::optional<c10::OperatorHandle> op;  // kAten
  std::string target;                     // "aten::add.Tensor", or a scalar op ("mul", "sym_size")
  OpId id = OpId::kOther;                 // the target in the op table (op_table.h)
  std::vector<Arg> args;                  // schema order, defaults filled in (kAten)
  std::vector<int> outputs;               // value ids this node defines
  int fused_group = -1;                   // set by the fusion pass
  // Whether the op runs its neuron kernel (written against ATen ops) on the CPU views instead of
  // CPU's: the "*_overrideable" ops (SDPA's fused forms, PrivateUse1-only) always, histc when its
  // input is integral (CUDA counts integers, CPU's kernel takes floating point only).
  enum class NeuronKernel : uint8_t { kNever, kAlways, kIntegralInput } neuron_kernel = NeuronKernel::kNever;
};

struct Value {
  enum class Kind : uint8_t { kTensor, kScalar, kOther } kind = Kind::kOther;
  std::optional<TensorMeta> meta;  // tensors
  std::string name;                // FX name, for dumps and errors
};

struct Input {
  int value;
  bool is_tensor;
};

// A symbol's runtime source: a size of a tensor input, or a scalar input.
struct SymbolSource {
  std::string name;
  int input;       // index into Graph::inputs
  int dim = -1;    // -1: the input is the scalar itself
};

// Calls fn with every value id an operand (or a list operand) refers to.
template <typename F>
void for_each_value(const Arg& a, F&& fn) {
  if (a.kind == Arg::Kind::kValue) fn(a.value);
  for (const auto& i : a.items) for_each_value(i, fn);
}

// Calls fn with every value id a node's operands refer to.
template <typename F>
void for_each_value(const Node& n, F&& fn) {
  for (const auto& a : n.args) for_each_value(a, fn);
}
bool writes_operand(const Node& n);  // the op's schema writes one of its operands
bool has_effect(const Node& n);      // writes an operand, or returns nothing (a check that may raise)
bool is_random(const Node& n);       // nondeterministic_seeded: two calls differ
// For a random op whose schema takes no generator (rand_like, randint, ...): its overload that
// does, and where the generator goes. On the device the program draws from the neuron
// generator its launch captured; without a generator argument the CPU kernel would draw from
// CPU's default generator, when the program runs.
std::optional<std::pair<c10::OperatorHandle, size_t>> generator_overload(const c10::OperatorHandle& op);

struct Graph {
  std::vector<Value> values;
  std::vector<Input> inputs;
  std::vector<Node> nodes;
  std::vector<int> outputs;            // value ids; -1 for None outputs
  std::vector<SymbolSource> symbols;
  std::string dump() const;            // a readable listing (debug dumps, hashing)
  std::vector<int> use_counts() const; // per value: operands and graph outputs reading it
};

}  // namespace neuronx::compiler
