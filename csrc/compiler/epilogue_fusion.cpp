#include "compiler/epilogue_fusion.h"

#include <ATen/Context.h>

#include <map>
#include <optional>
#include <set>

namespace neuronx::compiler {

namespace {

// Below this many multiply-adds, or this many rows, ATen's BLAS call wins: oneDNN's
// per-call setup (and the weight reorder a column-major weight needs) is not amortized. Above
// them oneDNN's matmul is 1.4-2.3x ATen's MKL call on this machine (2^22 multiply-adds: 1.4x;
// from 2^24: 2x and more), so much faster that a row-major copy of a transposed left operand
// (the backward's weight-gradient GEMMs) and a copy of a returned result still pay.
constexpr double kMinMacs = 1 << 22;
constexpr double kMinRows = 32;
// A convolution's post-op saves one pass over its output: below this many elements (a squeeze-
// excitation's 1x1 convolutions, say) there is nothing to save.
constexpr double kMinConvOutput = 1 << 16;

std::optional<c10::OperatorHandle> op(const char* name, const char* overload) {
  return c10::Dispatcher::singleton().findSchema({name, overload});
}

Arg value_arg(int v) {
  Arg a;
  a.kind = Arg::Kind::kValue;
  a.value = v;
  return a;
}

Arg constant_arg(c10::IValue c) {
  Arg a;
  a.constant = std::move(c);
  return a;
}

bool is_one(const Arg& a) {
  if (a.kind != Arg::Kind::kConstant) return false;
  if (a.constant.isInt()) return a.constant.toInt() == 1;
  if (a.constant.isDouble()) return a.constant.toDouble() == 1.0;
  return false;
}

const TensorMeta* tensor_meta(const Graph& g, const Arg& a) {
  if (a.kind != Arg::Kind::kValue) return nullptr;
  const Value& v = g.values[a.value];
  return v.kind == Value::Kind::kTensor && v.meta ? &*v.meta : nullptr;
}

double num(const SymExpr& e) { return static_cast<double>(e.value()); }

// A static 2-D float32 tensor with strides {rows: cols, cols: 1} (row-major) or, with
// `transposed`, {1, rows}.
bool dense_2d(const TensorMeta& m, bool transposed) {
  if (m.dtype != c10::ScalarType::Float || m.sizes.size() != 2 || !m.is_static()) return false;
  const double r = num(m.sizes[0]), c = num(m.sizes[1]), s0 = num(m.strides[0]), s1 = num(m.strides[1]);
  return transposed ? (s0 == 1 || c == 1) && (s1 == r || r == 1) : (s1 == 1 || c == 1) && (s0 == c || r == 1);
}

// The oneDNN post-op computing this node from its first operand, or "" if none does.
std::string unary_attr(const Node& n, std::string& algorithm) {
  const OpInfo& i = op_info(n.id);
  if (n.id != OpId::kGelu) return i.post_op;
  // gelu: oneDNN's post-op takes its exact and tanh forms, named by the argument.
  if (n.args.size() != 2 || n.args[1].kind != Arg::Kind::kConstant || !n.args[1].constant.isString()) return "";
  algorithm = n.args[1].constant.toStringRef();
  return algorithm == "none" || algorithm == "tanh" ? i.post_op : "";
}

// A float32 2-D convolution oneDNN's fused op takes as it is: an NCHW or channels-last input
// (the layout pass gives convolutions channels-last inputs), a contiguous weight, constant
// geometry, not transposed, no output padding.
bool convolution_eligible(const Graph& g, const Node& n) {
  const TensorMeta *x = tensor_meta(g, n.args[0]), *w = tensor_meta(g, n.args[1]);
  const TensorMeta* y = g.values[n.outputs[0]].meta ? &*g.values[n.outputs[0]].meta : nullptr;
  if (!x || !w || !y || x->sizes.size() != 4 || w->sizes.size() != 4 ||
      !(x->is_static_contiguous() || x->is_static_channels_last()) ||
      !w->is_static_contiguous() || x->dtype != c10::ScalarType::Float || w->dtype != x->dtype || !y->is_static())
    return false;
  double elements = 1;
  for (const auto& e : y->sizes) elements *= num(e);
  if (elements < kMinConvOutput) return false;
  if (n.args[2].kind == Arg::Kind::kValue) {
    const TensorMeta* b = tensor_meta(g, n.args[2]);
    if (!b || b->dtype != x->dtype || b->sizes.size() != 1) return false;
  } else if (!n.args[2].constant.isNone()) {
    return false;
  }
  auto ints = [](const Arg& a, size_t len, bool zeros) {
    std::vector<int64_t> v;
    if (a.kind == Arg::Kind::kConstant && a.constant.isIntList()) v = a.constant.toIntVector();
    else if (a.kind == Arg::Kind::kList)
      for (const auto& i : a.items) {
        if (i.kind != Arg::Kind::kConstant || !i.constant.isInt()) return false;
        v.push_back(i.constant.toInt());
      }
    else return false;
    if (v.size() != len) return false;
    for (int64_t e : v)
      if (zeros && e != 0) return false;
    return true;
  };
  return ints(n.args[3], 2, false) && ints(n.args[4], 2, false) && ints(n.args[5], 2, false) &&
         n.args[6].kind == Arg::Kind::kConstant && n.args[6].constant.isBool() && !n.args[6].constant.toBool() &&
         ints(n.args[7], 2, true) && n.args[8].kind == Arg::Kind::kConstant && n.args[8].constant.isInt();
}

// A float32 mm/addmm oneDNN's linear takes and beats ATen's BLAS call on: row- or
// column-major operands (a column-major left one is copied row-major first), large enough, and
// (addmm) a plain bias vector.
bool gemm_eligible(const Graph& g, const Node& n) {
  const bool addmm = op_info(n.id).gemm == Gemm::kAddmm;
  const int ai = addmm ? 1 : 0;
  const TensorMeta *a = tensor_meta(g, n.args[ai]), *b = tensor_meta(g, n.args[ai + 1]);
  const TensorMeta* out = g.values[n.outputs[0]].meta ? &*g.values[n.outputs[0]].meta : nullptr;
  if (!a || !b || !out || !(dense_2d(*a, false) || dense_2d(*a, true)) || !(dense_2d(*b, false) || dense_2d(*b, true)) ||
      out->dtype != c10::ScalarType::Float)
    return false;
  const double rows = num(a->sizes[0]), inner = num(a->sizes[1]), cols = num(b->sizes[1]);
  if (rows * inner * cols < kMinMacs || rows < kMinRows) return false;
  if (!addmm) return true;
  // oneDNN adds a bias vector: addmm with beta = alpha = 1 over a [cols] bias.
  const TensorMeta* bias = tensor_meta(g, n.args[0]);
  return is_one(n.args[3]) && is_one(n.args[4]) && bias && bias->dtype == out->dtype && bias->sizes.size() == 1 &&
         bias->is_static() && num(bias->sizes[0]) == cols && num(bias->strides[0]) == 1;
}

struct Match {
  int gemm = -1, view = -1, epilogue = -1;  // node indices: the GEMM or convolution, the view and
                                            // the epilogue (-1 if none)
  std::string attr = "none", algorithm;     // unary post-op
  int other = -1;                           // binary add: the residual's value id
};

struct Matches {
  std::map<int, Match> by_gemm;    // gemm node -> match
  std::map<int, int> by_epilogue;  // epilogue node -> gemm node
  std::set<int> fused_views;       // views moved after their fused call
};

// Readers of each value (node indices; graph outputs count as a reader -1).
std::vector<std::vector<int>> value_readers(const Graph& g) {
  std::vector<std::vector<int>> readers(g.values.size());
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (const auto& a : g.nodes[i].args) for_each_value(a, [&](int v) { readers[v].push_back(static_cast<int>(i)); });
  for (int o : g.outputs)
    if (o >= 0) readers[o].push_back(-1);
  return readers;
}

// The epilogue of m.gemm: the GEMM result's only reader (through one reshaping view) when that
// is a pointwise op oneDNN runs as a post-op over the same elements. Sets m.view, m.epilogue and
// the post-op; m.epilogue stays -1 when there is none.
void find_epilogue(const Graph& g, const std::vector<std::vector<int>>& readers, const std::map<int, int>& by_epilogue,
                   bool convolution, Match& m) {
  auto only_reader = [&](int v) { return readers[v].size() == 1 ? readers[v][0] : -1; };
  const Node& n = g.nodes[m.gemm];
  const TensorMeta* out = &*g.values[n.outputs[0]].meta;
  int chain = n.outputs[0], reader = only_reader(chain);
  if (reader >= 0 && !convolution &&
      op_info(g.nodes[reader].id).reshape_view &&
      g.nodes[reader].args[0].kind == Arg::Kind::kValue && g.nodes[reader].args[0].value == chain) {
    m.view = reader;
    chain = g.nodes[reader].outputs[0];
    reader = only_reader(chain);
  }
  if (reader < 0 || by_epilogue.count(reader)) return;
  const Node& e = g.nodes[reader];
  const TensorMeta* em = e.outputs.size() == 1 && g.values[e.outputs[0]].meta ? &*g.values[e.outputs[0]].meta : nullptr;
  std::string algorithm;
  const std::string attr = unary_attr(e, algorithm);
  const bool reads_chain_first = !e.args.empty() && e.args[0].kind == Arg::Kind::kValue && e.args[0].value == chain;
  if (em && em->dtype == out->dtype && !attr.empty() && reads_chain_first) {
    m.epilogue = reader;
    m.attr = attr;
    m.algorithm = algorithm;
  } else if (em && em->dtype == out->dtype && e.id == OpId::kAdd && e.args.size() == 3 &&
             is_one(e.args[2])) {
    for (int k = 0; k < 2 && m.epilogue < 0; ++k) {
      const Arg &x = e.args[k], &y = e.args[1 - k];
      const TensorMeta* ym = tensor_meta(g, y);
      if (x.kind == Arg::Kind::kValue && x.value == chain && ym && y.value != chain && ym->dtype == out->dtype &&
          ym->same_sizes(*em)) {
        m.epilogue = reader;
        m.attr = "add";
        m.other = y.value;
      }
    }
  }
}

// The GEMMs and convolutions to hand to oneDNN, each with its epilogue if it has one.
Matches match_epilogues(const Graph& g) {
  const auto readers = value_readers(g);
  Matches ms;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const Gemm kind = op_info(n.id).gemm;
    const bool convolution = kind == Gemm::kConvolution;
    if (n.kind != Node::Kind::kAten || kind == Gemm::kNone || n.outputs.size() != 1) continue;
    if (convolution && !convolution_eligible(g, n)) continue;
    if (!convolution && !gemm_eligible(g, n)) continue;
    Match m;
    m.gemm = static_cast<int>(i);
    find_epilogue(g, readers, ms.by_epilogue, convolution, m);
    // The fused call runs where the epilogue stood: nothing in between may write memory.
    for (int k = m.gemm + 1; k < m.epilogue && m.epilogue >= 0; ++k) {
      const Node& x = g.nodes[k];
      if (x.kind == Node::Kind::kAten && x.op->schema().is_mutable()) m.epilogue = -1;
    }
    if (m.epilogue < 0) m.view = -1;  // nothing fused: the view stays where it was
    if (convolution && m.epilogue < 0) continue;  // ATen's convolution is oneDNN's already
    if (m.epilogue >= 0) ms.by_epilogue[m.epilogue] = m.gemm;
    if (m.view >= 0) ms.fused_views.insert(m.view);
    ms.by_gemm[m.gemm] = m;
  }
  return ms;
}

// The ops the rewrite emits; absent without oneDNN.
struct OneDnnOps {
  c10::OperatorHandle linear, linear_binary, permute, flatten, conv, conv_binary, clone;
  static std::optional<OneDnnOps> find() {
    const auto clone = op("aten::clone", "");
    const auto linear = op("mkldnn::_linear_pointwise", "");
    const auto linear_binary = op("mkldnn::_linear_pointwise", "binary");
    const auto permute = op("aten::permute", "");
    const auto flatten = op("aten::flatten", "using_ints");
    const auto conv = op("mkldnn::_convolution_pointwise", "");
    const auto conv_binary = op("mkldnn::_convolution_pointwise", "binary");
    if (!linear || !linear_binary || !permute || !flatten || !conv || !conv_binary || !clone) return std::nullopt;
    return OneDnnOps{*linear, *linear_binary, *permute, *flatten, *conv, *conv_binary, *clone};
  }
};

// Replaces each match by oneDNN's fused call: it stands where the epilogue stood (the residual
// may be computed after the GEMM), or where the GEMM stood.
class Rewrite {
 public:
  Rewrite(Graph& g, const OneDnnOps& ops, EpilogueStats& stats) : g_(g), ops_(ops), stats_(stats) {}

  void run(const Matches& ms) {
    std::vector<Node> nodes;
    nodes.reserve(g_.nodes.size() + 2 * ms.by_gemm.size());
    for (size_t i = 0; i < g_.nodes.size(); ++i) {
      const int ii = static_cast<int>(i);
      auto gm = ms.by_gemm.find(ii);
      if (gm != ms.by_gemm.end()) {
        if (gm->second.epilogue < 0) emit(gm->second, nodes);
        continue;  // fused: emitted at its epilogue
      }
      auto ep = ms.by_epilogue.find(ii);
      if (ep != ms.by_epilogue.end()) {
        emit(ms.by_gemm.at(ep->second), nodes);
        continue;
      }
      if (!ms.fused_views.count(ii)) nodes.push_back(std::move(g_.nodes[i]));
    }
    g_.nodes = std::move(nodes);
  }

 private:
  int add_value(const std::string& name, TensorMeta meta) {
    Value v;
    v.kind = Value::Kind::kTensor;
    v.meta = std::move(meta);
    v.name = name;
    g_.values.push_back(std::move(v));
    return static_cast<int>(g_.values.size()) - 1;
  }

  static Node aten_node(const c10::OperatorHandle& h, std::vector<Arg> args, int output) {
    Node n;
    n.kind = Node::Kind::kAten;
    n.op = h;
    const auto& s = h.schema();
    n.target = s.name() + (s.overload_name().empty() ? "" : "." + s.overload_name());
    n.id = op_id(n.target);
    n.args = std::move(args);
    n.outputs = {output};
    return n;
  }

  void emit(const Match& m, std::vector<Node>& out) {
    if (op_info(g_.nodes[m.gemm].id).gemm == Gemm::kConvolution) return emit_convolution(m, out);
    emit_linear(m, out);
  }

  // args: input, weight, bias, stride, padding, dilation, ..., groups
  void emit_convolution(const Match& m, std::vector<Node>& out) {
    const Node& n = g_.nodes[m.gemm];
    const int result = g_.nodes[m.epilogue].outputs[0];
    if (m.other >= 0)
      out.push_back(aten_node(ops_.conv_binary,
                              {n.args[0], value_arg(m.other), n.args[1], n.args[2], n.args[4], n.args[3], n.args[5],
                               n.args[8], constant_arg(c10::IValue("add")), constant_arg(c10::IValue()),
                               constant_arg(c10::IValue()),
                               constant_arg(c10::IValue(c10::List<std::optional<c10::Scalar>>())),
                               constant_arg(c10::IValue())},
                              result));
    else
      out.push_back(aten_node(ops_.conv,
                              {n.args[0], n.args[1], n.args[2], n.args[4], n.args[3], n.args[5], n.args[8],
                               constant_arg(c10::IValue(m.attr)),
                               constant_arg(c10::IValue(c10::List<std::optional<c10::Scalar>>())),
                               constant_arg(m.algorithm.empty() ? c10::IValue() : c10::IValue(m.algorithm))},
                              result));
    stats_.convolutions++;
    stats_.epilogues++;
  }

  // weight = bᵀ (a view), a column-major input copied row-major, then oneDNN's linear.
  void emit_linear(const Match& m, std::vector<Node>& out) {
    Node& n = g_.nodes[m.gemm];
    const bool addmm = op_info(n.id).gemm == Gemm::kAddmm;
    const int ai = addmm ? 1 : 0;
    const int gemm_out = n.outputs[0];
    const TensorMeta& a = *g_.values[n.args[ai].value].meta;
    if (!dense_2d(a, false)) {
      TensorMeta rows = a;
      rows.strides = {a.sizes[1], SymExpr::constant(1)};
      const int copy = add_value(g_.values[n.args[ai].value].name + "_rows", rows);
      out.push_back(aten_node(ops_.clone, {n.args[ai], constant_arg(c10::IValue(c10::MemoryFormat::Contiguous))}, copy));
      n.args[ai] = value_arg(copy);
    }
    const TensorMeta& b = *g_.values[n.args[ai + 1].value].meta;
    TensorMeta wt;
    wt.dtype = b.dtype;
    wt.sizes = {b.sizes[1], b.sizes[0]};
    wt.strides = {b.strides[1], b.strides[0]};
    const int w = add_value(g_.values[gemm_out].name + "_weight", wt);
    out.push_back(aten_node(ops_.permute, {n.args[ai + 1], constant_arg(c10::IValue(std::vector<int64_t>{1, 0}))}, w));
    const Arg bias = addmm ? n.args[0] : constant_arg(c10::IValue());
    // Without a view the fused call defines the epilogue's value; with one, the GEMM's value,
    // which the view (moved after it) turns into the epilogue's value.
    const int result = m.epilogue < 0 ? gemm_out : m.view < 0 ? g_.nodes[m.epilogue].outputs[0] : gemm_out;
    if (m.other >= 0) {
      Arg other = value_arg(m.other);
      if (g_.values[m.other].meta->sizes.size() != 2) {  // the residual, as [rows, cols]
        const int flat = add_value(g_.values[m.other].name + "_rows", *g_.values[gemm_out].meta);
        out.push_back(aten_node(ops_.flatten, {other, constant_arg(int64_t{0}), constant_arg(int64_t{-2})}, flat));
        other = value_arg(flat);
      }
      out.push_back(aten_node(ops_.linear_binary,
                              {n.args[ai], other, value_arg(w), bias, constant_arg(c10::IValue("add"))}, result));
    } else {
      const c10::IValue algorithm = m.algorithm.empty() ? c10::IValue() : c10::IValue(m.algorithm);
      out.push_back(aten_node(ops_.linear,
                              {n.args[ai], value_arg(w), bias, constant_arg(c10::IValue(m.attr)),
                               constant_arg(c10::IValue(c10::List<std::optional<c10::Scalar>>())),
                               constant_arg(algorithm)},
                              result));
    }
    if (m.view >= 0) {
      Node v = g_.nodes[m.view];
      v.outputs = {g_.nodes[m.epilogue].outputs[0]};
      out.push_back(std::move(v));
    }
    stats_.gemms++;
    if (m.epilogue >= 0) stats_.epilogues++;
  }

  Graph& g_;
  const OneDnnOps& ops_;
  EpilogueStats& stats_;
};

}  // namespace

EpilogueStats fuse_epilogues(Graph& g) {
  EpilogueStats stats;
  if (!at::globalContext().userEnabledMkldnn()) return stats;  // torch.backends.mkldnn.enabled = False
  const auto ops = OneDnnOps::find();
  if (!ops) return stats;  // no oneDNN
  const Matches ms = match_epilogues(g);
  if (!ms.by_gemm.empty()) Rewrite(g, *ops, stats).run(ms);
  return stats;
}

}  // namespace neuronx::compiler
