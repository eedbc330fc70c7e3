#include "nki/cost_model.h"

#include <algorithm>
#include <map>

#include "nki/target.h"

namespace neuronx::nki {

namespace {

int64_t free_size(const Access& a) {
  int64_t n = 1;
  for (size_t i = 1; i < a.sizes.size(); ++i) n *= a.sizes[i];
  return n;
}

int64_t bytes_of(const Access& a) {
  int64_t n = static_cast<int64_t>(c10::elementSize(a.dtype));
  for (int64_t s : a.sizes) n *= s;
  return n;
}

// Engine clocks (GHz) of each generation: Tensor, Vector, Scalar, GpSimd.
std::array<double, 4> clocks(const Target& t) {
  if (t.nc_version <= 2) return {2.8, 1.12, 1.4, 1.4};  // Trainium/Inferentia2
  if (t.nc_version == 3) return {2.4, 0.96, 1.2, 1.2};  // Trainium2
  return {2.4, 1.2, 1.2, 1.2};                          // Trainium3
}

// HBM bandwidth per NeuronCore (GB/s): device bandwidth over its cores.
double hbm_gbps(const Target& t) { return t.nc_version <= 2 ? 820.0 / 2 : t.nc_version == 3 ? 3000.0 / 8 : 4700.0 / 8; }

// Sustained bandwidth of one DMA engine (bytes/ns = GB/s), per generation.
double dma_engine_gbps(const Target& t) { return t.nc_version <= 2 ? 17.0 : t.nc_version == 3 ? 23.0 : 33.0; }

constexpr double kDmaFixedNs = 1300.0;  // descriptor setup and semaphore latency per transfer
// Per-packet overhead of each contiguous run ("DMA buffer"), in bytes of transfer time: bandwidth
// reaches ~90% of peak at 4 KiB per partition, ~80% at 2 KiB and a third at 256 B.
constexpr double kDmaPacketBytes = 512.0;

// Bytes of the innermost contiguous run of an access (on-chip: within one partition).
int64_t contiguous_bytes(const Access& a) {
  const auto item = static_cast<int64_t>(c10::elementSize(a.dtype));
  int64_t run = 1;
  for (size_t i = a.sizes.size(); i-- > (a.on_chip() ? 1 : 0);) {
    if (a.sizes[i] == 1) continue;
    if (a.strides[i] != run) break;
    run *= a.sizes[i];
  }
  return run * item;
}

bool is_fp32(at::ScalarType s) { return s == at::kFloat; }

// The part of its memory an access touches: partitions [p0, p1) and bytes [f0, f1) within each
// (HBM: one "partition", the linear bytes). Writes to disjoint parts of a tile do not wait on
// each other.
struct Region {
  int64_t p0, p1, f0, f1;
  bool overlaps(const Region& o) const { return p0 < o.p1 && o.p0 < p1 && f0 < o.f1 && o.f0 < f1; }
};

Region region_of(const Access& a, const Target& t) {
  const auto item = static_cast<int64_t>(c10::elementSize(a.dtype));
  int64_t lo = 0, hi = 0;
  for (size_t i = a.on_chip() ? 1 : 0; i < a.sizes.size(); ++i) {
    const int64_t span = (a.sizes[i] - 1) * a.strides[i] * item;
    (span < 0 ? lo : hi) += span;
  }
  if (!a.on_chip()) return {0, 1, a.byte_offset + lo, a.byte_offset + hi + item};
  const int64_t pb = a.space() == Space::kPsum ? t.psum_partition_bytes : t.sbuf_partition_bytes;
  const int64_t p = a.byte_offset / pb, f = a.byte_offset % pb;
  const int64_t np = a.sizes.empty() ? 1 : a.sizes[0] * std::max<int64_t>(1, a.strides[0] * item / pb);
  return {p, p + std::max<int64_t>(np, 1), f + lo, f + hi + item};
}

struct Use {
  Region region;
  double write_end, read_end;
};

}  // namespace

const char* engine_name(Engine e) {
  static const char* names[] = {"tensor", "vector", "scalar", "gpsimd", "dma", "none"};
  return names[static_cast<int>(e)];
}

std::pair<Engine, double> instruction_cycles(const Instruction& ins) {
  if (ins.ops.empty()) return {Engine::kNone, 0};
  const Access& d = ins.ops[0];
  const int64_t n = free_size(d);
  switch (ins.kind) {
    case Kind::kMatmul:
    case Kind::kMatmulMx: {
      // initiation interval max(min(64, N_stationary), N_moving), 4x for fp32 operands
      const int64_t ns = free_size(ins.ops.at(1)), nm = free_size(ins.ops.at(2));
      const double c = static_cast<double>(std::max<int64_t>(std::min<int64_t>(64, ns), nm));
      const bool fp32 = ins.kind == Kind::kMatmul && (is_fp32(ins.ops[1].dtype) || is_fp32(ins.ops[2].dtype));
      return {Engine::kTensor, fp32 ? 4 * c : c};
    }
    case Kind::kTranspose:
      if (d.space() == Space::kPsum) return {Engine::kTensor, static_cast<double>(std::max<int64_t>(64, n))};
      return {Engine::kVector, static_cast<double>(std::max<int64_t>(64, n))};
    case Kind::kActivation:
      if (ins.name == "exponential") return {Engine::kVector, static_cast<double>(std::max<int64_t>(64, n))};
      return {Engine::kScalar, static_cast<double>(std::max<int64_t>(64, n))};
    case Kind::kCopy: {
      bool hbm = ins.name.rfind("dma_", 0) == 0;  // dma_copy/dma_transpose run on the queues, SBUF to SBUF too
      for (const Access& a : ins.ops) hbm = hbm || !a.on_chip();
      if (hbm) return {Engine::kDma, 0};  // timed by bytes (model_cost)
      return {Engine::kVector, static_cast<double>(std::max<int64_t>(64, n))};
    }
    case Kind::kTensorTensor:
    case Kind::kScalarTensorTensor:  // two input tiles: 2N
      return {Engine::kVector, static_cast<double>(std::max<int64_t>(64, 2 * free_size(ins.ops.at(1))))};
    case Kind::kConst:  // iota: a GpSimd instruction
      return {Engine::kGpSimd, static_cast<double>(std::max<int64_t>(64, n))};
    case Kind::kSelect:  // affine_select runs on GpSimd (nki.isa docs); select on Vector
      return {ins.name == "affine_select" ? Engine::kGpSimd : Engine::kVector,
              static_cast<double>(std::max<int64_t>(64, n))};
    case Kind::kReduce:
    case Kind::kPartitionReduce:
    case Kind::kBnStats:
    case Kind::kMax8:
    case Kind::kFindIndex8:
    case Kind::kMatchReplace8:
    case Kind::kCumulative:
    case Kind::kScan:
      return {Engine::kVector, static_cast<double>(std::max<int64_t>(64, free_size(ins.ops.at(1))))};
    case Kind::kGather:
    case Kind::kLocalGather:
    case Kind::kShuffle:
    case Kind::kSequenceBounds:
    case Kind::kNonzero:
      return {Engine::kGpSimd, static_cast<double>(std::max<int64_t>(64, n))};
    case Kind::kFill:
      // A zeroed PSUM tile becomes the first matmul's overwrite flag (nothing runs on hardware).
      if (d.space() == Space::kPsum) return {Engine::kNone, 0};
      return {Engine::kVector, static_cast<double>(std::max<int64_t>(64, n))};
    case Kind::kSeed:
    case Kind::kPrint:
    case Kind::kRegister:
    case Kind::kLoopBegin:
    case Kind::kLoopEnd:
      return {Engine::kNone, 0};
    default:  // tensor_scalar, select, memset, iota, bn_aggr, quantize_mx, random...: one input
      return {Engine::kVector, static_cast<double>(std::max<int64_t>(64, n))};
  }
}

CostReport model_cost(const Program& p, const Target& t) {
  CostReport r;
  const auto ghz = clocks(t);
  r.tensor_peak = 2.0 * 128 * 128 * ghz[0] * 1e9;
  std::array<double, 4> engine_free{};
  std::array<double, kDmaQueues> queue_free{};
  double link_free = 0;  // the queues share the core's DMA/HBM bandwidth
  std::map<int64_t, std::vector<Use>> uses;  // per tile (>= 0) or HBM buffer (< 0)
  auto key = [](const Access& a) { return a.tile >= 0 ? static_cast<int64_t>(a.tile) : -1 - a.buffer; };
  // When an access may start: after overlapping writes (and, for a write, overlapping reads).
  auto ready_for = [&](const Access& a, bool write) {
    double t0 = 0;
    const Region r = region_of(a, t);
    for (const Use& u : uses[key(a)])
      if (u.region.overlaps(r)) t0 = std::max({t0, u.write_end, write ? u.read_end : 0.0});
    return t0;
  };
  const double dma_gbps = std::min(kDmaQueues * dma_engine_gbps(t), hbm_gbps(t));
  for (const Instruction& ins : p.instructions()) {
    if (ins.name == "<allocate>") continue;  // the simulator's NaN fill of new tiles: not on hardware
    auto [engine, cycles] = instruction_cycles(ins);
    if (engine == Engine::kNone) continue;
    double start = ready_for(ins.ops[0], true);
    for (size_t i = 1; i < ins.ops.size(); ++i) start = std::max(start, ready_for(ins.ops[i], false));
    for (const Access& a : ins.dyn_srcs) start = std::max(start, ready_for(a, false));
    double dur;
    size_t queue = 0;
    if (engine == Engine::kDma) {
      const int64_t bytes = bytes_of(ins.ops[0]);
      r.dma_bytes += static_cast<double>(bytes);
      // packets of the destination and source (an indirect copy's index tile is not moved)
      int64_t run = bytes;
      for (size_t i = 0; i < std::min<size_t>(2, ins.ops.size()); ++i) run = std::min(run, contiguous_bytes(ins.ops[i]));
      const double packets = static_cast<double>(bytes) / static_cast<double>(std::max<int64_t>(run, 1));
      queue = static_cast<size_t>(std::min_element(queue_free.begin(), queue_free.end()) - queue_free.begin());
      start = std::max(start, queue_free[queue]);
      // the fixed cost overlaps across queues; the bytes take their turn on the shared bandwidth
      const double data_start = std::max(start + kDmaFixedNs, link_free);
      link_free = data_start + (static_cast<double>(bytes) + packets * kDmaPacketBytes) / dma_gbps;
      dur = link_free - start;
    } else {
      dur = cycles / ghz[static_cast<int>(engine)];
      start = std::max(start, engine_free[static_cast<int>(engine)]);
    }
    const double end = start + dur;
    if (engine == Engine::kDma) queue_free[queue] = end;
    else engine_free[static_cast<int>(engine)] = end;
    r.busy_ns[static_cast<int>(engine)] += dur;
    for (size_t i = 1; i < ins.ops.size(); ++i) uses[key(ins.ops[i])].push_back({region_of(ins.ops[i], t), 0.0, end});
    // a write replaces what it covers: earlier uses inside it no longer order anything after it
    const Region w = region_of(ins.ops[0], t);
    std::vector<Use>& du = uses[key(ins.ops[0])];
    du.erase(std::remove_if(du.begin(), du.end(),
                            [&](const Use& u) {
                              return u.region.p0 >= w.p0 && u.region.p1 <= w.p1 && u.region.f0 >= w.f0 &&
                                     u.region.f1 <= w.f1 && u.write_end <= end && u.read_end <= end;
                            }),
             du.end());
    du.push_back({w, end, 0.0});
    if (ins.kind == Kind::kMatmul || ins.kind == Kind::kMatmulMx)
      r.tensor_flops += 2.0 * ins.ops[1].sizes[0] * (ins.kind == Kind::kMatmulMx ? 4 : 1) * free_size(ins.ops[1]) *
                        free_size(ins.ops[2]);
    r.latency_ns = std::max(r.latency_ns, end);
    r.steps.push_back({ins.name, engine, start, end});
  }
  return r;
}

}  // namespace neuronx::nki
