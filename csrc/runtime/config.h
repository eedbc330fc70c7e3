#pragma once
// Process-wide configuration of the simulated device, read once from the
// environment. Parsing is strict: a bad value is an error that names the
// variable and the accepted forms, never a silent default.
#include <cstddef>
#include <string>
#include <vector>

namespace neuronx::rt {

struct Config {
  int sim_cores = 2;                 // TORCH_NEURONX_SIM_CORES
  std::vector<int> visible;          // physical core ids this process sees
  size_t hbm_bytes = 0;              // per-core capacity after host bound
  bool launch_blocking = false;      // NEURON_LAUNCH_BLOCKING=1
  // TORCH_NEURONX_ALLOC_CONF ("key:value,key:value", as PYTORCH_CUDA_ALLOC_CONF)
  double memory_fraction = 0;        // per_process_memory_fraction: cap as a share of capacity (0: none)
  double gc_threshold = 0;           // garbage_collection_threshold: free idle cache above this share (0: off)
  std::string error;                 // non-empty when the environment is invalid
};

// Parsed once per process (thread-safe). Never throws.
const Config& config();

// Parsers, exposed for tests. Throw rt::Error(kInvalidArgument) on bad input.
size_t parse_bytes(const std::string& name, const std::string& value);
std::vector<int> parse_core_list(const std::string& name, const std::string& value, int num_cores);
int parse_positive_int(const std::string& name, const std::string& value, int max_value);

// Builds a Config from explicit values (what config() does with getenv).
Config make_config(const char* sim_cores, const char* visible, const char* hbm,
                   const char* launch_blocking, size_t host_bytes, const char* alloc_conf = nullptr);

// Applies TORCH_NEURONX_ALLOC_CONF to c. Throws rt::Error(kInvalidArgument).
void parse_alloc_conf(const std::string& value, Config& c);

size_t host_physical_memory();

}  // namespace neuronx::rt
