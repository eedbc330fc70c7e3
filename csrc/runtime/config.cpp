#include "runtime/config.h"
#include "runtime/queue.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <set>

#include "runtime/error.h"

namespace neuronx::rt {

namespace {

[[noreturn]] void bad(const std::string& name, const std::string& value, const std::string& expect) {
  throw Error(ErrorCode::kInvalidArgument,
              name + "='" + value + "' is invalid: " + expect);
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t");
  size_t e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

}  // namespace

std::string TaskError::describe() const {
  std::string s = "neuron kernel '" + op + "' failed: " + message;
  const std::string where = resolve_origin(origin);
  if (!where.empty()) s += " (enqueued at " + where + ")";
  return s;
}

size_t host_physical_memory() {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
}

int parse_positive_int(const std::string& name, const std::string& value, int max_value) {
  std::string v = trim(value);
  if (!all_digits(v) || v.size() > 6) bad(name, value, "expected a positive integer");
  int n = std::stoi(v);
  if (n < 1 || n > max_value)
    bad(name, value, "expected an integer between 1 and " + std::to_string(max_value));
  return n;
}

size_t parse_bytes(const std::string& name, const std::string& value) {
  std::string v = trim(value);
  size_t i = 0;
  while (i < v.size() && (std::isdigit(static_cast<unsigned char>(v[i])) || v[i] == '.')) ++i;
  std::string num = v.substr(0, i), unit = trim(v.substr(i));
  const std::string expect = "expected a size such as 16GiB, 512MiB, 8G or a byte count";
  if (num.empty() || std::count(num.begin(), num.end(), '.') > 1) bad(name, value, expect);
  std::string u;
  for (char c : unit) u += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult;
  if (u.empty() || u == "b") mult = 1;
  else if (u == "k" || u == "kb" || u == "kib") mult = 1024.0;
  else if (u == "m" || u == "mb" || u == "mib") mult = 1024.0 * 1024;
  else if (u == "g" || u == "gb" || u == "gib") mult = 1024.0 * 1024 * 1024;
  else if (u == "t" || u == "tb" || u == "tib") mult = 1024.0 * 1024 * 1024 * 1024;
  else bad(name, value, expect);
  double bytes = 0;
  try {
    bytes = std::stod(num) * mult;  // "." or a 400-digit number: stod throws its own exceptions
  } catch (const std::exception&) {
    bad(name, value, expect);
  }
  if (bytes < 1 || bytes > 1e18) bad(name, value, expect);
  return static_cast<size_t>(bytes);
}

std::vector<int> parse_core_list(const std::string& name, const std::string& value, int num_cores) {
  const std::string expect = "expected core ids such as '0', '1-3' or '0,2', each below " +
                             std::to_string(num_cores) + " (TORCH_NEURONX_SIM_CORES)";
  std::vector<int> out;
  std::set<int> seen;
  std::string v = trim(value);
  if (v.empty()) bad(name, value, expect);
  size_t pos = 0;
  while (pos <= v.size()) {
    size_t comma = v.find(',', pos);
    std::string item = trim(v.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    size_t dash = item.find('-');
    std::string a = trim(item.substr(0, dash));
    std::string b = dash == std::string::npos ? a : trim(item.substr(dash + 1));
    if (!all_digits(a) || !all_digits(b) || a.size() > 6 || b.size() > 6) bad(name, value, expect);
    int lo = std::stoi(a), hi = std::stoi(b);
    if (lo > hi || hi >= num_cores) bad(name, value, expect);
    for (int c = lo; c <= hi; ++c) {
      if (!seen.insert(c).second) bad(name, value, "core " + std::to_string(c) + " is listed twice");
      out.push_back(c);
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

void parse_alloc_conf(const std::string& value, Config& c) {
  static const char* kName = "TORCH_NEURONX_ALLOC_CONF";
  size_t pos = 0;
  while (pos <= value.size()) {
    const size_t comma = value.find(',', pos);
    const std::string item = trim(value.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    if (!item.empty()) {
      const size_t colon = item.find(':');
      if (colon == std::string::npos) bad(kName, value, "expected key:value pairs separated by commas");
      const std::string key = trim(item.substr(0, colon)), v = trim(item.substr(colon + 1));
      double x = 0;
      try {
        size_t used = 0;
        x = std::stod(v, &used);
        if (used != v.size()) throw std::invalid_argument(v);
      } catch (const std::exception&) {
        bad(kName, value, "'" + key + "' takes a number, got '" + v + "'");
      }
      if (key == "per_process_memory_fraction") {
        if (!(x > 0 && x <= 1)) bad(kName, value, "per_process_memory_fraction must be in (0, 1]");
        c.memory_fraction = x;
      } else if (key == "garbage_collection_threshold") {
        if (!(x > 0 && x < 1)) bad(kName, value, "garbage_collection_threshold must be in (0, 1)");
        c.gc_threshold = x;
      } else {
        bad(kName, value,
            "unknown key '" + key + "' (supported: per_process_memory_fraction, garbage_collection_threshold)");
      }
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
}

Config make_config(const char* sim_cores, const char* visible, const char* hbm,
                   const char* launch_blocking, size_t host_bytes, const char* alloc_conf) {
  Config c;
  try {
    if (sim_cores && *sim_cores) c.sim_cores = parse_positive_int("TORCH_NEURONX_SIM_CORES", sim_cores, 64);
    if (visible && *visible) {
      c.visible = parse_core_list("NEURON_RT_VISIBLE_CORES", visible, c.sim_cores);
    } else {
      for (int i = 0; i < c.sim_cores; ++i) c.visible.push_back(i);
    }
    c.hbm_bytes = size_t{16} << 30;
    if (hbm && *hbm) c.hbm_bytes = parse_bytes("TORCH_NEURONX_SIM_HBM", hbm);
    // Device memory is host memory: never promise more than the host has.
    if (host_bytes > 0) c.hbm_bytes = std::min(c.hbm_bytes, host_bytes);
    if (launch_blocking && *launch_blocking) {
      std::string lb = trim(launch_blocking);
      if (lb != "0" && lb != "1")
        bad("NEURON_LAUNCH_BLOCKING", launch_blocking, "expected 0 or 1");
      c.launch_blocking = lb == "1";
    }
    if (alloc_conf && *alloc_conf) parse_alloc_conf(alloc_conf, c);
  } catch (const Error& e) {
    c.error = e.what();
    c.visible.clear();
  }
  return c;
}

const Config& config() {
  static const Config c = make_config(
      std::getenv("TORCH_NEURONX_SIM_CORES"), std::getenv("NEURON_RT_VISIBLE_CORES"),
      std::getenv("TORCH_NEURONX_SIM_HBM"), std::getenv("NEURON_LAUNCH_BLOCKING"),
      host_physical_memory(), std::getenv("TORCH_NEURONX_ALLOC_CONF"));
  return c;
}

}  // namespace neuronx::rt
