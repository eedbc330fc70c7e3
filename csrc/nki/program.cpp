#include "nki/program.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace neuronx::nki {

int64_t Access::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

Program::Program(int64_t num_args) : num_args_(num_args) {}

void Program::set_cores(int n) {
  TORCH_CHECK(!finalized_ && n >= 1, "NKI program: set_cores(", n, ") after placement or below 1");
  cores_ = n;
}

int Program::allocate(Space space, at::ScalarType dtype, int64_t partitions, int64_t blocks, int64_t free_elems,
                      const std::string& what, int core) {
  TORCH_CHECK(!finalized_, "NKI program: allocation after the kernel was placed");
  const Target& t = target();
  if (partitions > t.partitions)
    throw std::invalid_argument(std::string(space_name(space)) + " tensor " + what + " partition dimension " +
                                std::to_string(partitions) + " exceeds maximum " + std::to_string(t.partitions));
  const int64_t item = static_cast<int64_t>(c10::elementSize(dtype));
  const int64_t block_bytes = free_elems * item;
  if (space == Space::kPsum && block_bytes > t.psum_bank_bytes)
    throw std::invalid_argument("PSUM tensor " + what + " needs " + std::to_string(block_bytes) +
                                " bytes per partition; a PSUM tile must fit one " +
                                std::to_string(t.psum_bank_bytes) + "-byte bank (at most " +
                                std::to_string(t.psum_bank_bytes / 4) + " fp32 per partition)");
  // PSUM blocks start on bank boundaries (a matmul accumulates into one bank).
  const int64_t stride = space == Space::kPsum ? t.psum_bank_bytes : block_bytes;
  Tile tile{space, blocks * stride, static_cast<int64_t>(code_.size()), static_cast<int64_t>(code_.size()), what};
  tile.core = core;
  tiles_.push_back(tile);
  const int id = static_cast<int>(tiles_.size() - 1);
  // New tiles hold garbage on hardware: NaN (floats) or a sentinel (ints)
  // makes a read of never-written memory visible in results.
  const int64_t partition_bytes = space == Space::kPsum ? t.psum_partition_bytes : t.sbuf_partition_bytes;
  for (int64_t b = 0; b < blocks; ++b) {
    Instruction fill{Kind::kFill, "<allocate>"};
    Access& d = fill.ops.emplace_back();
    d.buffer = space == Space::kPsum ? kPsumBuffer : kSbufBuffer;
    d.tile = id;
    d.dtype = dtype;
    d.byte_offset = b * stride;
    d.sizes = {partitions, free_elems};
    d.strides = {partition_bytes / item, 1};
    d.role = what;
    fill.scalars = {c10::isFloatingType(dtype) ? std::numeric_limits<double>::quiet_NaN() : 4.0};
    code_.push_back(std::move(fill));
  }
  return id;
}

int Program::allocate_at(Space space, at::ScalarType dtype, int64_t partitions, int64_t free_elems,
                         const std::vector<std::pair<int64_t, int64_t>>& blocks, const std::string& what, int core) {
  TORCH_CHECK(!finalized_, "NKI program: allocation after the kernel was placed");
  const Target& t = target();
  const int64_t item = static_cast<int64_t>(c10::elementSize(dtype));
  const int64_t bytes = free_elems * item;
  const int64_t partition_bytes = space == Space::kPsum ? t.psum_partition_bytes : t.sbuf_partition_bytes;
  Tile tile{space, bytes, static_cast<int64_t>(code_.size()), static_cast<int64_t>(code_.size()), what, 0};
  tile.pinned = true;
  tile.core = core;
  const int id = static_cast<int>(tiles_.size());
  for (size_t b = 0; b < blocks.size(); ++b) {
    const auto [part, addr] = blocks[b];
    const std::string at = std::string(space_name(space)) + " tensor " + what +
                           (blocks.size() > 1 ? " block " + std::to_string(b) : std::string()) + " placed at partition " +
                           std::to_string(part) + ", byte " + std::to_string(addr);
    if (part < 0 || part + partitions > t.partitions)
      throw std::invalid_argument(at + ": partitions [" + std::to_string(part) + ", " +
                                  std::to_string(part + partitions) + ") exceed the " +
                                  std::to_string(t.partitions) + " partitions");
    if (addr < 0 || addr + bytes > partition_bytes)
      throw std::invalid_argument(at + ": bytes [" + std::to_string(addr) + ", " + std::to_string(addr + bytes) +
                                  ") exceed the " + std::to_string(partition_bytes) + " bytes of a partition");
    if (space == Space::kPsum && addr / t.psum_bank_bytes != (addr + bytes - 1) / t.psum_bank_bytes)
      throw std::invalid_argument(at + ": " + std::to_string(bytes) + " bytes cross a " +
                                  std::to_string(t.psum_bank_bytes) + "-byte PSUM bank boundary");
    if (addr % item)
      throw std::invalid_argument(at + ": the address is not a multiple of the " + std::to_string(item) +
                                  "-byte element");
    tile.reserved.emplace_back(addr, addr + bytes);
    Instruction fill{Kind::kFill, "<allocate>"};
    Access& d = fill.ops.emplace_back();
    d.buffer = space == Space::kPsum ? kPsumBuffer : kSbufBuffer;
    d.tile = id;
    d.dtype = dtype;
    d.byte_offset = part * partition_bytes + addr;
    d.sizes = {partitions, free_elems};
    d.strides = {partition_bytes / item, 1};
    d.role = what;
    fill.scalars = {c10::isFloatingType(dtype) ? std::numeric_limits<double>::quiet_NaN() : 4.0};
    code_.push_back(std::move(fill));
  }
  tiles_.push_back(std::move(tile));
  return id;
}

namespace {

// Whether instruction `next` writes every element `fill` covers without reading them first.
bool overwrites_whole(const Instruction& next, const Access& f) {
  if (next.ops.empty()) return false;
  const Access& d = next.ops[0];
  // Instructions that write every element of dst from their sources alone (an indirect copy may
  // skip rows, an accumulating copy or matmul reads dst; shuffles, gathers and the like may leave
  // elements unwritten).
  bool writes_all = false;
  switch (next.kind) {
    case Kind::kFill:
    case Kind::kConst:
    case Kind::kTranspose:
    case Kind::kActivation:
    case Kind::kTensorTensor:
    case Kind::kTensorScalar:
    case Kind::kScalarTensorTensor:
    case Kind::kReduce:
    case Kind::kPartitionReduce:
    case Kind::kSelect:
    case Kind::kWhere:
    case Kind::kRandom: writes_all = true; break;
    case Kind::kCopy: writes_all = next.ints.empty(); break;
    case Kind::kMatmul: writes_all = !next.ints.empty() && next.ints[0] == 0; break;
    default: break;
  }
  bool whole = writes_all && !next.mask && d.dynamic.empty() && d.tile == f.tile &&
               d.byte_offset == f.byte_offset && d.dtype == f.dtype && d.sizes == f.sizes && d.strides == f.strides;
  for (size_t k = 1; whole && k < next.ops.size(); ++k) whole = next.ops[k].tile != f.tile;
  for (const Access& s : next.dyn_srcs) whole = whole && s.tile != f.tile;
  return whole;
}

bool elementwise(const Instruction& ins) {
  switch (ins.kind) {
    case Kind::kCopy: return ins.ints.empty() || (ins.ints.size() < 6 && ins.ints[0] == 0);
    case Kind::kActivation:
    case Kind::kTensorTensor:
    case Kind::kTensorScalar:
    case Kind::kScalarTensorTensor: return true;
    default: return false;
  }
}

}  // namespace

// An elementwise instruction that makes a tile from a source dying there may write its result over
// that source (the engines stream element by element, reading each before writing it), as the NKI
// compiler places it: returns, per tile, the source whose memory it takes, or -1.
std::vector<int> Program::in_place_donors() const {
  std::vector<int> donor(tiles_.size(), -1);
  std::vector<bool> given(tiles_.size(), false);
  for (size_t j = 0; j < code_.size(); ++j) {
    const Instruction& ins = code_[j];
    if (!elementwise(ins) || ins.ops.at(0).tile < 0) continue;
    const Access& f = ins.ops[0];
    const Tile& t = tiles_[f.tile];
    if (t.pinned || t.dropped) continue;
    // the tile starts here: right after its own fill, which this instruction overwrites (and which
    // is then dropped), or as a new version (split_versions: written whole here)
    const Instruction* fill = j > 0 ? &code_[j - 1] : nullptr;
    const bool after_fill = fill && fill->name == "<allocate>" && fill->ops.at(0).tile == f.tile &&
                            t.first == static_cast<int64_t>(j) - 1 && overwrites_whole(ins, fill->ops[0]);
    if (!after_fill && t.first != static_cast<int64_t>(j)) continue;
    for (size_t k = 1; k < ins.ops.size(); ++k) {
      const Access& a = ins.ops[k];
      if (a.tile < 0 || a.tile == f.tile || given[a.tile] || !a.dynamic.empty()) continue;
      const Tile& src = tiles_[a.tile];
      if (src.pinned || src.last != static_cast<int64_t>(j) || src.space != t.space || src.core != t.core ||
          src.bytes < t.bytes || c10::elementSize(a.dtype) != c10::elementSize(f.dtype) || a.sizes != f.sizes ||
          a.strides != f.strides || a.byte_offset != f.byte_offset)
        continue;
      donor[f.tile] = a.tile;
      given[a.tile] = true;
      break;
    }
  }
  return donor;
}

// A new tile's NaN fill that the next instruction overwrites whole (a load into
// the tile made for it) is never observable: dropped, saving a pass over memory.
void Program::drop_overwritten_fills() {
  std::vector<Instruction> kept;
  kept.reserve(code_.size());
  for (size_t i = 0; i < code_.size(); ++i) {
    const Instruction& ins = code_[i];
    if (ins.kind == Kind::kFill && ins.ops[0].tile >= 0 && ins.name == "<allocate>" && i + 1 < code_.size()) {
      const Access& f = ins.ops[0];
      const Instruction& next = code_[i + 1];
      if (next.ops.empty()) {
        kept.push_back(ins);
        continue;
      }
      if (overwrites_whole(next, f)) continue;
    }
    kept.push_back(ins);
  }
  code_ = std::move(kept);
}

// A tile's memory is taken from its first use, not from the statement that
// made it (the NKI compiler allocates by liveness): its fill moves to just
// before the first instruction that touches it; a tile nothing touches is
// never placed. Manually placed tiles keep their fill where they were made
// (their memory may be another tensor's too).
void Program::fill_at_first_use() {
  const size_t n = code_.size();
  std::vector<int64_t> first_use(tiles_.size(), -1);
  auto is_fill = [&](const Instruction& ins) {
    return ins.name == "<allocate>" && ins.ops.at(0).tile >= 0 && !tiles_[ins.ops[0].tile].pinned;
  };
  for (size_t i = 0; i < n; ++i) {
    if (is_fill(code_[i])) continue;
    for (const auto* list : {&code_[i].ops, &code_[i].dyn_srcs})
      for (const Access& a : *list)
        if (a.tile >= 0 && first_use[a.tile] < 0) first_use[a.tile] = static_cast<int64_t>(i);
  }
  std::vector<std::vector<Instruction>> before(n);
  std::vector<Instruction> kept;
  kept.reserve(n);
  const auto spans = loop_spans();
  for (size_t i = 0; i < n; ++i) {
    if (!is_fill(code_[i])) continue;
    const int tile = code_[i].ops[0].tile;
    int64_t at = first_use[tile];
    // A tile made before a dynamic loop and first used in it is filled once, before the loop
    // (a fill in the body would erase what earlier iterations wrote).
    for (const auto& [b, e] : spans)
      if (b > static_cast<int64_t>(i) && b < at && at < e) at = b;
    if (first_use[tile] >= 0) before[at].push_back(std::move(code_[i]));
  }
  for (size_t i = 0; i < n; ++i) {
    if (is_fill(code_[i]) || code_[i].name.empty()) continue;  // moved (or moved-from)
    for (Instruction& f : before[i]) kept.push_back(std::move(f));
    kept.push_back(std::move(code_[i]));
  }
  code_ = std::move(kept);
  for (Tile& tile : tiles_) tile.first = std::numeric_limits<int64_t>::max();
  for (size_t i = 0; i < code_.size(); ++i)
    for (const auto* list : {&code_[i].ops, &code_[i].dyn_srcs})
      for (const Access& a : *list)
        if (a.tile >= 0) tiles_[a.tile].first = std::min<int64_t>(tiles_[a.tile].first, static_cast<int64_t>(i));
  for (Tile& tile : tiles_)
    if (tile.first == std::numeric_limits<int64_t>::max()) {
      tile.dropped = true;  // never used
      tile.first = tile.last = 0;
    } else {
      tile.last = tile.first;
    }
}

// A tile written whole again holds a new value from there on: like the NKI compiler, each such
// version is placed by its own lifetime (it becomes a tile of its own), so a buffer reused across
// the iterations of an unrolled loop does not keep its memory between them. Not for tiles of
// several blocks, manually placed ones, or ones a dynamic loop uses (its body runs again).
void Program::split_versions() {
  std::vector<std::optional<Access>> whole(tiles_.size());
  std::vector<int> fills(tiles_.size(), 0);
  for (const Instruction& ins : code_)
    if (ins.name == "<allocate>" && ins.ops.at(0).tile >= 0) {
      whole[ins.ops[0].tile] = ins.ops[0];
      ++fills[ins.ops[0].tile];
    }
  std::vector<bool> eligible(tiles_.size());
  for (size_t i = 0; i < tiles_.size(); ++i) eligible[i] = fills[i] == 1 && !tiles_[i].pinned && !tiles_[i].dropped;
  for (const auto& [b, e] : loop_spans())
    for (int64_t i = b; i <= e; ++i)
      for (const auto* list : {&code_[i].ops, &code_[i].dyn_srcs})
        for (const Access& a : *list)
          if (a.tile >= 0) eligible[a.tile] = false;
  const size_t n = tiles_.size();
  std::vector<int> current(n);
  std::vector<bool> touched(n, false);
  for (size_t i = 0; i < n; ++i) current[i] = static_cast<int>(i);
  for (Instruction& ins : code_) {
    const bool fill = ins.name == "<allocate>";
    if (!ins.ops.empty() && !fill) {
      const int t = ins.ops[0].tile;
      if (t >= 0 && t < static_cast<int>(n) && eligible[t] && touched[current[t]] && overwrites_whole(ins, *whole[t])) {
        Tile version = tiles_[t];
        tiles_.push_back(version);
        current[t] = static_cast<int>(tiles_.size() - 1);
        touched.push_back(false);
      }
    }
    for (auto* list : {&ins.ops, &ins.dyn_srcs})
      for (Access& a : *list)
        if (a.tile >= 0 && a.tile < static_cast<int>(n)) {
          a.tile = current[a.tile];
          if (!fill) touched[a.tile] = true;  // (a write right after the fill keeps the first version)
        }
  }
  for (Tile& tile : tiles_)
    if (!tile.dropped) {
      tile.first = std::numeric_limits<int64_t>::max();
      tile.last = 0;
    }
  for (size_t i = 0; i < code_.size(); ++i)
    for (const auto* list : {&code_[i].ops, &code_[i].dyn_srcs})
      for (const Access& a : *list)
        if (a.tile >= 0) {
          Tile& tile = tiles_[a.tile];
          tile.first = std::min<int64_t>(tile.first, static_cast<int64_t>(i));
          tile.last = std::max<int64_t>(tile.last, static_cast<int64_t>(i));
        }
}

void Program::finalize() {
  if (finalized_) return;
  const Target& t = target();
  fill_at_first_use();
  split_versions();
  // A tile used both in a dynamic loop and outside it holds its memory for the whole loop: the
  // body runs again after its last use there.
  for (const auto& [b, e] : loop_spans())
    for (Tile& tile : tiles_) {
      if (tile.dropped || tile.last < b || tile.first > e || (tile.first > b && tile.last < e)) continue;
      tile.first = std::min(tile.first, b);
      tile.last = std::max(tile.last, e);
    }
  // One SBUF and one PSUM per logical core; core c's memories follow core c-1's in the arenas.
  std::vector<TileAllocator> sbuf, psum;
  for (int c = 0; c < cores_; ++c) {
    sbuf.emplace_back(Space::kSbuf, t.sbuf_partition_bytes, 64);
    psum.emplace_back(Space::kPsum, t.psum_partition_bytes, t.psum_bank_bytes);
  }
  auto core_of = [&](const Tile& tile) { return cores_ > 1 ? tile.core : 0; };
  auto alloc_of = [&](const Tile& tile) -> TileAllocator& {
    return (tile.space == Space::kPsum ? psum : sbuf).at(core_of(tile));
  };
  auto core_base = [&](const Tile& tile) {
    return static_cast<int64_t>(core_of(tile)) * t.partitions *
           (tile.space == Space::kPsum ? t.psum_partition_bytes : t.sbuf_partition_bytes);
  };
  // Manually placed tiles keep their memory for the whole kernel; automatic
  // placement goes around them.
  for (Tile& tile : tiles_) {
    for (const auto& [start, end] : tile.reserved) alloc_of(tile).reserve(start, end);
    if (tile.pinned) tile.offset = core_base(tile);
  }
  // Tiles in order of first use; release those whose last use is past.
  std::vector<int> order(tiles_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return tiles_[a].first < tiles_[b].first; });
  std::vector<int> live;
  const std::vector<int> donor = in_place_donors();
  for (int i : order) {
    Tile& tile = tiles_[i];
    if (tile.pinned || tile.dropped) continue;
    if (donor[i] >= 0) {  // written over its dying source: that memory is now this tile's
      auto it = std::find(live.begin(), live.end(), donor[i]);
      if (it != live.end()) {
        tile.offset = tiles_[donor[i]].offset;
        *it = i;
        continue;
      }
    }
    for (auto it = live.begin(); it != live.end();) {
      Tile& o = tiles_[*it];
      if (o.last < tile.first) {
        alloc_of(o).free(o.offset - core_base(o));
        it = live.erase(it);
      } else {
        ++it;
      }
    }
    tile.offset = alloc_of(tile).allocate(tile.bytes, tile.what) + core_base(tile);  // throws std::length_error
    live.push_back(i);
  }
  for (int c = 0; c < cores_; ++c) {
    sbuf_peak_ = std::max(sbuf_peak_, sbuf[c].peak());
    psum_peak_ = std::max(psum_peak_, psum[c].peak());
  }
  drop_overwritten_fills();
  for (Instruction& ins : code_)
    for (auto* list : {&ins.ops, &ins.dyn_srcs})
      for (Access& a : *list)
        if (a.tile >= 0) a.byte_offset += tiles_[a.tile].offset;
  for (const Instruction& ins : code_) {
    if (ins.kind == Kind::kRegister) num_registers_ = std::max(num_registers_, ins.ints.at(1) + 1);
    if (ins.kind == Kind::kRegister && ins.ints.at(0) == 1) num_registers_ = std::max(num_registers_, ins.ints.at(2) + 1);
    if (ins.kind == Kind::kLoopEnd)
      for (size_t k = 1; k < ins.ints.size(); ++k) num_registers_ = std::max(num_registers_, ins.ints[k] + 1);
    if (ins.kind == Kind::kLoopBegin)
      for (int64_t c = 0; c < ins.ints.at(2); ++c)
        for (int k : {0, 2, 4})
          if (k == 0 || ins.ints.at(3 + 5 * c + k - 1))
            num_registers_ = std::max(num_registers_, ins.ints.at(3 + 5 * c + k) + 1);
  }
  for (size_t i = 0; i < code_.size(); ++i)
    if (code_[i].kind == Kind::kLoopBegin) {
      const auto id = static_cast<size_t>(code_[i].ints.at(0));
      if (loops_.size() <= id) loops_.resize(id + 1, {-1, -1});
      loops_[id].first = static_cast<int64_t>(i);
    } else if (code_[i].kind == Kind::kLoopEnd) {
      loops_.at(static_cast<size_t>(code_[i].ints.at(0))).second = static_cast<int64_t>(i);
    }
  finalized_ = true;
}

std::vector<std::pair<int64_t, int64_t>> Program::loop_spans() const {
  std::vector<std::pair<int64_t, int64_t>> spans;
  std::vector<int64_t> open;
  for (size_t i = 0; i < code_.size(); ++i)
    if (code_[i].kind == Kind::kLoopBegin) {
      open.push_back(static_cast<int64_t>(i));
    } else if (code_[i].kind == Kind::kLoopEnd) {
      TORCH_CHECK(!open.empty(), "NKI program: a dynamic loop ends that did not begin");
      spans.emplace_back(open.back(), static_cast<int64_t>(i));
      open.pop_back();
    }
  TORCH_CHECK(open.empty(), "NKI program: a dynamic loop does not end (a `break` out of nl.dynamic_range?)");
  return spans;
}

bool Program::retarget_last(int tile, const Access& dst, bool accumulate) {
  TORCH_CHECK(!finalized_, "NKI program: instruction after the kernel was placed");
  if (tile < 0 || tile >= static_cast<int>(tiles_.size()) || code_.empty()) return false;
  Tile& t = tiles_[tile];
  Instruction& last = code_.back();
  if (last.ops.empty() || last.ops[0].tile != tile || t.pinned) return false;
  if (accumulate && (last.kind != Kind::kMatmul || last.ints.empty())) return false;
  // The tile's own fills, then the instruction writing it, and nothing else.
  for (int64_t i = t.first; i + 1 < static_cast<int64_t>(code_.size()); ++i)
    if (code_[i].name != "<allocate>" || code_[i].ops[0].tile != tile) return false;
  for (size_t k = 1; k < last.ops.size(); ++k)
    if (last.ops[k].tile == tile) return false;
  Instruction ins = last;
  const std::string role = ins.ops[0].role;
  ins.ops[0] = dst;
  ins.ops[0].role = role;
  if (accumulate) ins.ints[0] = 1;
  check_instruction(ins, target());
  code_.back() = std::move(ins);
  code_.erase(code_.begin() + t.first, code_.end() - 1);
  t.dropped = true;
  return true;
}

int Program::add_hbm(at::ScalarType dtype, std::vector<int64_t> sizes) {
  hbm_.push_back({dtype, std::move(sizes)});
  return static_cast<int>(kFirstHbmBuffer + num_args_ + hbm_.size() - 1);
}

void Program::emit(Instruction ins) {
  TORCH_CHECK(!finalized_, "NKI program: instruction after the kernel was placed");
  check_instruction(ins, target());
  for (const auto* list : {&ins.ops, &ins.dyn_srcs})
    for (const Access& a : *list) {
      TORCH_CHECK(a.tile < static_cast<int>(tiles_.size()) && (a.tile >= 0) == a.on_chip(),
                  ins.name, ": ", a.role, " refers to no allocated tile");
      for (const DynamicOffset& d : a.dynamic)
        TORCH_CHECK(d.source >= 0 && d.source < static_cast<int>(ins.dyn_srcs.size()), ins.name, ": ", a.role,
                    " has a run-time offset without its source");
    }
  code_.push_back(std::move(ins));
}

namespace {

// A view of an access on its buffer, after checking it stays inside it. ATen
// views cannot have negative strides: such dims are viewed ascending from
// their lowest address and listed in `reversed` (from_blob must never see a
// negative stride: its size computation cannot fail cleanly).
at::Tensor view_of(const Access& a, const at::Tensor& buffer, const std::string& instr,
                   std::vector<int64_t>& reversed) {
  const int64_t item = static_cast<int64_t>(c10::elementSize(a.dtype));
  int64_t lo = a.byte_offset, hi = a.byte_offset;
  std::vector<int64_t> strides = a.strides;
  reversed.clear();
  for (size_t i = 0; i < a.sizes.size(); ++i) {
    if (a.sizes[i] == 0) return at::empty(a.sizes, at::TensorOptions().dtype(a.dtype));
    const int64_t span = (a.sizes[i] - 1) * a.strides[i] * item;
    if (span < 0) {
      lo += span;
      strides[i] = -strides[i];
      reversed.push_back(static_cast<int64_t>(i));
    } else {
      hi += span;
    }
  }
  hi += item;
  const int64_t nbytes = static_cast<int64_t>(buffer.storage().nbytes()) - buffer.storage_offset() * buffer.element_size();
  TORCH_CHECK(lo >= 0 && hi <= nbytes, instr, ": ", a.role, " reaches bytes [", lo, ", ", hi,
              ") outside its buffer of ", nbytes, " bytes");
  auto* base = static_cast<uint8_t*>(buffer.data_ptr()) + lo;
  return at::from_blob(base, a.sizes, strides, at::TensorOptions().dtype(a.dtype));
}

// An access with its run-time offsets applied: each value is read from its
// (1, 1) tile now, and must keep the access inside its tensor.
// An index outside the tensor raises, or (oob_mode.skip) makes `skip` true.
Access at_run_time(const Instruction& ins, const Access& a, const std::vector<const at::Tensor*>& buffers,
                   bool& skip) {
  Access r = a;
  r.dynamic.clear();
  std::vector<int64_t> reversed;
  for (const DynamicOffset& d : a.dynamic) {
    const Access& src = ins.dyn_srcs.at(d.source);
    const int64_t value = static_cast<int64_t>(view_of(src, *buffers.at(src.buffer), ins.name, reversed)
                                                   .reshape({-1})[0].item<double>());
    if (d.skip && (value < d.lo || value > d.hi)) {
      skip = true;
      return a;
    }
    TORCH_CHECK_INDEX(value >= d.lo && value <= d.hi, ins.name, ": ", a.role, " run-time index ", value,
                      " reaches outside ", d.what, " (it must be in [", d.lo, ", ", d.hi, "])");
    r.byte_offset += value * d.stride * static_cast<int64_t>(c10::elementSize(a.dtype));
  }
  return r;
}

// The arenas of the thread running programs (a queue's engine, or the host
// for NumPy runs), kept between runs.
at::Tensor& arena(int which, int64_t bytes) {
  thread_local at::Tensor arenas[2];
  at::Tensor& a = arenas[which];
  if (!a.defined() || a.numel() != bytes) a = at::empty({bytes}, at::TensorOptions().dtype(at::kByte));
  return a;
}

int64_t& reg(RunState& state, int64_t r) { return state.registers.at(static_cast<size_t>(r)); }

// nisa.register_move / register_load / register_store.
void run_register(const Instruction& ins, const std::vector<at::Tensor>& views, RunState& state) {
  int64_t& r = reg(state, ins.ints.at(1));
  switch (ins.ints.at(0)) {
    case 0: r = ins.ints.at(2); break;
    case 1: r = reg(state, ins.ints.at(2)); break;
    case 2: {  // one 32-bit value from memory
      at::Tensor v = views.at(0).reshape({-1})[0];
      r = c10::isFloatingType(v.scalar_type()) ? static_cast<int64_t>(v.item<double>()) : v.item<int64_t>();
      break;
    }
    default: views.at(0).fill_(r);
  }
}

}  // namespace

void Program::run(const std::vector<at::Tensor>& hbm) const {
  TORCH_CHECK(finalized_, "NKI program: run before its tiles were placed (finalize)");
  const Target& t = target();
  TORCH_CHECK(static_cast<int64_t>(hbm.size()) == num_args_ + static_cast<int64_t>(hbm_.size()),
              "NKI program expects ", num_args_ + hbm_.size(), " HBM tensors, got ", hbm.size());
  std::vector<const at::Tensor*> buffers;
  buffers.push_back(&arena(0, cores_ * t.partitions * t.sbuf_partition_bytes));
  buffers.push_back(&arena(1, cores_ * t.partitions * t.psum_partition_bytes));
  for (const at::Tensor& h : hbm) buffers.push_back(&h);
  thread_local uint64_t runs = 0;
  RunState state;
  state.seed = 0x9E3779B97F4A7C15ull * ++runs;
  std::vector<at::Tensor> views;
  std::vector<int64_t> reversed;
  state.loop_left.assign(loops_.size(), 0);
  state.registers.assign(static_cast<size_t>(num_registers_), 0);
  for (size_t pc = 0; pc < code_.size(); ++pc) {
    const Instruction& ins = code_[pc];
    if (ins.kind == Kind::kLoopBegin || ins.kind == Kind::kLoopEnd) {
      const auto id = static_cast<size_t>(ins.ints.at(0));
      const std::vector<int64_t>& head = code_[loops_.at(id).first].ints;
      const int64_t step = head.at(1), cores = head.at(2);
      if (step == 0) {  // while_loop: runs while the condition registers are nonzero
        const bool begin = ins.kind == Kind::kLoopBegin;
        bool go = false;
        for (int64_t c = 0; c < cores; ++c) {
          const bool on = reg(state, begin ? head.at(3 + 5 * c) : ins.ints.at(1 + c)) != 0;
          TORCH_CHECK(c == 0 || on == go, "while_loop: the logical cores' conditions differ; cores of one launch "
                      "run a dynamic loop together");
          go = on;
        }
        if (begin && !go) pc = static_cast<size_t>(loops_[id].second);
        if (!begin && go) pc = static_cast<size_t>(loops_[id].first);
        continue;
      }
      if (ins.kind == Kind::kLoopBegin) {
        for (int64_t c = 0; c < cores; ++c) {
          const int64_t* f = &head.at(3 + 5 * c);
          const int64_t start = f[1] ? reg(state, f[2]) : f[2], stop = f[3] ? reg(state, f[4]) : f[4];
          const int64_t trips = stop > start ? (stop - start + step - 1) / step : 0;
          TORCH_CHECK(c == 0 || trips == state.loop_left[id], "dynamic_range: the logical cores' trip counts differ (",
                      state.loop_left[id], " and ", trips, "); cores of one launch run a dynamic loop together");
          state.loop_left[id] = trips;
          reg(state, f[0]) = start;
        }
        if (state.loop_left[id] == 0) pc = static_cast<size_t>(loops_[id].second);  // no iteration
      } else if (--state.loop_left[id] > 0) {
        for (int64_t c = 0; c < cores; ++c) reg(state, head.at(3 + 5 * c)) += step;
        pc = static_cast<size_t>(loops_[id].first);
      }
      continue;
    }
    views.clear();
    at::Tensor dst_ascending;
    std::vector<int64_t> dst_reversed;
    bool skip = false;
    for (size_t i = 0; i < ins.ops.size() && !skip; ++i) {
      const Access& a = ins.ops[i];
      at::Tensor v = a.dynamic.empty() ? view_of(a, *buffers.at(a.buffer), ins.name, reversed)
                                       : view_of(at_run_time(ins, a, buffers, skip), *buffers.at(a.buffer), ins.name,
                                                 reversed);
      if (!reversed.empty()) {
        if (i == 0) {  // the destination: computed in a copy, written back reversed
          dst_ascending = v;
          dst_reversed = reversed;
        }
        v = v.flip(reversed);
      }
      views.push_back(std::move(v));
    }
    if (skip) continue;
    if (ins.kind == Kind::kRegister) {
      run_register(ins, views, state);
      continue;
    }
    execute(ins, views, state);
    if (dst_ascending.defined()) dst_ascending.copy_(views[0].flip(dst_reversed));
  }
}

}  // namespace neuronx::nki
