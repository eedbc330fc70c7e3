#pragma once
// A traced NKI kernel: the instructions its Python body issued, over access
// patterns into the kernel's HBM tensors and the core's on-chip memories.
// The body runs once per call on the host (issuing, allocating and checking);
// the program then executes in C++ on tile buffers with ATen's math, on the
// device's queue for neuron tensors or at once for NumPy arrays.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nki/target.h"
#include "nki/tile_allocator.h"

namespace neuronx::nki {

// Buffers 0 and 1 are the SBUF and PSUM arenas; 2 + i is HBM tensor i (the
// kernel's arguments first, then tensors the kernel allocated in HBM).
constexpr int kSbufBuffer = 0, kPsumBuffer = 1, kFirstHbmBuffer = 2;

// A run-time offset (an index read from a (1, 1) SBUF tile when the
// instruction runs): the access starts `value * stride` elements further on.
struct DynamicOffset {
  int source = 0;            // Instruction::dyn_srcs index of the tile holding the value
  int64_t stride = 0;        // elements per unit of the value
  int64_t lo = 0, hi = 0;    // values that keep the access inside its tensor
  std::string what;          // "dimension 1 of src_tensor_sbuf (size 512)", for the error
  bool skip = false;         // outside [lo, hi]: the instruction does nothing (oob_mode.skip)
};

struct Access {
  int buffer = 0;
  int tile = -1;                    // on-chip: the tile (its address is placed at finalize())
  at::ScalarType dtype = at::kFloat;
  int64_t byte_offset = 0;          // from the buffer's start (on-chip: from the tile's start, in partition 0)
  std::vector<int64_t> sizes;       // partition dim first for on-chip accesses
  std::vector<int64_t> strides;     // in elements of dtype
  std::string role;                 // operand name in messages ("data1", "stationary")
  std::vector<DynamicOffset> dynamic;

  Space space() const {
    return buffer == kSbufBuffer ? Space::kSbuf : buffer == kPsumBuffer ? Space::kPsum : Space::kHbm;
  }
  bool on_chip() const { return buffer < kFirstHbmBuffer; }
  int64_t numel() const;
};

enum class Kind : uint8_t {
  kFill,              // dst = value (NaN fill of new tiles, memset)
  kConst,             // dst = a host constant (iota, shared_constant, affine_select's mask)
  kCopy,              // dst = src, converting dtype (DMA, tensor_copy)
  kMatmul,            // dst (PSUM) [+]= stationaryᵀ · moving, fp32 accumulation
  kTranspose,         // dst = srcᵀ (2-D)
  kActivation,        // dst = f(src * scale + bias) [, reduce_res = Σ over the free dims]
  kTensorTensor,      // dst = a op b
  kTensorScalar,      // dst = (src op0 s0) op1 s1 [, reduce_res = reduce(dst)]
  kScalarTensorTensor,// dst = (a op0 s0) op1 b
  kReduce,            // dst = reduce(src) over free axes
  kPartitionReduce,   // dst = reduce(src) over the partition dim
  kSelect,            // dst = mask ? src : value
  kWhere,             // dst = cond ? a : b
  kBnStats,           // per-partition mean and variance pieces of src
  kBnAggr,            // combine bn_stats into mean, variance
  kScan,              // tensor_tensor_scan: dst[i] = (dst[i-1] op0 a[i]) op1 b[i]
  kRandom,            // dst = uniform [0, 1) from the kernel's seed (dropout/rand)
  kMax8,              // dst (P, 8) = the 8 largest values per partition, descending
  kFindIndex8,        // dst (P, 8) = index of the first occurrence of each of vals' 8 values in data
  kGather,            // dst[p, k] = data[p, indices[p, k]] over data's flattened free dims
  kCumulative,        // acc = acc op1 (src[i] op0 imm0), dst[i] = acc, along the free elements
  kSeed,              // the generator's seed from here on (no operands; ints[0])
  kMatchReplace8,     // dst = data with the first match of each of vals' 8 values replaced [, their indices]
  kShuffle,           // dst partition q*32+i = src partition q*32+mask[i] (nc_stream_shuffle)
  kSequenceBounds,    // dst (P, 2, n) = start and end of each element's segment
  kLocalGather,       // dst = each 16-partition core's gather at its flattened indices
  kPrint,             // prints ops[0] (read, not written) after fns[0] (nl.device_print)
  kNonzero,           // dst (P, T+1) = nonzero indices of src, padding, count (every 16th partition)
  kQuantizeMx,        // dst (packed MX words), ops[2] (scales) = src quantized per 8x4 group
  kMatmulMx,          // dst (PSUM) [+]= dequantized stationaryᵀ · moving (packed MX, with scales)
  kPrng,              // the engines' XORWOW generators: rng, rand2, set_rng_seed, rand_set/get_state (prng.cpp)
  kRegister,          // a sequencer register: ints [op, reg, value]; op set/copy (no operands), load/store ops[0]
  kLoopBegin,         // a dynamic loop: ints [loop, step, cores, then per core: counter reg, start is reg,
                      // start, stop is reg, stop]
  kLoopEnd,           // ints [loop]: the counters step; the body runs again until its trip count
};

struct Instruction {
  Kind kind;
  std::string name;                      // the NKI instruction ("tensor_tensor")
  std::vector<Access> ops;               // ops[0] is the destination
  std::vector<std::string> fns;          // ALU/activation/reduce function names
  std::vector<double> scalars;
  std::vector<int64_t> ints;
  std::optional<at::Tensor> mask;        // bool, dst's sizes: only where true is written
  std::optional<at::Tensor> constant;    // kConst's values
  std::string where;                     // kernel file:line
  std::vector<Access> dyn_srcs;          // tiles holding run-time offsets (Access::dynamic)
};

struct HbmBuffer {
  at::ScalarType dtype;
  std::vector<int64_t> sizes;
};

// An on-chip allocation. Like the NKI compiler, the program places tiles once
// the kernel is traced: a tile is live from its first use to its last use,
// and tiles whose lifetimes do not overlap may share memory.
struct Tile {
  Space space;
  int64_t bytes = 0;              // per partition
  int64_t first = 0, last = 0;    // instruction indices of allocation and last use
  std::string what;               // name, shape, dtype and kernel line, for messages
  int64_t offset = -1;            // placed byte offset within each partition
  // Manually placed (ncc.*.mod_alloc, nl.ndarray(address=)): accesses carry
  // absolute arena offsets (offset stays 0); `reserved` are the [start, end)
  // byte ranges within a partition that automatic placement must avoid.
  int core = 0;                   // the logical core (SPMD rank) whose memory holds it
  bool pinned = false;
  bool dropped = false;           // its only write was redirected (retarget_last): never placed
  std::vector<std::pair<int64_t, int64_t>> reserved;
};

class Program {
 public:
  explicit Program(int64_t num_args);

  // An on-chip tile of `blocks` blocks of free_elems elements per partition (its
  // NaN/sentinel fill recorded); the tile id for accesses. Each PSUM block must fit a bank.
  int allocate(Space space, at::ScalarType dtype, int64_t partitions, int64_t blocks, int64_t free_elems,
               const std::string& what, int core = 0);
  // A manually placed tile: block b at partition blocks[b].first, byte address
  // blocks[b].second within the partition (PSUM: bank * bank bytes + offset).
  // Blocks may share an address (modulo allocation reuses memory, as on
  // hardware). Returns the tile id; accesses to it use absolute arena offsets.
  int allocate_at(Space space, at::ScalarType dtype, int64_t partitions, int64_t free_elems,
                  const std::vector<std::pair<int64_t, int64_t>>& blocks, const std::string& what, int core = 0);
  // Logical cores with their own SBUF and PSUM (kernel[2] instances that ran
  // interleaved, exchanging data): each core's tiles are placed in its own
  // memories, the arenas hold one copy per core. 1 (the default): all tiles
  // share one core's memories (instances ran one after another).
  void set_cores(int n);
  // Places the tiles (first fit in order of allocation, freeing those past their last
  // use), throwing std::length_error when one does not fit; then the program can run.
  void finalize();
  // An HBM tensor the kernel allocates (its outputs, scratch): its buffer index.
  int add_hbm(at::ScalarType dtype, std::vector<int64_t> sizes);
  // Checks the instruction against the target's limits (throws
  // std::invalid_argument with the instruction, operand and limit), then appends it.
  void emit(Instruction ins);

  // `x[...] = op(...)`: the last instruction wrote a new tile that nothing
  // else uses; it writes `dst` instead and the tile (with its fill) is dropped,
  // as the NKI compiler writes an expression's result straight into the tensor
  // it is assigned to (a manually placed kernel has no room for the temporary).
  // With `accumulate` the last instruction must be a matmul, which then adds
  // into dst (`psum += nc_matmul(...)`). False (nothing changed) when the last
  // instruction is not that tile's only use.
  bool retarget_last(int tile, const Access& dst, bool accumulate);

  // Runs the instructions over hbm (the arguments, then kernel-allocated
  // tensors, as add_hbm numbered them), all CPU tensors.
  void run(const std::vector<at::Tensor>& hbm) const;

  int64_t num_args() const { return num_args_; }
  const std::vector<HbmBuffer>& hbm_buffers() const { return hbm_; }
  const std::vector<Instruction>& instructions() const { return code_; }
  int64_t peak_bytes(Space s) const { return s == Space::kPsum ? psum_peak_ : sbuf_peak_; }

 private:
  void drop_overwritten_fills();
  std::vector<int> in_place_donors() const;
  void split_versions();
  void fill_at_first_use();
  // The dynamic loops' [begin, end] instruction indices, in code_ as it stands.
  std::vector<std::pair<int64_t, int64_t>> loop_spans() const;
  std::vector<std::pair<int64_t, int64_t>> loops_;  // by loop id, once placed
  int64_t num_registers_ = 0;
  int64_t num_args_;
  std::vector<HbmBuffer> hbm_;
  std::vector<Instruction> code_;
  std::vector<Tile> tiles_;
  bool finalized_ = false;
  int64_t sbuf_peak_ = 0, psum_peak_ = 0;
  int cores_ = 1;
};

// Checks (checks.cpp): throw std::invalid_argument.
void check_instruction(const Instruction& ins, const Target& t);
// What a run keeps between instructions: the generator's seed and the Vector
// Engine's per-partition accumulation registers (tensor_scalar_cumulative).
struct RunState {
  uint64_t seed = 0;
  std::vector<int64_t> registers;  // the sequencers' registers (nisa.register_alloc)
  std::vector<int64_t> loop_left;  // per dynamic loop: iterations still to run
  at::Tensor vector_acc;  // the Vector Engine's (partitions, 1) fp32 registers, undefined until first set
  at::Tensor scalar_acc;  // the Scalar Engine's (activation's reduce_regs)
  std::vector<uint32_t> prng[2];  // the Vector [0] and GpSimd [1] Engines' generator states (prng.cpp)
};
// Execution of one instruction on views (instructions.cpp).
void execute(const Instruction& ins, const std::vector<at::Tensor>& views, RunState& state);

}  // namespace neuronx::nki
