// Python bindings of the kernel-language core (torch_neuronx._C._nki): the
// front ends (torch_neuronx/nki) trace a kernel into a Program through these.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include "backend/bindings.h"
#include "nki/alu.h"
#include "nki/launch_op.h"
#include "nki/cost_model.h"
#include "nki/program.h"

namespace py = pybind11;

namespace neuronx::nki {

namespace {

at::ScalarType dtype_of(const py::handle& o) {
  if (!THPDtype_Check(o.ptr())) throw py::type_error("expected a torch.dtype");
  return reinterpret_cast<THPDtype*>(o.ptr())->scalar_type;
}

const std::unordered_map<std::string, Kind>& kinds() {
  static const std::unordered_map<std::string, Kind> k = {
      {"fill", Kind::kFill},
      {"const", Kind::kConst},
      {"copy", Kind::kCopy},
      {"matmul", Kind::kMatmul},
      {"transpose", Kind::kTranspose},
      {"activation", Kind::kActivation},
      {"tensor_tensor", Kind::kTensorTensor},
      {"tensor_scalar", Kind::kTensorScalar},
      {"scalar_tensor_tensor", Kind::kScalarTensorTensor},
      {"reduce", Kind::kReduce},
      {"partition_reduce", Kind::kPartitionReduce},
      {"select", Kind::kSelect},
      {"where", Kind::kWhere},
      {"bn_stats", Kind::kBnStats},
      {"bn_aggr", Kind::kBnAggr},
      {"scan", Kind::kScan},
      {"random", Kind::kRandom},
      {"max8", Kind::kMax8},
      {"find_index8", Kind::kFindIndex8},
      {"gather", Kind::kGather},
      {"cumulative", Kind::kCumulative},
      {"seed", Kind::kSeed},
      {"match_replace8", Kind::kMatchReplace8},
      {"shuffle", Kind::kShuffle},
      {"sequence_bounds", Kind::kSequenceBounds},
      {"local_gather", Kind::kLocalGather},
      {"print", Kind::kPrint},
      {"nonzero", Kind::kNonzero},
      {"quantize_mx", Kind::kQuantizeMx},
      {"matmul_mx", Kind::kMatmulMx},
      {"prng", Kind::kPrng},
      {"register", Kind::kRegister},
      {"loop_begin", Kind::kLoopBegin},
      {"loop_end", Kind::kLoopEnd},
  };
  return k;
}

// (buffer, dtype, byte_offset, sizes, strides, role)
Access access_of(const py::handle& h) {
  auto t = h.cast<py::tuple>();
  Access a;
  a.buffer = t[0].cast<int>();
  a.dtype = dtype_of(t[1]);
  a.byte_offset = t[2].cast<int64_t>();
  a.sizes = t[3].cast<std::vector<int64_t>>();
  a.strides = t[4].cast<std::vector<int64_t>>();
  a.role = t[5].cast<std::string>();
  a.tile = t.size() > 6 ? t[6].cast<int>() : -1;
  if (t.size() > 7)  // run-time offsets: (source, stride, lo, hi, what)
    for (const auto& d : t[7].cast<py::list>()) {
      auto dt = d.cast<py::tuple>();
      a.dynamic.push_back({dt[0].cast<int>(), dt[1].cast<int64_t>(), dt[2].cast<int64_t>(), dt[3].cast<int64_t>(),
                           dt[4].cast<std::string>(), dt.size() > 5 && dt[5].cast<bool>()});
    }
  return a;
}

std::vector<at::Tensor> tensors_of(const py::list& l) {
  std::vector<at::Tensor> v;
  for (const auto& o : l) {
    if (!THPVariable_Check(o.ptr())) throw py::type_error("expected tensors");
    v.push_back(THPVariable_Unpack(o.ptr()));
  }
  return v;
}

}  // namespace

void bind(py::module& parent) {
  py::module m = parent.def_submodule("_nki", "NKI kernel-language core");
  py::class_<Program, std::shared_ptr<Program>>(m, "Program")
      .def(py::init<int64_t>())
      .def("allocate",
           [](Program& p, int space, py::handle dtype, int64_t partitions, int64_t blocks, int64_t free_elems,
              const std::string& what, int core) {
             return p.allocate(static_cast<Space>(space), dtype_of(dtype), partitions, blocks, free_elems, what, core);
           },
           py::arg("space"), py::arg("dtype"), py::arg("partitions"), py::arg("blocks"), py::arg("free_elems"),
           py::arg("what"), py::arg("core") = 0)
      .def("set_cores", &Program::set_cores)
      .def("allocate_at",
           [](Program& p, int space, py::handle dtype, int64_t partitions, int64_t free_elems,
              const std::vector<std::pair<int64_t, int64_t>>& blocks, const std::string& what, int core) {
             return p.allocate_at(static_cast<Space>(space), dtype_of(dtype), partitions, free_elems, blocks, what,
                                  core);
           },
           py::arg("space"), py::arg("dtype"), py::arg("partitions"), py::arg("free_elems"), py::arg("blocks"),
           py::arg("what"), py::arg("core") = 0)
      .def("finalize", [](Program& p) {
        try {
          p.finalize();
        } catch (const std::length_error& e) {  // on-chip memory full: MemoryError, as out of memory
          PyErr_SetString(PyExc_MemoryError, e.what());
          throw py::error_already_set();
        }
      })
      .def("add_hbm", [](Program& p, py::handle dtype, std::vector<int64_t> sizes) {
        return p.add_hbm(dtype_of(dtype), std::move(sizes));
      })
      .def("emit",
           [](Program& p, const std::string& kind, const std::string& name, const py::list& ops,
              std::vector<std::string> fns, std::vector<double> scalars, std::vector<int64_t> ints,
              std::optional<at::Tensor> mask, std::optional<at::Tensor> constant, const std::string& where,
              const py::list& dyn_srcs) {
             auto k = kinds().find(kind);
             if (k == kinds().end()) throw py::value_error("unknown NKI instruction kind " + kind);
             Instruction ins{k->second, name};
             for (const auto& o : ops) ins.ops.push_back(access_of(o));
             ins.fns = std::move(fns);
             ins.scalars = std::move(scalars);
             ins.ints = std::move(ints);
             ins.mask = std::move(mask);
             ins.constant = std::move(constant);
             ins.where = where;
             for (const auto& o : dyn_srcs) ins.dyn_srcs.push_back(access_of(o));
             p.emit(std::move(ins));
           },
           py::arg("kind"), py::arg("name"), py::arg("ops"), py::arg("fns") = std::vector<std::string>{},
           py::arg("scalars") = std::vector<double>{}, py::arg("ints") = std::vector<int64_t>{},
           py::arg("mask") = std::nullopt, py::arg("constant") = std::nullopt, py::arg("where") = "",
           py::arg("dyn_srcs") = py::list())
      .def("retarget_last", [](Program& p, int tile, py::handle dst, bool accumulate) {
        return p.retarget_last(tile, access_of(dst), accumulate);
      })
      .def("check",
           [](Program& p, const std::string& kind, const std::string& name, const py::list& ops,
              std::vector<int64_t> ints) {
             auto k = kinds().find(kind);
             if (k == kinds().end()) throw py::value_error("unknown NKI instruction kind " + kind);
             Instruction ins{k->second, name};
             for (const auto& o : ops) ins.ops.push_back(access_of(o));
             ins.ints = std::move(ints);
             check_instruction(ins, target());
           })
      .def("run", [](const Program& p, const py::list& hbm) {
        auto v = tensors_of(hbm);
        try {
          py::gil_scoped_release nogil;
          p.run(v);
        } catch (const c10::IndexError& e) {
          throw py::index_error(e.what_without_backtrace());
        } catch (const c10::ValueError& e) {
          throw py::value_error(e.what_without_backtrace());
        } catch (const c10::Error& e) {
          throw std::runtime_error(e.what_without_backtrace());
        }
      })
      .def("register", [](std::shared_ptr<Program> p) { return register_program(p); })
      .def_property_readonly("num_instructions", [](const Program& p) { return p.instructions().size(); })
      .def_property_readonly("sbuf_peak", [](const Program& p) { return p.peak_bytes(Space::kSbuf); })
      .def_property_readonly("psum_peak", [](const Program& p) { return p.peak_bytes(Space::kPsum); })
      .def("model_cost", [](const Program& p) {
        const CostReport r = model_cost(p, target());
        py::dict busy;
        for (int e = 0; e < kModeledEngines; ++e) busy[engine_name(static_cast<Engine>(e))] = r.busy_ns[e];
        py::list steps;
        for (const auto& s : r.steps) steps.append(py::make_tuple(s.name, engine_name(s.engine), s.start_ns, s.end_ns));
        return py::dict(py::arg("latency_ns") = r.latency_ns, py::arg("busy_ns") = busy,
                        py::arg("tensor_flops") = r.tensor_flops, py::arg("tensor_peak_flops") = r.tensor_peak,
                        py::arg("dma_bytes") = r.dma_bytes, py::arg("dma_queues") = kDmaQueues,
                        py::arg("steps") = steps);
      })
      .def("instruction_names", [](const Program& p) {
        std::vector<std::string> n;
        for (const auto& i : p.instructions()) n.push_back(i.name);
        return n;
      });
  m.def("target", [] {
    const Target& t = target();
    return py::dict(py::arg("name") = t.name, py::arg("nc_version") = t.nc_version,
                    py::arg("partitions") = t.partitions, py::arg("sbuf_partition_bytes") = t.sbuf_partition_bytes,
                    py::arg("psum_partition_bytes") = t.psum_partition_bytes,
                    py::arg("psum_bank_bytes") = t.psum_bank_bytes);
  });
  m.def("reload_target", [] { reload_target(); });
  m.def("is_alu_op", &is_alu_op);
  m.def("is_activation", &is_activation);
}

}  // namespace neuronx::nki
