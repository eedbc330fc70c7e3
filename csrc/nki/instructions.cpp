// Execution of NKI instructions on tile views with ATen's CPU math. Engines
// compute in fp32 (matmul accumulates fp32 in PSUM); the result is rounded to
// the destination's dtype as it is written.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <limits>
#include <sstream>
#include <unordered_map>

#include "nki/alu.h"
#include "nki/exec_util.h"
#include "nki/program.h"

namespace neuronx::nki {

namespace {

// Free axes of an on-chip view: all but the partition dim.
std::vector<int64_t> free_dims(const at::Tensor& t) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i < t.dim(); ++i) d.push_back(i);
  return d;
}

at::Tensor reduce(const std::string& op, const at::Tensor& x, at::IntArrayRef dims, bool keepdim) {
  switch (reduce_op(op)) {
    case Reduce::kAdd: return at::sum(x, dims, keepdim);
    case Reduce::kMax: return at::amax(x, dims, keepdim);
    case Reduce::kMin: return at::amin(x, dims, keepdim);
    case Reduce::kMul: {
      at::Tensor r = x;
      std::vector<int64_t> ds(dims.begin(), dims.end());
      std::sort(ds.rbegin(), ds.rend());
      for (int64_t d : ds) r = at::prod(r, d, keepdim);
      return r;
    }
    case Reduce::kAbsMax: return at::amax(x.abs(), dims, keepdim);
  }
  return x;
}

at::Tensor scalar_or(const at::Tensor& ap, bool is_ap, double v, const at::Tensor& like) {
  return is_ap ? per_partition(ap, like) : at::scalar_tensor(v, at::kFloat);
}

// A DMA whose HBM side is indexed per partition by values in an SBUF tile
// (data[idx[p], ...]). ints: indirect operand (0 dst, 1 src), index operand,
// element stride and size of the indexed dim, out-of-bounds skip, accumulate.
void copy_indirect(const Instruction& ins, const std::vector<at::Tensor>& v) {
  const int side = static_cast<int>(ins.ints[0]);
  const at::Tensor& ind = v[side];
  at::Tensor idx = v.at(ins.ints[1]).reshape({-1}).to(at::kLong);
  const int64_t stride = ins.ints[2], size = ins.ints[3];
  const bool skip = ins.ints[4] != 0, accumulate = ins.ints[5] != 0;
  const at::Tensor& other = v[1 - side];
  TORCH_CHECK(idx.numel() == ind.size(0), ins.name, ": ", idx.numel(), " indices for ", ind.size(0), " rows");
  auto* base = static_cast<uint8_t*>(ind.data_ptr());
  const int64_t item = static_cast<int64_t>(ind.element_size());
  auto* ip = idx.data_ptr<int64_t>();
  // A mask (over dst) leaves rows, or elements, alone: a row it masks off whole is not read, so
  // its index need not be in range.
  std::optional<at::Tensor> keep;
  if (ins.mask) keep = ins.mask->reshape({ins.mask->size(0), -1});
  for (int64_t p = 0; p < ind.size(0); ++p) {
    if (keep && !keep->select(0, p).any().item<bool>()) continue;
    if (ip[p] < 0 || ip[p] >= size) {
      if (skip) continue;
      // AWS's simulator words it as NumPy does for the flattened tensor
      TORCH_CHECK_INDEX(false, "index ", ip[p] * stride, " is out of bounds for axis 0 with size ", size * stride);
    }
    at::Tensor row = at::from_blob(base + ip[p] * stride * item, ind.sizes().slice(1), ind.strides().slice(1),
                                   ind.options());
    at::Tensor o = other.select(0, p);
    at::Tensor& dst = side == 0 ? row : o;
    at::Tensor value = side == 0 ? (accumulate ? f32(row) + f32(o) : o) : row;
    if (keep && !keep->select(0, p).all().item<bool>())
      value = at::where(keep->select(0, p).reshape(dst.sizes()), to_dtype(value, dst.scalar_type()), dst);
    store(dst, value);
  }
}

// The Scalar Engine computes an activation only on its documented input
// range; finite values outside it (in the written positions) are an error.
// NaN passes (it shows an uninitialised read in the result).
void check_activation_input(const Instruction& ins, const at::Tensor& x) {
  if (ins.name != "activation" && ins.name != "activation_reduce" && ins.name != "activate2") return;  // Scalar Engine
  double lo = 0, hi = 0;
  bool magnitude = false;
  if (!activation_range(ins.fns.at(0), lo, hi, magnitude)) return;
  at::Tensor a = magnitude ? x.abs() : x;
  at::Tensor bad = at::logical_and(at::isfinite(a), at::logical_or(a < lo, a > hi));
  if (ins.fns[0] == "sqrt") bad = at::logical_and(bad, a != 0);  // sqrt(0) = 0 exactly
  if (ins.mask) bad = at::logical_and(bad, ins.mask->reshape(bad.sizes()));
  if (!bad.any().item<bool>()) return;
  const double v = x.masked_select(bad)[0].item<double>();
  std::ostringstream msg;
  msg << ins.name << " " << ins.fns[0] << " input " << v << " is outside its valid range " << (magnitude ? "±" : "")
      << "[" << lo << ", " << hi << "]";
  TORCH_CHECK_VALUE(false, msg.str());
}

// An engine's accumulation registers under a reduce command (idle 0, reset 1,
// reduce 2, reset_reduce 3, load_reduce 4) given this instruction's (P, 1)
// reduction r: the value reduce_res receives. Idle leaves the registers alone
// (reduce_res then gets r itself, as an instruction without the registers).
at::Tensor accumulate(at::Tensor& reg, int64_t cmd, const std::string& op, const at::Tensor& r,
                      const at::Tensor& init) {
  const bool have = reg.defined() && reg.sizes() == r.sizes();
  switch (cmd) {
    case 1:
      reg = at::zeros_like(r);
      return reg;
    case 2:
      reg = have ? alu(op, reg, r) : r;
      return reg;
    case 3:
      reg = r;
      return reg;
    case 4:
      reg = alu(op, init.defined() ? init : at::zeros_like(r), r);
      return reg;
    default:
      return r;
  }
}

// nl.device_print: the values when the instruction runs, NumPy-style, long
// dims elided as "...".
void print_values(const Instruction& ins, const at::Tensor& x) {
  at::Tensor t = f32(x).reshape({x.size(0), -1}).cpu();
  const int64_t P = t.size(0), F = t.size(1);
  std::ostringstream out;
  out << ins.fns.at(0) << " " << x.sizes() << "\n[";
  auto row = [&](int64_t p) {
    out << "[";
    for (int64_t f = 0; f < F; ++f) {
      if (F > 12 && f == 6) {
        out << " ...";
        f = F - 6;
      }
      out << (f ? " " : "") << t[p][f].item<float>();
    }
    out << "]";
  };
  for (int64_t p = 0; p < P; ++p) {
    if (P > 8 && p == 4) {
      out << "\n ...";
      p = P - 4;
    }
    if (p) out << "\n ";
    row(p);
  }
  out << "]\n";
  std::fputs(out.str().c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace

void execute(const Instruction& ins, const std::vector<at::Tensor>& v, RunState& state) {
  if (ins.kind == Kind::kSeed) {  // nl.random_seed: later random instructions repeat for a seed
    state.seed = 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(ins.ints.at(0));
    return;
  }
  if (execute_gpsimd(ins, v) || execute_mx(ins, v) || execute_prng(ins, v, state)) return;
  if (ins.kind == Kind::kPrint) {
    print_values(ins, v[0]);
    return;
  }
  const uint64_t seed = state.seed;
  const at::Tensor& dst = v[0];
  switch (ins.kind) {
    case Kind::kFill:
      if (ins.mask || dst.scalar_type() == kNkiE4m3)
        write(ins, dst, at::full(dst.sizes(), ins.scalars[0], at::kFloat));
      else
        dst.fill_(ins.scalars[0]);
      return;
    case Kind::kConst:
      write(ins, dst, *ins.constant);
      return;
    case Kind::kCopy:
      if (ins.ints.size() >= 6) {
        copy_indirect(ins, v);
      } else if (!ins.ints.empty() && ins.ints[0]) {  // DMA read-modify-write: dst += src, in fp32
        write(ins, dst, f32(dst) + f32(v[1]));
      } else {
        write(ins, dst, v[1]);
      }
      return;
    case Kind::kMatmul: {
      // stationary (K, M...), moving (K, N...): dst (M, N) = stationaryᵀ · moving.
      at::Tensor s = f32(v[1]).reshape({v[1].size(0), -1});
      at::Tensor m = f32(v[2]).reshape({v[2].size(0), -1});
      if (!ins.mask && dst.scalar_type() == at::kFloat && dst.dim() == 2) {
        if (ins.ints.at(0))
          at::addmm_out(const_cast<at::Tensor&>(dst), dst, s.t(), m);  // PSUM accumulation in place
        else
          at::mm_out(const_cast<at::Tensor&>(dst), s.t(), m);
        return;
      }
      at::Tensor r = at::mm(s.t(), m);
      if (ins.ints.at(0)) r = r + f32(dst).reshape(r.sizes());
      write(ins, dst, r);
      return;
    }
    case Kind::kTranspose: {
      at::Tensor s = v[1].reshape({v[1].size(0), -1});
      write(ins, dst, s.t());
      return;
    }
    case Kind::kActivation: {
      // ops: dst, src, [bias], [scale], [reduce_res]; ints: has_bias, scale_is_ap, has_reduce.
      size_t k = 2;
      at::Tensor x = f32(v[1]);
      if (ins.ints.at(1)) {
        x = x * per_partition(v[k + ins.ints[0]], x);
      } else if (ins.scalars.at(0) != 1.0) {
        x = x * ins.scalars[0];
      }
      if (ins.ints.at(0)) x = x + per_partition(v[k], x);
      k += ins.ints[0] + ins.ints[1];
      check_activation_input(ins, x);
      at::Tensor y = activation(ins.fns.at(0), x, ins.scalars.size() > 1 ? ins.scalars[1] : 0.0);
      write(ins, dst, y);
      // ints[3]: reduce_cmd over the Scalar Engine's registers (3, reset_reduce, without it), or
      // the Vector Engine's (ints[4], Gen-2 exponential); ints[5]: a load_reduce start tile follows
      const int64_t cmd = ins.ints.size() > 3 ? ins.ints[3] : (ins.ints[2] ? 3 : 0);
      if (ins.ints[2] || cmd) {
        const std::string op = ins.fns.size() > 1 ? ins.fns[1] : "add";
        at::Tensor r = reduce(op, y, free_dims(y), true).reshape({y.size(0), 1});
        at::Tensor init;
        if (ins.ints.size() > 5 && ins.ints[5]) init = f32(v.at(k + ins.ints[2])).reshape(r.sizes());
        at::Tensor& regs = ins.ints.size() > 4 && ins.ints[4] ? state.vector_acc : state.scalar_acc;
        at::Tensor acc = accumulate(regs, cmd, op, r, init);
        if (ins.ints[2]) write(Instruction{ins.kind}, v[k], acc);
      }
      return;
    }
    case Kind::kTensorTensor:
      write(ins, dst, alu(ins.fns.at(0), v[1], v[2]));
      return;
    case Kind::kTensorScalar: {
      // ops: dst, src, [op0 AP], [op1 AP], [reduce_res]; ints: reverse0, reverse1, op0_is_ap, op1_is_ap, has_reduce.
      size_t k = 2;
      at::Tensor x = v[1];
      at::Tensor s0 = scalar_or(ins.ints[2] ? v[k] : at::Tensor(), ins.ints[2], ins.scalars[0], x);
      k += ins.ints[2];
      at::Tensor r = ins.ints[0] ? alu(ins.fns[0], s0, x) : alu(ins.fns[0], x, s0);
      if (!ins.fns.at(1).empty()) {
        at::Tensor s1 = scalar_or(ins.ints[3] ? v[k] : at::Tensor(), ins.ints[3], ins.scalars[1], x);
        r = ins.ints[1] ? alu(ins.fns[1], s1, r) : alu(ins.fns[1], r, s1);
      }
      k += ins.ints[3];
      write(ins, dst, r);
      // ints[5..7]: reduce_cmd over the Vector Engine's registers, reduce_res_negate, reduce_init is a tile
      const int64_t cmd = ins.ints.size() > 5 ? ins.ints[5] : (ins.ints.at(4) ? 3 : 0);
      if (ins.ints.at(4) || cmd) {
        const std::string& op = ins.fns.at(2);
        at::Tensor red = reduce(op, r, free_dims(r), true).reshape({r.size(0), 1});
        at::Tensor init;
        if (cmd == 4)
          init = ins.ints.size() > 7 && ins.ints[7] ? per_partition(v[k + ins.ints[4]], red).reshape(red.sizes())
                                                     : at::full_like(red, ins.scalars.at(2));
        at::Tensor acc = accumulate(state.vector_acc, cmd, op, red, init);
        if (ins.ints.size() > 6 && ins.ints[6]) acc = -acc;
        if (ins.ints[4]) write(Instruction{ins.kind}, v[k], acc);
      }
      return;
    }
    case Kind::kScalarTensorTensor: {
      // ops: dst, data, data1, [scalar AP]; ints: scalar_is_ap, reverse0, reverse1.
      at::Tensor s = scalar_or(ins.ints[0] ? v[3] : at::Tensor(), ins.ints[0], ins.scalars[0], v[1]);
      at::Tensor r = ins.ints[1] ? alu(ins.fns[0], s, v[1]) : alu(ins.fns[0], v[1], s);
      r = ins.ints[2] ? alu(ins.fns[1], v[2], r) : alu(ins.fns[1], r, v[2]);
      write(ins, dst, r);
      return;
    }
    case Kind::kReduce: {
      // ints: negate, then the reduced axes of src.
      std::vector<int64_t> axes(ins.ints.begin() + 1, ins.ints.end());
      at::Tensor r = reduce(ins.fns.at(0), f32(v[1]), axes, true);
      if (ins.ints[0]) r = -r;
      write(ins, dst, r);
      return;
    }
    case Kind::kPartitionReduce:
      write(ins, dst, reduce(ins.fns.at(0), f32(v[1]), {0}, true));
      return;
    case Kind::kSelect:
      write(ins, dst, at::where(*ins.constant, f32(v[1]), at::scalar_tensor(ins.scalars.at(0), at::kFloat)));
      return;
    case Kind::kWhere: {
      // ops: dst, cond, [a], [b]; ints: a_is_ap, b_is_ap; scalars: a, b.
      size_t k = 2;
      at::Tensor a = ins.ints[0] ? f32(v[k++]) : at::scalar_tensor(ins.scalars[0], at::kFloat);
      at::Tensor b = ins.ints[1] ? f32(v[k]) : at::scalar_tensor(ins.scalars[1], at::kFloat);
      write(ins, dst, at::where(v[1].to(at::kBool), a, b));
      return;
    }
    case Kind::kBnStats: {
      // Per partition, for the even and the odd free elements: count, mean, variance x count.
      at::Tensor x = f32(v[1]).reshape({v[1].size(0), -1});
      std::vector<at::Tensor> parts;
      for (int64_t start : {0, 1}) {
        at::Tensor h = x.slice(1, start, x.size(1), 2);
        const double n = static_cast<double>(h.size(1));
        at::Tensor mean = n > 0 ? h.mean(1, true) : at::zeros({x.size(0), 1}, x.options());
        at::Tensor m2 = n > 0 ? (h - mean).square().sum(1, true) : at::zeros({x.size(0), 1}, x.options());
        parts.push_back(at::full_like(mean, n));
        parts.push_back(mean);
        parts.push_back(m2);
      }
      write(ins, dst, at::cat(parts, 1));
      return;
    }
    case Kind::kBnAggr: {
      // Chan's combination of (count, mean, variance x count) triples into mean, variance.
      at::Tensor s = f32(v[1]).reshape({v[1].size(0), -1, 3});
      at::Tensor n = s.select(2, 0), mean = s.select(2, 1), m2 = s.select(2, 2);
      at::Tensor total = n.sum(1, true);
      at::Tensor m = (n * mean).sum(1, true) / total;
      at::Tensor var = (m2 + n * (mean - m).square()).sum(1, true) / total;
      write(ins, dst, at::cat({m, var}, 1));
      return;
    }
    case Kind::kScan: {
      // ops: dst, data0, data1, [initial AP]; along the last free dim.
      at::Tensor a = f32(v[1]), b = f32(v[2]);
      const int64_t last = a.dim() - 1;
      at::Tensor acc = ins.ints.at(0) ? per_partition(v[3], a.select(last, 0).unsqueeze(last)).squeeze(last)
                                      : at::full_like(a.select(last, 0), ins.scalars.at(0));
      at::Tensor out = at::empty_like(a);
      for (int64_t i = 0; i < a.size(last); ++i) {
        acc = alu(ins.fns[1], alu(ins.fns[0], acc, a.select(last, i)), b.select(last, i));
        out.select(last, i).copy_(acc);
      }
      write(ins, dst, out);
      return;
    }
    case Kind::kCumulative: {
      // ops: dst, src, [imm0 AP], [imm1 AP]; ints: imm0_is_ap, imm1_is_ap, reduce_cmd
      // (reset_reduce 3: start from op1's identity, load_reduce 4: from imm1, reduce 2: from the register).
      at::Tensor x = f32(v[1]).reshape({v[1].size(0), -1});
      size_t k = 2;
      at::Tensor imm0 = ins.ints[0] ? per_partition(v[k++], x) : at::scalar_tensor(ins.scalars.at(0), at::kFloat);
      at::Tensor t = alu(ins.fns.at(0), x, imm0);
      const std::string& op1 = ins.fns.at(1);
      at::Tensor acc;
      const int64_t cmd = ins.ints.at(2);
      if (cmd == 4) {
        acc = ins.ints[1] ? per_partition(v[k], x).reshape({x.size(0), 1})
                          : at::full({x.size(0), 1}, ins.scalars.at(1), x.options());
      } else if (cmd == 2 && state.vector_acc.defined() && state.vector_acc.size(0) == x.size(0)) {
        acc = state.vector_acc;
      } else {
        const double id = op1 == "add" ? 0.0 : op1 == "multiply" ? 1.0 : op1 == "maximum"
            ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
        acc = at::full({x.size(0), 1}, id, x.options());
      }
      at::Tensor out = at::empty_like(t);
      for (int64_t i = 0; i < t.size(1); ++i) {
        acc = alu(op1, acc, t.narrow(1, i, 1));
        out.narrow(1, i, 1).copy_(acc);
      }
      state.vector_acc = acc;
      write(ins, dst, out);
      return;
    }
    case Kind::kRandom: {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(seed ^ static_cast<uint64_t>(ins.ints.at(0)));
      write(ins, dst, at::rand(dst.sizes(), gen, at::TensorOptions().dtype(at::kFloat)));
      return;
    }
  }
}

}  // namespace neuronx::nki
