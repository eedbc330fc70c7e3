#include "nki/tile_allocator.h"

#include <stdexcept>

namespace neuronx::nki {

const char* space_name(Space s) {
  switch (s) {
    case Space::kHbm: return "HBM";
    case Space::kSbuf: return "SBUF";
    case Space::kPsum: return "PSUM";
  }
  return "?";
}

TileAllocator::TileAllocator(Space space, int64_t partition_bytes, int64_t granule)
    : space_(space), capacity_(partition_bytes), granule_(granule) {}

int64_t TileAllocator::allocate(int64_t bytes, const std::string& what) {
  const int64_t size = std::max<int64_t>(granule_, (bytes + granule_ - 1) / granule_ * granule_);
  // First fit over the gaps between live ranges (ordered by offset).
  int64_t at = 0;
  for (const auto& [off, sz] : live_) {
    if (off - at >= size) break;
    at = off + sz;
  }
  if (at + size > capacity_) {
    int64_t largest = 0, prev = 0;
    for (const auto& [off, sz] : live_) {
      largest = std::max(largest, off - prev);
      prev = off + sz;
    }
    largest = std::max(largest, capacity_ - prev);
    throw std::length_error(std::string(space_name(space_)) + " allocation of " + what + " does not fit: " +
                            std::to_string(bytes) + " bytes per partition requested, " +
                            std::to_string(capacity_ - used_) + " of " + std::to_string(capacity_) +
                            " bytes per partition free (largest free range " + std::to_string(largest) +
                            " bytes); a tile is live from its first use to its last use: use smaller tiles or fewer at once");
  }
  live_.emplace(at, size);
  used_ += size;
  peak_ = std::max(peak_, used_);
  return at;
}

void TileAllocator::free(int64_t offset) {
  auto it = live_.find(offset);
  if (it == live_.end()) return;
  used_ -= it->second;
  live_.erase(it);
}

void TileAllocator::reserve(int64_t start, int64_t end) {
  start = start / granule_ * granule_;
  end = (end + granule_ - 1) / granule_ * granule_;
  // Merge with the reserved ranges it overlaps (reservations come before any allocation).
  for (auto it = live_.begin(); it != live_.end();) {
    if (it->first < end && it->first + it->second > start) {
      start = std::min(start, it->first);
      end = std::max(end, it->first + it->second);
      used_ -= it->second;
      it = live_.erase(it);
    } else {
      ++it;
    }
  }
  live_.emplace(start, end - start);
  used_ += end - start;
  peak_ = std::max(peak_, used_);
}

}  // namespace neuronx::nki
