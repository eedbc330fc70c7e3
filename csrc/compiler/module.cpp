// Python bindings of the compiler (torch_neuronx._C._compiler): compile() takes
// the graph description the Dynamo backend builds once per graph; the returned
// Executable is called with the graph's inputs for every run.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include "backend/bindings.h"
#include "compiler/adaptive_eager.h"
#include "compiler/kernel_cache.h"
#include "compiler/pipeline.h"

namespace py = pybind11;

namespace neuronx::compiler {

namespace {

bool is_ref(const py::handle& o) { return py::hasattr(o, "_nx_ref"); }
int ref_id(const py::handle& o) { return o.attr("_nx_ref").cast<int>(); }

c10::IValue py_number(const py::handle& o) {
  if (py::isinstance<py::bool_>(o)) return c10::IValue(o.cast<bool>());
  if (py::isinstance<py::int_>(o)) return c10::IValue(o.cast<int64_t>());
  return c10::IValue(o.cast<double>());
}

bool is_number(const py::handle& o) {
  return py::isinstance<py::bool_>(o) || py::isinstance<py::int_>(o) || py::isinstance<py::float_>(o);
}

Arg to_arg(const py::handle& o, const c10::TypePtr& type) {
  Arg a;
  if (is_ref(o)) {
    a.kind = Arg::Kind::kValue;
    a.value = ref_id(o);
    return a;
  }
  if (py::isinstance<py::list>(o) || py::isinstance<py::tuple>(o)) {
    bool refs = false;
    for (auto item : o) refs = refs || is_ref(item);
    if (refs) {
      a.kind = Arg::Kind::kList;
      c10::TypePtr elem = c10::AnyType::get();
      c10::TypePtr t = type;
      if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
      if (auto l = t->cast<c10::ListType>()) elem = l->getElementType();
      for (auto item : o) a.items.push_back(to_arg(item, elem));
      return a;
    }
  }
  a.kind = Arg::Kind::kConstant;
  c10::TypePtr t = type;
  if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
  if (is_number(o) && (t->kind() == c10::TypeKind::TensorType || t->kind() == c10::TypeKind::AnyType ||
                       t->kind() == c10::TypeKind::NumberType)) {
    a.constant = py_number(o);  // a Python number where a Tensor goes: wrapped at run time
    return a;
  }
  a.constant = torch::jit::toIValue(o, type);
  return a;
}

SymExpr to_expr(const py::handle& o, const std::vector<std::string>& symbols) {
  std::vector<std::string> postfix;
  for (auto t : o) postfix.push_back(t.cast<std::string>());
  try {
    return SymExpr(std::move(postfix), symbols);
  } catch (const std::runtime_error& e) {
    TORCH_CHECK(false, "torch_neuronx compiler: ", e.what());
  }
}

Graph to_graph(const py::dict& desc) {
  Graph g;
  std::vector<std::string> symbol_names;  // size expressions refer to symbols by index
  for (auto s : desc["symbols"]) {
    auto t = s.cast<py::tuple>();
    g.symbols.push_back({t[0].cast<std::string>(), t[1].cast<int>(), t[2].cast<int>()});
    symbol_names.push_back(g.symbols.back().name);
  }
  for (auto v : desc["values"]) {
    auto t = v.cast<py::tuple>();
    Value val;
    val.name = t[0].cast<std::string>();
    const auto kind = t[1].cast<std::string>();
    val.kind = kind == "tensor" ? Value::Kind::kTensor : kind == "scalar" ? Value::Kind::kScalar : Value::Kind::kOther;
    if (!t[2].is_none()) {
      auto m = t[2].cast<py::tuple>();
      TensorMeta meta;
      TORCH_CHECK(THPDtype_Check(m[0].ptr()), "torch_neuronx compiler: expected a torch.dtype in the graph description");
      meta.dtype = reinterpret_cast<THPDtype*>(m[0].ptr())->scalar_type;
      for (auto s : m[1]) meta.sizes.push_back(to_expr(s, symbol_names));
      for (auto s : m[2]) meta.strides.push_back(to_expr(s, symbol_names));
      val.meta = std::move(meta);
    }
    g.values.push_back(std::move(val));
  }
  for (auto i : desc["inputs"]) {
    auto t = i.cast<py::tuple>();
    g.inputs.push_back({t[0].cast<int>(), t[1].cast<bool>()});
  }
  auto& dispatcher = c10::Dispatcher::singleton();
  for (auto item : desc["nodes"]) {
    auto t = item.cast<py::tuple>();
    Node n;
    const auto kind = t[0].cast<std::string>();
    n.target = t[1].cast<std::string>();
    auto args = t[2].cast<py::list>();
    auto kwargs = t[3].cast<py::dict>();
    for (auto o : t[4]) n.outputs.push_back(o.cast<int>());
    if (kind == "aten") {
      n.kind = Node::Kind::kAten;
      const auto dot = n.target.find('.', n.target.find("::"));
      const std::string name = n.target.substr(0, dot);
      const std::string overload = dot == std::string::npos ? "" : n.target.substr(dot + 1);
      auto h = dispatcher.findSchema({name, overload});
      TORCH_CHECK(h, "torch_neuronx compiler: unknown operator ", n.target);
      n.op = *h;
      n.id = op_id(n.target);
      switch (op_info(n.id).not_lowered) {
        case NotLowered::kNeuronKernel: n.neuron_kernel = Node::NeuronKernel::kAlways; break;
        case NotLowered::kNeuronKernelForIntegralInput: n.neuron_kernel = Node::NeuronKernel::kIntegralInput; break;
        case NotLowered::kCpuKernel: break;
      }
      const auto& formals = h->schema().arguments();
      for (size_t i = 0; i < formals.size(); ++i) {
        const auto& f = formals[i];
        if (i < args.size()) {
          n.args.push_back(to_arg(args[i], f.real_type()));
        } else if (kwargs.contains(f.name().c_str())) {
          n.args.push_back(to_arg(kwargs[f.name().c_str()], f.real_type()));
        } else {
          TORCH_CHECK(f.default_value().has_value(), "torch_neuronx compiler: ", n.target, " lacks argument ",
                      f.name());
          Arg a;
          a.constant = *f.default_value();
          n.args.push_back(std::move(a));
        }
      }
      if (auto seeded = generator_overload(*n.op)) {  // draw from the neuron generator
        n.op = seeded->first;
        n.target = n.op->schema().name() + "." + n.op->schema().overload_name();
        n.args.insert(n.args.begin() + static_cast<std::ptrdiff_t>(seeded->second), Arg{});
      }
    } else {
      n.kind = Node::Kind::kScalarOp;
      n.id = op_id(n.target);
      TORCH_CHECK(n.id == OpId::kSymSize || n.id == OpId::kSymStride || n.id == OpId::kSymNumel ||
                      op_info(n.id).scalar,
                  "torch_neuronx compiler: no runtime support for the scalar op ", n.target);
      for (auto a : args) n.args.push_back(to_arg(a, c10::AnyType::get()));
    }
    g.nodes.push_back(std::move(n));
  }
  for (auto o : desc["outputs"]) g.outputs.push_back(o.cast<int>());
  return g;
}

c10::IValue py_to_ivalue(const py::handle& o) {
  if (o.is_none()) return c10::IValue();
  if (THPVariable_Check(o.ptr())) return c10::IValue(THPVariable_Unpack(o.ptr()));
  if (is_number(o)) return py_number(o);
  if (py::hasattr(o, "node") && py::hasattr(o, "__index__")) return c10::IValue(o.attr("__index__")().cast<int64_t>());
  TORCH_CHECK(false, "torch_neuronx compiler: unsupported input of type ", py::str(py::type::handle_of(o)).cast<std::string>());
}

py::object ivalue_to_py(const c10::IValue& v) {
  if (v.isNone()) return py::none();
  if (v.isTensor()) return py::reinterpret_steal<py::object>(THPVariable_Wrap(v.toTensor()));
  if (v.isInt()) return py::int_(v.toInt());
  if (v.isDouble()) return py::float_(v.toDouble());
  if (v.isBool()) return py::bool_(v.toBool());
  TORCH_CHECK(false, "torch_neuronx compiler: unsupported output ", v.tagKind());
}

}  // namespace

void bind(py::module& parent) {
  py::module m = parent.def_submodule("_compiler", "the neuron graph compiler");
  m.def("_op_table", [] {
    static const char* reductions[] = {"", "softmax", "log_softmax", "layer_norm"};
    static const char* gemms[] = {"", "mm", "addmm", "convolution"};
    static const char* not_lowered[] = {"cpu_kernel", "neuron_kernel", "neuron_kernel_for_integral_input"};
    static const char* program_forms[] = {"", "arithmetic", "compare", "select", "gather", "cast", "fill"};
    py::list out;
    for (const OpInfo& i : op_table()) {
      if (i.id == OpId::kOther) continue;
      py::dict d;
      d["target"] = i.target;
      d["pointwise"] = i.pointwise();
      d["reduction"] = reductions[static_cast<int>(i.reduction)];
      d["loss"] = i.loss;
      d["post_op"] = i.post_op;
      d["gemm"] = gemms[static_cast<int>(i.gemm)];
      d["reshape_view"] = i.reshape_view;
      d["not_lowered"] = not_lowered[static_cast<int>(i.not_lowered)];
      d["keep_whole"] = i.keep_whole;
      d["eager_exact"] = i.eager_exact;
      d["eager_exact_bf16"] = i.eager_exact_bf16;
      d["scalar"] = static_cast<bool>(i.scalar);
      d["program_form"] = program_forms[static_cast<int>(i.program_form)];
      d["flex_attention"] = i.flex_attention;
      d["out_as"] = i.out_as;
      out.append(d);
    }
    return out;
  }, "The compiler's op table: what it knows about each op (op_table.h)");
  py::class_<Executable, std::shared_ptr<Executable>>(m, "Executable")
      .def("__call__",
           [](const Executable& e, const py::list& inputs) {
             std::vector<c10::IValue> in;
             in.reserve(inputs.size());
             for (auto o : inputs) in.push_back(py_to_ivalue(o));
             std::vector<c10::IValue> out;
             {
               py::gil_scoped_release nogil;
               out = e.launch(in);
             }
             py::list r;
             for (const auto& v : out) r.append(ivalue_to_py(v));
             return r;
           });
  m.def("_compile_counters", &compile_counter_names);
  m.def("_cache_dir", [] { return KernelCache::instance().private_directory(); },
        "The compile cache's directory (TORCH_NEURONX_CACHE_DIR, default ~/.cache/torch_neuronx), created "
        "user-only if missing; raises RuntimeError if another user can change it.");
  m.def("_set_execution_mode", [](const std::string& mode) {
    TORCH_CHECK(mode == "eager" || mode == "adaptive", "torch_neuronx.set_execution_mode: unknown mode '", mode,
                "'; the modes are 'eager' and 'adaptive'");
    adaptive::set_mode(mode == "adaptive" ? adaptive::Mode::kAdaptive : adaptive::Mode::kEager);
  });
  m.def("_execution_mode", [] { return adaptive::mode() == adaptive::Mode::kAdaptive ? "adaptive" : "eager"; });
  m.def("_adaptive_metrics", [] {
    const adaptive::Metrics a = adaptive::metrics();
    py::dict d;
#define NEURONX_EXPORT(f) d[#f] = a.f;
    NEURONX_ADAPTIVE_COUNTERS(NEURONX_EXPORT)
#undef NEURONX_EXPORT
    d["ended"] = a.ended;
    return d;
  });
  m.def("_adaptive_reset_metrics", &adaptive::reset_metrics);
  m.def("_adaptive_wait_for_builds", [](double timeout_s) {
    py::gil_scoped_release nogil;
    return adaptive::wait_for_builds(timeout_s);
  });
  m.def("compile", [](const py::dict& desc, const std::string& debug_dir) {
    Graph g = to_graph(desc);
    CompileStats stats;
    std::shared_ptr<Executable> exe;
    {
      py::gil_scoped_release nogil;
      exe = compile(std::move(g), debug_dir, stats);
    }
    py::dict s;
    s["ir_hash"] = stats.ir_hash;
    s["seconds"] = stats.seconds;
    py::dict counters;
#define NEURONX_EXPORT(f) counters[#f] = stats.passes.f;
    NEURONX_PASS_STATS(NEURONX_EXPORT)
#undef NEURONX_EXPORT
#define NEURONX_EXPORT(f) counters[#f] = stats.build.f;
    NEURONX_BUILD_STATS(NEURONX_EXPORT)
#undef NEURONX_EXPORT
#define NEURONX_EXPORT(f) counters[#f] = stats.f;
    NEURONX_PLAN_STATS(NEURONX_EXPORT)
#undef NEURONX_EXPORT
    s["counters"] = counters;
    s["library_calls"] = stats.library_calls;
    return py::make_tuple(exe, s);
  });
}

}  // namespace neuronx::compiler
