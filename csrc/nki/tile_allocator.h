#pragma once
// Allocation in a NeuronCore's on-chip memories. A tile takes the same byte
// range in every partition it spans (as NKI's allocator does), so capacity is
// counted per partition. PSUM tiles take whole 2 KiB banks: a matmul
// accumulates into one bank.
#include <cstdint>
#include <map>
#include <string>

namespace neuronx::nki {

enum class Space : uint8_t { kHbm = 0, kSbuf = 1, kPsum = 2 };
const char* space_name(Space s);

class TileAllocator {
 public:
  TileAllocator(Space space, int64_t partition_bytes, int64_t granule);
  // Byte offset within each partition of a new range of `bytes` (per
  // partition). Throws std::length_error naming the buffer, the bytes asked
  // for and the bytes free when it does not fit.
  int64_t allocate(int64_t bytes, const std::string& what);
  void free(int64_t offset);
  // Takes [start, end) (rounded out to the granule) for the whole program:
  // manually placed tiles, which automatic placement must not overlap.
  void reserve(int64_t start, int64_t end);
  int64_t used() const { return used_; }
  int64_t peak() const { return peak_; }
  int64_t capacity() const { return capacity_; }

 private:
  Space space_;
  int64_t capacity_, granule_;
  std::map<int64_t, int64_t> live_;  // offset -> rounded size
  int64_t used_ = 0, peak_ = 0;
};

}  // namespace neuronx::nki
