#pragma once
// The NeuronCore generation a kernel is checked against: on-chip memory sizes
// and engine limits (NEURON_PLATFORM_TARGET_OVERRIDE=trn1|trn2|trn3, as AWS's
// simulator reads it; default trn2).
#include <cstdint>
#include <string>

namespace neuronx::nki {

struct Target {
  std::string name;                  // "trn1", "trn2", "trn3"
  int nc_version = 2;                // nisa.get_nc_version(): gen2 = trn1, gen3 = trn2, gen4 = trn3
  int64_t partitions = 128;          // SBUF and PSUM partitions (nl.tile_size.pmax)
  int64_t sbuf_partition_bytes = 0;  // 192 KiB (trn1), 224 KiB (trn2, trn3)
  int64_t psum_partition_bytes = 16 * 1024;
  int64_t psum_bank_bytes = 2 * 1024;  // one accumulation bank: 512 fp32 per partition
  int64_t gemm_stationary_fmax = 128;
  int64_t gemm_moving_fmax = 512;
  int64_t bn_stats_fmax = 512;
};

// The target this process checks kernels against (read once from the environment).
const Target& target();
// Re-reads NEURON_PLATFORM_TARGET_OVERRIDE (tests switch targets in one process).
const Target& reload_target();

}  // namespace neuronx::nki
