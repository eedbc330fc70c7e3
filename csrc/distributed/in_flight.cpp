#include "distributed/in_flight.h"

#include <algorithm>
#include <cstdlib>

namespace neuronx::distributed {

InFlight::Ranges memory_ranges(const std::vector<at::Tensor>& ts) {
  InFlight::Ranges out;
  for (const auto& t : ts) {
    if (!t.defined() || t.numel() == 0) continue;
    const auto begin = reinterpret_cast<uintptr_t>(t.data_ptr());
    int64_t extent = 1;  // elements from the first to the last one addressed
    for (int64_t i = 0; i < t.dim(); ++i) extent += (t.size(i) - 1) * std::abs(t.stride(i));
    out.emplace_back(begin, begin + extent * t.element_size());
  }
  return out;
}

// Waits until no collective still in flight uses memory that `ranges` overlap,
// then records the new one: the transport runs collectives concurrently, so
// two on the same buffer (allreduce(x) twice) would otherwise race.
std::vector<std::shared_ptr<CollectiveState>> InFlight::overlapping(const Ranges& ranges) {
  auto overlaps = [&](const Ranges& other) {
    for (const auto& a : ranges)
      for (const auto& b : other)
        if (a.first < b.second && b.first < a.second) return true;
    return false;
  };
  entries_.erase(std::remove_if(entries_.begin(), entries_.end(), [](const auto& e) { return e.second->finished(); }),
                 entries_.end());
  std::vector<std::shared_ptr<CollectiveState>> out;
  for (const auto& e : entries_)
    if (overlaps(e.first)) out.push_back(e.second);
  return out;
}

void InFlight::admit(const Ranges& ranges, std::shared_ptr<CollectiveState> state) {
  std::vector<std::shared_ptr<CollectiveState>> wait_for;
  {
    std::lock_guard<std::mutex> g(mu_);
    wait_for = overlapping(ranges);
    entries_.emplace_back(ranges, std::move(state));
  }
  for (const auto& w : wait_for) w->wait_finished();
}

void InFlight::wait_overlapping(const Ranges& ranges) {
  std::vector<std::shared_ptr<CollectiveState>> wait_for;
  {
    std::lock_guard<std::mutex> g(mu_);
    wait_for = overlapping(ranges);
  }
  for (const auto& w : wait_for) w->wait_finished();
}

void InFlight::wait_all() {
  std::vector<std::shared_ptr<CollectiveState>> wait_for;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (const auto& e : entries_) wait_for.push_back(e.second);
  }
  for (const auto& w : wait_for) w->wait_finished();
}

}  // namespace neuronx::distributed
