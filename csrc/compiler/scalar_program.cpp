#include "compiler/scalar_program.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include <iomanip>
#include <map>
#include <sstream>

namespace neuronx::compiler {

namespace {

std::vector<std::string> tokens(const std::string& line) {
  std::istringstream is(line);
  std::vector<std::string> out;
  for (std::string t; is >> t;) out.push_back(t);
  return out;
}

c10::ScalarType parse_dtype(const std::string& s) {
  for (auto t : {c10::kFloat, c10::kDouble, c10::kBFloat16, c10::kHalf, c10::kInt, c10::kLong, c10::kShort,
                 c10::kChar, c10::kByte, c10::kBool})
    if (s == c10::toString(t)) return t;
  TORCH_CHECK(false, "scalar program: unsupported dtype ", s);
}

// One argument from tokens[k...]: "v<id>", "i<int>", "f<float>", "b<0|1>", "n" (None), "o" (a
// constant no lowering reads: a dtype, device or layout), "[" items "]".
Arg parse_arg(const std::vector<std::string>& t, size_t& k) {
  TORCH_CHECK(k < t.size(), "scalar program: missing argument");
  const std::string& s = t[k++];
  Arg a;
  if (s == "[") {
    a.kind = Arg::Kind::kList;
    while (k < t.size() && t[k] != "]") a.items.push_back(parse_arg(t, k));
    TORCH_CHECK(k < t.size(), "scalar program: unterminated list");
    ++k;
    return a;
  }
  switch (s[0]) {
    case 'v': a.kind = Arg::Kind::kValue; a.value = std::stoi(s.substr(1)); break;
    case 'i': a.constant = static_cast<int64_t>(std::stoll(s.substr(1))); break;
    case 'f': a.constant = std::strtod(s.c_str() + 1, nullptr); break;
    case 'b': a.constant = s == "b1"; break;
    case 'n': case 'o': break;
    default: TORCH_CHECK(false, "scalar program: bad argument token ", s);
  }
  return a;
}

std::string literal(const c10::IValue& v) {
  std::ostringstream os;
  os << std::setprecision(17);
  if (v.isDouble()) {
    const double d = v.toDouble();
    if (std::isinf(d)) return d > 0 ? "std::numeric_limits<double>::infinity()" : "-std::numeric_limits<double>::infinity()";
    if (std::isnan(d)) return "std::numeric_limits<double>::quiet_NaN()";
    os << "double(" << d << ")";
  } else if (v.isInt()) {
    os << "int64_t(" << v.toInt() << ")";
  } else if (v.isBool()) {
    os << (v.toBool() ? "true" : "false");
  } else {
    TORCH_CHECK(false, "scalar program: unsupported constant ", v.tagKind());
  }
  return os.str();
}

// How a buffer of this dtype is stored (NxAt's element type).
const char* storage_type(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat: return "float";
    case c10::kDouble: return "double";
    case c10::kBFloat16: return "c10::BFloat16";
    case c10::kHalf: return "c10::Half";
    case c10::kInt: return "int32_t";
    case c10::kLong: return "int64_t";
    case c10::kShort: return "int16_t";
    case c10::kChar: return "int8_t";
    case c10::kByte: return "uint8_t";
    case c10::kBool: return "bool";
    default: TORCH_CHECK(false, "scalar program: unsupported buffer dtype ", t);
  }
}

}  // namespace

const char* program_type(c10::ScalarType t) {
  switch (t) {
    case c10::kDouble: return "double";
    case c10::kFloat: case c10::kBFloat16: case c10::kHalf: return "float";
    case c10::kBool: return "bool";
    default: return "int64_t";
  }
}

ScalarProgram parse_program(const std::vector<std::string>& lines, size_t& pos) {
  TORCH_CHECK(pos < lines.size(), "scalar program: missing");
  const auto head = tokens(lines[pos++]);
  TORCH_CHECK(head.size() == 4 && head[0] == "program", "scalar program: bad header ", lines[pos - 1]);
  const int n_in = std::stoi(head[1]), n_steps = std::stoi(head[2]), n_out = std::stoi(head[3]);
  TORCH_CHECK(pos + n_in + n_steps + n_out <= lines.size(), "scalar program: truncated");
  ScalarProgram p;
  for (int i = 0; i < n_in; ++i) {
    const auto t = tokens(lines[pos++]);
    TORCH_CHECK(t.size() == 3 && t[0] == "in", "scalar program: bad input ", lines[pos - 1]);
    p.inputs.push_back({parse_dtype(t[1]), std::stoi(t[2])});
  }
  auto& dispatcher = c10::Dispatcher::singleton();
  for (int i = 0; i < n_steps; ++i) {
    const auto t = tokens(lines[pos++]);
    TORCH_CHECK(t.size() >= 3 && t[0] == "step", "scalar program: bad step ", lines[pos - 1]);
    ScalarProgram::Step s;
    s.dtype = parse_dtype(t[1]);
    s.target = t[2];
    s.id = op_id(s.target);
    TORCH_CHECK(op_info(s.id).program_form != ProgramForm::kNone, "FlexAttention: the compiler has no lowering of ",
                s.target, " inside a score_mod or mask_mod");
    const auto dot = s.target.find('.', s.target.find("::"));
    auto h = dispatcher.findSchema({s.target.substr(0, dot), dot == std::string::npos ? "" : s.target.substr(dot + 1)});
    TORCH_CHECK(h, "scalar program: unknown operator ", s.target);
    std::vector<Arg> positional;
    std::map<std::string, Arg> named;
    size_t k = 3;
    while (k < t.size() && t[k] != "|") positional.push_back(parse_arg(t, k));
    if (k < t.size()) ++k;
    while (k < t.size()) {
      const std::string name = t[k++];
      named[name] = parse_arg(t, k);
    }
    const auto& formals = h->schema().arguments();
    for (size_t f = 0; f < formals.size(); ++f) {
      if (f < positional.size()) {
        s.args.push_back(positional[f]);
      } else if (named.count(formals[f].name())) {
        s.args.push_back(named[formals[f].name()]);
      } else {
        Arg a;
        if (formals[f].default_value()) a.constant = *formals[f].default_value();
        s.args.push_back(std::move(a));
      }
    }
    TORCH_CHECK(static_cast<int>(s.args.size()) >= op_info(s.id).program_operands, "scalar program: ", s.target,
                " lacks operands");
    p.steps.push_back(std::move(s));
  }
  for (int i = 0; i < n_out; ++i) {
    const auto t = tokens(lines[pos++]);
    TORCH_CHECK(t.size() == 2 && t[0] == "out", "scalar program: bad output ", lines[pos - 1]);
    p.outputs.push_back(t[1] == "n" ? -1 : std::stoi(t[1].substr(1)));
  }
  return p;
}

std::string emit_program(const ScalarProgram& p, const std::string& name, const std::string& ret,
                         const std::vector<std::string>& params) {
  TORCH_CHECK(!p.outputs.empty() && p.outputs[0] >= 0, "scalar program ", name, " returns nothing");
  TORCH_CHECK(p.inputs.size() >= params.size(), "scalar program ", name, " takes ", p.inputs.size(),
              " inputs, fewer than its ", params.size(), " parameters");
  std::ostringstream os;
  os << "static inline " << ret << " " << name << "(";
  for (const auto& d : params) os << d << ", ";
  os << "const NxBuf* bufs) {\n";
  std::vector<std::string> var(p.inputs.size() + p.steps.size());
  std::vector<c10::ScalarType> dtype(var.size());
  std::vector<bool> buffer(var.size(), false);
  for (size_t i = 0; i < p.inputs.size(); ++i) {
    dtype[i] = p.inputs[i].dtype;
    if (i < params.size()) {
      const std::string& d = params[i];
      var[i] = d.substr(d.find_last_of(' ') + 1);
    } else {  // a captured buffer: read through its accessor (a 0-d one is also a value)
      buffer[i] = true;
      var[i] = "NxAt<" + std::string(storage_type(p.inputs[i].dtype)) + ">(bufs[" +
               std::to_string(i - params.size()) + "])";
    }
  }
  auto operand = [&](const Arg& a, bool cast, c10::ScalarType to) -> std::string {
    std::string e;
    if (a.kind == Arg::Kind::kConstant) {
      e = literal(a.constant);
    } else {
      TORCH_CHECK(a.kind == Arg::Kind::kValue && a.value >= 0 && a.value < static_cast<int>(var.size()) &&
                      !var[a.value].empty(), "scalar program ", name, ": bad operand");
      e = buffer[a.value] ? var[a.value] + "()" : var[a.value];
    }
    return cast ? "static_cast<" + std::string(program_type(to)) + ">(" + e + ")" : e;
  };
  for (size_t k = 0; k < p.steps.size(); ++k) {
    const auto& s = p.steps[k];
    const OpInfo& info = op_info(s.id);
    std::vector<std::string> ops;
    if (info.program_form == ProgramForm::kGather) {
      const Arg& buf = s.args[0];
      TORCH_CHECK(buf.kind == Arg::Kind::kValue && buffer[buf.value], "scalar program ", name,
                  ": index.Tensor reads a captured tensor only");
      ops.push_back(var[buf.value]);
      TORCH_CHECK(s.args[1].kind == Arg::Kind::kList, "scalar program ", name, ": index.Tensor without indices");
      TORCH_CHECK(static_cast<int>(s.args[1].items.size()) == p.inputs[buf.value].rank, "FlexAttention: a captured "
                  "tensor of ", p.inputs[buf.value].rank, " dims read with ", s.args[1].items.size(),
                  " indices in a score_mod or mask_mod (index every dim to one value)");
      for (const Arg& i : s.args[1].items) {
        TORCH_CHECK(i.kind != Arg::Kind::kConstant || !i.constant.isNone(), "scalar program ", name,
                    ": an index.Tensor index is None (slices are not supported)");
        ops.push_back(operand(i, true, c10::kLong));
      }
    } else if (info.program_form == ProgramForm::kFill) {
      if (info.fill_arg >= 0) ops.push_back(operand(s.args.at(info.fill_arg), false, s.dtype));
    } else {
      const bool cast = info.program_form == ProgramForm::kArithmetic;
      for (int i = 0; i < info.program_operands; ++i) {
        const bool cond = info.program_form == ProgramForm::kSelect && i == 0;
        ops.push_back(operand(s.args[i], info.program_form == ProgramForm::kSelect ? !cond : cast, s.dtype));
      }
    }
    const size_t v = p.inputs.size() + k;
    var[v] = "t" + std::to_string(k);
    dtype[v] = s.dtype;
    const std::string ty = program_type(s.dtype);
    std::string e = "static_cast<" + ty + ">(" + info.expr(ops) + ")";
    // bfloat16 and float16 steps run in float without rounding: FlexAttention evaluates its mods
    // in float32, its working precision, whatever dtype tracing gave the scores.
    os << "  const " << ty << " " << var[v] << " = " << e << ";\n";
  }
  const int out = p.outputs[0];
  TORCH_CHECK(!buffer[out], "scalar program ", name, " returns a captured tensor");
  os << "  return static_cast<" << ret << ">(" << var[out] << ");\n}\n";
  return os.str();
}

}  // namespace neuronx::compiler
