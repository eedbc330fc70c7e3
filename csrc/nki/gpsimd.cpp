// The selection and data-movement instructions of the GpSimd/Vector engines
// that do not fit the elementwise ALU model: top-8 search and replacement,
// gathers within a partition or a 16-partition core, partition shuffles
// within 32-partition quadrants, and segment bounds.
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "nki/exec_util.h"

namespace neuronx::nki {

namespace {

at::Tensor rows(const at::Tensor& t) { return t.reshape({t.size(0), -1}); }

// Per partition, for each of the 8 values in turn: the first element equal to
// it that an earlier value has not taken is replaced by imm (its index in idx,
// -1 when there is none).
void match_replace8(const Instruction& ins, const std::vector<at::Tensor>& v) {
  at::Tensor x = f32(rows(v[1])).clone();
  at::Tensor vals = f32(rows(v[2]));
  at::Tensor taken = at::zeros_like(x, x.options().dtype(at::kBool));
  at::Tensor idx = at::empty({x.size(0), 8}, x.options().dtype(at::kLong));
  const double imm = ins.scalars.at(0);
  for (int64_t k = 0; k < 8; ++k) {
    at::Tensor eq = at::eq(x, vals.narrow(1, k, 1)).logical_and_(taken.logical_not());
    at::Tensor found = eq.any(1, true);
    at::Tensor i = at::argmax(eq.to(at::kByte), 1, true);
    taken.scatter_(1, i, found.logical_or(taken.gather(1, i)));
    x.scatter_(1, i, at::where(found, at::scalar_tensor(imm, x.options()), x.gather(1, i)));
    idx.narrow(1, k, 1).copy_(at::where(found, i, at::full_like(i, -1)));
  }
  write(ins, v[0], x);
  if (ins.ints.at(0)) v[3].copy_(idx.reshape(v[3].sizes()).to(at::kFloat));
}

// dst partition q*32 + i takes src partition q*32 + mask[i] (255: left as is).
void stream_shuffle(const Instruction& ins, const std::vector<at::Tensor>& v) {
  const at::Tensor& dst = v[0];
  at::Tensor src = rows(v[1]);
  const int64_t P = dst.size(0);
  std::vector<int64_t> to, from;
  for (int64_t p = 0; p < P; ++p) {
    const int64_t m = ins.ints.at(p % 32);
    if (m == 255) continue;
    const int64_t s = p / 32 * 32 + m;
    TORCH_CHECK_INDEX(s < src.size(0), ins.name, ": destination partition ", p, " takes source partition ", s,
                      " but src has ", src.size(0), " partitions");
    to.push_back(p);
    from.push_back(s);
  }
  if (to.empty()) return;
  at::Tensor out = f32(rows(dst)).clone();  // the sources are read before any partition is written
  auto opts = at::TensorOptions().dtype(at::kLong);
  out.index_copy_(0, at::tensor(to, opts), f32(src).index_select(0, at::tensor(from, opts)));
  write(ins, dst, out);
}

// Per partition, over a row of segment ids (0 is padding): each element's
// segment start (padding: n) and end, exclusive (padding: -1). dst is (P, 2, n).
void sequence_bounds(const Instruction& ins, const std::vector<at::Tensor>& v) {
  at::Tensor s = f32(rows(v[1]));
  const int64_t n = s.size(1);
  at::Tensor pos = at::arange(n, s.options()).unsqueeze(0).expand_as(s);
  at::Tensor first = at::arange(n, s.options().dtype(at::kLong)).eq(0).unsqueeze(0);
  at::Tensor last = at::arange(n, s.options().dtype(at::kLong)).eq(n - 1).unsqueeze(0);
  at::Tensor starts = at::logical_or(first, at::ne(s, s.roll(1, 1)));
  at::Tensor ends = at::logical_or(last, at::ne(s, s.roll(-1, 1)));
  at::Tensor start = std::get<0>(at::cummax(at::where(starts, pos, at::zeros_like(pos)), 1));
  at::Tensor end = std::get<0>(at::cummin(at::where(ends, pos + 1, at::full_like(pos, n + 1)).flip(1), 1)).flip(1);
  at::Tensor pad = s.eq(0);
  start = at::where(pad, at::full_like(start, n), start);
  end = at::where(pad, at::full_like(end, -1), end);
  write(ins, v[0], at::stack({start, end}, 1));
}

// Each 16-partition GpSimd core gathers, for each of its indices (taken from
// its 16 index partitions, partition dim first), num_elem consecutive elements
// at that element offset of every one of its partitions.
void local_gather(const Instruction& ins, const std::vector<at::Tensor>& v) {
  at::Tensor src = rows(v[1]);
  at::Tensor index = rows(v[2]).to(at::kLong);
  const int64_t ne = ins.ints.at(0), nv = ins.ints.at(1), F = src.size(1);
  std::vector<at::Tensor> out;
  for (int64_t c = 0; c < src.size(0) / 16; ++c) {
    at::Tensor idx = index.narrow(0, c * 16, 16).t().reshape(-1).narrow(0, 0, nv);
    at::Tensor offs = (idx.unsqueeze(1) + at::arange(ne, idx.options())).reshape(-1);
    if (offs.numel()) {
      const int64_t lo = offs.min().item<int64_t>(), hi = offs.max().item<int64_t>();
      TORCH_CHECK_INDEX(lo >= 0 && hi < F, ins.name, ": core ", c, " reads element ", lo < 0 ? lo : hi,
                        " of src_buffer, which has ", F, " elements per partition");
    }
    out.push_back(src.narrow(0, c * 16, 16).index_select(1, offs));
  }
  write(ins, v[0], at::cat(out, 0));
}

// Each GpSimd core's first partition (0, 16, ..., 112): the indices of the
// nonzero elements (+ index_offset), then padding, then their count; the
// other partitions of dst are left as they are.
void nonzero_with_count(const Instruction& ins, const std::vector<at::Tensor>& v) {
  at::Tensor src = rows(v[1]).slice(0, 0, v[1].size(0), 16);
  at::Tensor dst = rows(v[0]).slice(0, 0, v[0].size(0), 16);
  const int64_t T = src.size(1);
  at::Tensor nz = f32(src).ne(0);
  at::Tensor count = nz.sum(1, true);
  at::Tensor order = std::get<1>(at::sort(nz.logical_not().to(at::kByte), std::optional<bool>(true), 1, false));
  at::Tensor pos = at::arange(T, count.options()).unsqueeze(0);
  at::Tensor idx = at::where(pos < count, order + ins.ints.at(0), at::full_like(order, ins.ints.at(1)));
  dst.copy_(at::cat({idx, count}, 1));
}

}  // namespace

bool execute_gpsimd(const Instruction& ins, const std::vector<at::Tensor>& v) {
  const at::Tensor& dst = v[0];
  switch (ins.kind) {
    case Kind::kMax8:
      write(ins, dst, std::get<0>(at::topk(f32(rows(v[1])), 8, 1, true, true)));
      return true;
    case Kind::kFindIndex8: {
      at::Tensor data = f32(v[1]).reshape({v[1].size(0), 1, -1});
      at::Tensor vals = f32(v[2]).reshape({v[2].size(0), -1, 1});
      at::Tensor eq = at::eq(data, vals);  // (P, 8, F)
      at::Tensor idx = at::argmax(eq.to(at::kByte), 2);  // first true (0 if none)
      write(ins, dst, at::where(eq.any(2), idx, at::full_like(idx, -1)).to(at::kFloat));
      return true;
    }
    case Kind::kGather: {
      at::Tensor data = rows(v[1]);
      at::Tensor idx = rows(v[2]).to(at::kLong);
      const int64_t n = data.size(1);
      TORCH_CHECK(idx.numel() == 0 || (idx.min().item<int64_t>() >= 0 && idx.max().item<int64_t>() < n),
                  ins.name, ": an index is outside [0, ", n, ") of the data's free elements");
      // moves elements without arithmetic: on their bits (ATen's gather lacks some dtypes, e.g. uint32)
      const at::ScalarType as_bits[] = {at::kByte, at::kShort, at::kInt, at::kInt, at::kLong};
      const at::ScalarType bits = as_bits[std::min<int64_t>(data.element_size(), 8) / 2];
      write(ins, dst, at::gather(data.view(bits), 1, idx).view(data.scalar_type()));
      return true;
    }
    case Kind::kMatchReplace8:
      match_replace8(ins, v);
      return true;
    case Kind::kShuffle:
      stream_shuffle(ins, v);
      return true;
    case Kind::kSequenceBounds:
      sequence_bounds(ins, v);
      return true;
    case Kind::kLocalGather:
      local_gather(ins, v);
      return true;
    case Kind::kNonzero:
      nonzero_with_count(ins, v);
      return true;
    default:
      return false;
  }
}

}  // namespace neuronx::nki
