#include "backend/metrics.h"

#include <array>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace neuronx {

namespace {
std::mutex g_mu;
std::unordered_map<std::string, std::unique_ptr<OpCounters>>& table() {
  static auto* t = new std::unordered_map<std::string, std::unique_ptr<OpCounters>>;
  return *t;
}
std::array<std::atomic<uint64_t>, static_cast<size_t>(SyncReason::kNumReasons)> g_syncs{};
const char* kSyncNames[] = {"copy_to_host", "item", "data_dependent", "blocking_copy"};
// Written by engine threads every op: a line of its own.
struct alignas(64) AliasCounts {
  std::atomic<uint64_t> made{0}, reused{0};
};
AliasCounts g_aliases;
}  // namespace

OpCounters& op_counters(const std::string& name) {
  std::lock_guard<std::mutex> g(g_mu);
  auto& slot = table()[name];
  if (!slot) slot = std::make_unique<OpCounters>();
  return *slot;
}

void count_sync(SyncReason r) { g_syncs[static_cast<size_t>(r)].fetch_add(1, std::memory_order_relaxed); }

void count_alias(bool reused) { (reused ? g_aliases.reused : g_aliases.made).fetch_add(1, std::memory_order_relaxed); }

MetricsSnapshot metrics_snapshot() {
  MetricsSnapshot s;
  {
    std::lock_guard<std::mutex> g(g_mu);
    for (auto& [name, c] : table()) {
      std::map<std::string, uint64_t> m;
      if (auto v = c->async.load()) m["async"] = v;
      if (auto v = c->sync.load()) m["sync"] = v;
      if (auto v = c->view.load()) m["view"] = v;
      if (auto v = c->native.load()) m["native"] = v;
      if (auto v = c->device_kernel.load()) m["device_kernel"] = v;
      if (!m.empty()) s.ops[name] = std::move(m);
    }
  }
  for (size_t i = 0; i < g_syncs.size(); ++i) s.syncs[kSyncNames[i]] = g_syncs[i].load();
  s.aliases["made"] = g_aliases.made.load();
  s.aliases["reused"] = g_aliases.reused.load();
  return s;
}

void reset_metrics() {
  std::lock_guard<std::mutex> g(g_mu);
  for (auto& [name, c] : table()) c->async = c->sync = c->view = c->native = c->device_kernel = 0;
  for (auto& v : g_syncs) v = 0;
  g_aliases.made = 0;
  g_aliases.reused = 0;
}

}  // namespace neuronx
