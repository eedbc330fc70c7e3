// The hardware limits every instruction is checked against before it is
// issued (as the compiler and AWS's simulator check them), with messages in
// the simulator's form: "<instruction> <operand> <what> <value> exceeds maximum <limit>".
#include <c10/core/ScalarType.h>

#include <stdexcept>
#include <string>

#include "nki/alu.h"
#include "nki/program.h"

namespace neuronx::nki {

namespace {

[[noreturn]] void fail(const Instruction& ins, const std::string& msg) {
  throw std::invalid_argument(ins.name + " " + msg);
}

void check_max(const Instruction& ins, const Access& a, const char* what, int64_t v, int64_t limit) {
  if (v > limit)
    fail(ins, a.role + " " + what + " " + std::to_string(v) + " exceeds maximum " + std::to_string(limit));
}

int64_t free_size(const Access& a) {
  int64_t n = 1;
  for (size_t i = 1; i < a.sizes.size(); ++i) n *= a.sizes[i];
  return n;
}

void require_space(const Instruction& ins, const Access& a, Space s) {
  if (a.space() != s)
    fail(ins, a.role + " must be in " + space_name(s) + ", got a tensor in " + space_name(a.space()));
}

void require_on_chip(const Instruction& ins, const Access& a) {
  if (!a.on_chip())
    fail(ins, a.role + " must be in SBUF or PSUM, got an HBM tensor (load it into SBUF first)");
}

void same_partitions(const Instruction& ins, const Access& a, const Access& b) {
  if (a.sizes.at(0) != b.sizes.at(0))
    fail(ins, a.role + " and " + b.role + " must have the same partition dimension, got " +
                  std::to_string(a.sizes[0]) + " and " + std::to_string(b.sizes[0]));
}

void same_elements(const Instruction& ins, const Access& a, const Access& b) {
  same_partitions(ins, a, b);
  if (free_size(a) != free_size(b))
    fail(ins, a.role + " and " + b.role + " must have the same number of elements per partition, got " +
                  std::to_string(free_size(a)) + " and " + std::to_string(free_size(b)));
}

void check_fn(const Instruction& ins, const std::string& fn, bool ok, const char* kind, const std::string& list) {
  if (!ok) fail(ins, "'" + fn + "' is not " + kind + " (supported: " + list + ")");
}

bool is_fp32(at::ScalarType t) { return t == at::kFloat; }

}  // namespace

namespace {
void check_kind(const Instruction& ins, const Target& t);
}  // namespace

void check_instruction(const Instruction& ins, const Target& t) {
  for (const Access& a : ins.ops) {
    if (a.sizes.size() != a.strides.size()) fail(ins, a.role + " has mismatched sizes and strides");
    if (a.on_chip() && a.sizes.size() < 2)
      fail(ins, a.role + ": SBUF and PSUM tensors must have at least 2 dimensions (partition-dim and free-dim)");
  }
  if (ins.ops.empty()) {
    if (ins.kind != Kind::kSeed && ins.kind != Kind::kRegister && ins.kind != Kind::kPrng && ins.kind != Kind::kLoopBegin &&
        ins.kind != Kind::kLoopEnd)
      fail(ins, "has no destination");
    return;
  }
  if (ins.mask && ins.mask->sizes() != at::IntArrayRef(ins.ops.at(0).sizes))
    fail(ins, "mask shape does not match the destination's shape");
  // The instruction's own limits first: they name the operand a result's shape comes from.
  check_kind(ins, t);
  for (size_t i = 1; i <= ins.ops.size(); ++i) {  // sources before the destination
    const Access& a = ins.ops[i % ins.ops.size()];
    if (a.on_chip()) check_max(ins, a, "partition dimension", a.sizes[0], t.partitions);
  }
}

namespace {

void check_kind(const Instruction& ins, const Target& t) {
  switch (ins.kind) {
    case Kind::kMatmul: {
      const Access &dst = ins.ops.at(0), &st = ins.ops.at(1), &mv = ins.ops.at(2);
      require_space(ins, dst, Space::kPsum);
      require_on_chip(ins, st);
      require_on_chip(ins, mv);
      if (st.space() == Space::kPsum || mv.space() == Space::kPsum)
        fail(ins, "operands must be in SBUF; PSUM is only the matmul's output");
      same_partitions(ins, st, mv);
      check_max(ins, st, "free dimension", free_size(st), t.gemm_stationary_fmax);
      check_max(ins, mv, "free dimension", free_size(mv), t.gemm_moving_fmax);
      if (dst.sizes.at(0) != free_size(st) || free_size(dst) != free_size(mv))
        fail(ins, "dst shape (" + std::to_string(dst.sizes[0]) + ", " + std::to_string(free_size(dst)) +
                      ") must be (stationary free " + std::to_string(free_size(st)) + ", moving free " +
                      std::to_string(free_size(mv)) + ")");
      if (is_fp32(st.dtype) != is_fp32(mv.dtype))
        fail(ins, std::string("fp32 operands pair only with fp32: stationary is ") + c10::toString(st.dtype) +
                      ", moving is " + c10::toString(mv.dtype));
      return;
    }
    case Kind::kTranspose: {
      const Access &dst = ins.ops.at(0), &src = ins.ops.at(1);
      require_on_chip(ins, src);
      const bool tensor_engine = ins.ints.at(0) == 0;
      const int64_t limit = tensor_engine ? t.partitions : 32;
      check_max(ins, src, "partition dimension", src.sizes[0], limit);
      check_max(ins, src, "free dimension", free_size(src), limit);
      if (tensor_engine) require_space(ins, dst, Space::kPsum);
      if (dst.sizes.at(0) != free_size(src) || free_size(dst) != src.sizes[0])
        fail(ins, "dst must be the transpose of data: (" + std::to_string(free_size(src)) + ", " +
                      std::to_string(src.sizes[0]) + ")");
      return;
    }
    case Kind::kTensorTensor: {
      const Access &dst = ins.ops.at(0), &a = ins.ops.at(1), &b = ins.ops.at(2);
      check_fn(ins, ins.fns.at(0), is_alu_op(ins.fns[0]), "an ALU operator", alu_op_names());
      require_on_chip(ins, a);
      require_on_chip(ins, b);
      same_elements(ins, a, b);
      same_elements(ins, dst, a);
      const bool psum_accumulate = !ins.ints.empty() && ins.ints[0];  // psum += matmul: the PE accumulates
      if (a.space() == Space::kPsum && b.space() == Space::kPsum && !psum_accumulate)
        fail(ins, a.role + " and " + b.role + " cannot both be in PSUM");
      return;
    }
    case Kind::kActivation:
      check_fn(ins, ins.fns.at(0), is_activation(ins.fns[0]), "an activation function", activation_names());
      require_on_chip(ins, ins.ops.at(1));
      same_elements(ins, ins.ops.at(0), ins.ops.at(1));
      for (size_t i = 2; i < ins.ops.size(); ++i) {
        same_partitions(ins, ins.ops[i], ins.ops[1]);
        if (free_size(ins.ops[i]) != 1)
          fail(ins, ins.ops[i].role + " must have one element per partition (shape (" +
                        std::to_string(ins.ops[1].sizes[0]) + ", 1)), got " + std::to_string(free_size(ins.ops[i])));
      }
      return;
    case Kind::kTensorScalar:
    case Kind::kScalarTensorTensor:
      for (const std::string& fn : ins.fns)
        if (!fn.empty() && !(ins.kind == Kind::kTensorScalar && &fn == &ins.fns.back() && is_reduce_op(fn)))
          check_fn(ins, fn, is_alu_op(fn), "an ALU operator", alu_op_names());
      require_on_chip(ins, ins.ops.at(1));
      same_elements(ins, ins.ops.at(0), ins.ops.at(1));
      if (ins.kind == Kind::kScalarTensorTensor) same_elements(ins, ins.ops.at(1), ins.ops.at(2));
      return;
    case Kind::kReduce:
      check_fn(ins, ins.fns.at(0), is_reduce_op(ins.fns[0]), "a reduce operator", "add, maximum, minimum, multiply");
      require_on_chip(ins, ins.ops.at(1));
      for (size_t i = 1; i < ins.ints.size(); ++i)
        if (ins.ints[i] == 0) fail(ins, "cannot reduce along the partition dimension (axis 0); use tensor_partition_reduce or a transpose");
      if (ins.ints.size() - 1 > 4) fail(ins, "reduces at most 4 free axes");
      same_partitions(ins, ins.ops.at(0), ins.ops.at(1));
      return;
    case Kind::kPartitionReduce:
      check_fn(ins, ins.fns.at(0), is_reduce_op(ins.fns[0]), "a reduce operator", "add, maximum, minimum, multiply");
      return;
    case Kind::kBnStats: {
      const Access& src = ins.ops.at(1);
      require_on_chip(ins, src);
      check_max(ins, src, "free dimension", free_size(src), t.bn_stats_fmax);
      return;
    }
    case Kind::kMax8: {
      const Access& src = ins.ops.at(1);
      require_on_chip(ins, src);
      if (free_size(src) < 8 || free_size(src) > 16384)
        fail(ins, src.role + " must have 8 to 16384 elements per partition, got " + std::to_string(free_size(src)));
      return;
    }
    case Kind::kMatchReplace8: {
      const Access &dst = ins.ops.at(0), &data = ins.ops.at(1), &vals = ins.ops.at(2);
      require_on_chip(ins, data);
      same_elements(ins, dst, data);
      same_partitions(ins, vals, data);
      if (free_size(vals) != 8) fail(ins, vals.role + " must hold 8 values per partition, got " + std::to_string(free_size(vals)));
      if (ins.ops.size() > 3) {
        same_partitions(ins, ins.ops[3], data);
        if (free_size(ins.ops[3]) != 8)
          fail(ins, ins.ops[3].role + " must hold 8 indices per partition, got " + std::to_string(free_size(ins.ops[3])));
      }
      if (free_size(data) < 8 || free_size(data) > 16384)
        fail(ins, data.role + " must have 8 to 16384 elements per partition, got " + std::to_string(free_size(data)));
      return;
    }
    case Kind::kShuffle: {
      const Access &dst = ins.ops.at(0), &src = ins.ops.at(1);
      require_on_chip(ins, src);
      require_on_chip(ins, dst);
      if (free_size(dst) != free_size(src))
        fail(ins, "dst and src must have the same number of elements per partition, got " +
                      std::to_string(free_size(dst)) + " and " + std::to_string(free_size(src)));
      if (ins.ints.size() != 32) fail(ins, "shuffle_mask must have 32 entries, got " + std::to_string(ins.ints.size()));
      for (int64_t m : ins.ints)
        if ((m < 0 || m >= 32) && m != 255)
          fail(ins, "shuffle_mask entries are source partitions in [0, 32) of the quadrant or 255 (skip), got " +
                        std::to_string(m));
      return;
    }
    case Kind::kSequenceBounds: {
      const Access &dst = ins.ops.at(0), &src = ins.ops.at(1);
      require_on_chip(ins, src);
      same_partitions(ins, dst, src);
      if (free_size(dst) != 2 * free_size(src))
        fail(ins, "dst must hold 2 bounds per segment id (shape (P, 2, " + std::to_string(free_size(src)) + "))");
      return;
    }
    case Kind::kLocalGather: {
      const Access &dst = ins.ops.at(0), &src = ins.ops.at(1), &index = ins.ops.at(2);
      require_space(ins, src, Space::kSbuf);
      require_space(ins, index, Space::kSbuf);
      same_partitions(ins, src, index);
      same_partitions(ins, dst, src);
      if (src.sizes[0] % 16) fail(ins, src.role + " partition dimension " + std::to_string(src.sizes[0]) + " must be a multiple of 16");
      const int64_t ne = ins.ints.at(0), nv = ins.ints.at(1);
      if (ne != 1 && ne != 2 && ne != 4 && ne != 8 && ne != 16 && ne != 32)
        fail(ins, "num_elem_per_idx must be one of 1, 2, 4, 8, 16, 32, got " + std::to_string(ne));
      const int64_t per_core = 16 * free_size(index);
      if (nv < 0 || nv > per_core)
        fail(ins, "num_valid_indices " + std::to_string(nv) + " exceeds the " + std::to_string(per_core) +
                      " indices of a core's 16 index partitions");
      check_max(ins, index, "indices per core", nv, 4096);
      if (free_size(dst) != nv * ne)
        fail(ins, "dst must hold num_valid_indices * num_elem_per_idx = " + std::to_string(nv * ne) +
                      " elements per partition, got " + std::to_string(free_size(dst)));
      return;
    }
    case Kind::kNonzero: {
      const Access &dst = ins.ops.at(0), &src = ins.ops.at(1);
      require_space(ins, src, Space::kSbuf);
      require_space(ins, dst, Space::kSbuf);
      same_partitions(ins, dst, src);
      if (free_size(dst) != free_size(src) + 1)
        fail(ins, "dst must have one element more per partition than src (the count), got " +
                      std::to_string(free_size(dst)) + " and " + std::to_string(free_size(src)));
      if (dst.dtype != at::kInt) fail(ins, std::string("dst must be int32, got ") + c10::toString(dst.dtype));
      return;
    }
    case Kind::kCopy: {
      const Access &dst = ins.ops.at(0), &src = ins.ops.at(1);
      if (dst.numel() != src.numel())
        fail(ins, "dst and src must have the same number of elements, got " + std::to_string(dst.numel()) + " and " +
                      std::to_string(src.numel()));
      return;
    }
    default:
      return;
  }
}

}  // namespace

}  // namespace neuronx::nki
