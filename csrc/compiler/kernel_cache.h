#pragma once
// Builds generated C++ into shared objects with the system compiler and keeps
// them in the on-disk executable cache (TORCH_NEURONX_CACHE_DIR, default
// ~/.cache/torch_neuronx; created user-only). Entries are keyed by a hash of
// the source, the compiler and its version, the flags, the host ISA and the
// torch version; they are written to a temporary file and renamed into place
// (two processes building the same entry both succeed), and carry a checksum:
// a corrupted or truncated entry is reported once, removed and rebuilt.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace neuronx::compiler {

using KernelFn = void (*)(char* const* ptrs, const double* scalars, int64_t begin, int64_t end);

struct SharedObject {
  void* handle = nullptr;
  ~SharedObject();
};

// Translation units needed, found valid in the cache, compiled now, and cache entries that
// failed their checksum (rebuilt). Listed once (exported under these names).
#define NEURONX_BUILD_STATS(X) X(kernel_units) X(kernel_cache_hits) X(kernels_built) X(kernel_cache_corrupt)

struct BuildStats {
#define NEURONX_FIELD(f) int f = 0;
  NEURONX_BUILD_STATS(NEURONX_FIELD)
#undef NEURONX_FIELD
};

class KernelCache {
 public:
  static KernelCache& instance();
  // TORCH_NEURONX_CACHE_DIR, default ~/.cache/torch_neuronx (the path only).
  std::string directory() const;
  // directory(), created if missing and checked to be private (rt::private_directory); raises
  // with what to do when it is not. Everything loaded back from the cache lives under it. When
  // it cannot be written (a read-only file system, no permission), a private scratch directory
  // of this process instead (warned once, removed at exit): build_one still reads kernels from
  // directory().
  std::string private_directory() const;
  // Compiles (or loads) each unit's source; returns, per unit, the library
  // and its symbols by name (in `names[i]` order). Units build in parallel.
  std::vector<std::vector<KernelFn>> load(const std::vector<std::string>& sources,
                                          const std::vector<std::vector<std::string>>& names,
                                          std::vector<std::shared_ptr<SharedObject>>& keep, BuildStats& stats);
  std::string hash(const std::string& data) const;

 private:
  KernelCache();
  std::string build_one(const std::string& source, BuildStats& stats);
  // The valid entry `key` in `dir`, counted as a hit; a corrupted or foreign one is counted (and
  // removed if `may_remove`).
  std::optional<std::string> cached(const std::string& dir, const std::string& key, bool may_remove,
                                    BuildStats& stats) const;
  // "" if `dir` (or the ancestor it would be created in) can be written by this process, else why not.
  static std::string unwritable(const std::string& dir);
  std::string scratch_directory(const std::string& read_only, const std::string& why_read_only) const;
  std::string compiler_, flags_, libs_, toolchain_key_;
};

}  // namespace neuronx::compiler
