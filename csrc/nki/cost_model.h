#pragma once
// A model of how long a traced NKI program takes on the NeuronCore it targets (no hardware
// here: the figures are the published ones, see docs/nki.md "Modeled performance"). Each
// instruction gets a cost on its engine; engines run concurrently, an instruction starts when
// its engine is free and the tiles it reads (and writes) are ready. Dynamic loops count once.
#include <array>
#include <string>
#include <vector>

#include "nki/program.h"

namespace neuronx::nki {

enum class Engine : int { kTensor = 0, kVector, kScalar, kGpSimd, kDma, kNone };
constexpr int kModeledEngines = 5;
constexpr int kDmaQueues = 16;  // DMA engines per NeuronCore, each with its own queue
const char* engine_name(Engine e);

struct ModeledStep {
  std::string name;  // the NKI instruction
  Engine engine;
  double start_ns, end_ns;
};

struct CostReport {
  double latency_ns = 0;
  std::array<double, kModeledEngines> busy_ns{};
  double tensor_flops = 0;   // 2 * K * M * N of the matmuls
  double tensor_peak = 0;    // the Tensor Engine's peak FLOP/s (bf16)
  double dma_bytes = 0;      // bytes the DMA instructions move
  std::vector<ModeledStep> steps;
};

// Engine cycles of one instruction and its engine (the published per-instruction formulas).
std::pair<Engine, double> instruction_cycles(const Instruction& ins);
CostReport model_cost(const Program& p, const Target& t);

}  // namespace neuronx::nki
