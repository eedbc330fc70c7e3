#include "compiler/kernel_cache.h"
#include "runtime/private_files.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/Version.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <optional>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>

namespace neuronx::compiler {

namespace {

// FNV-1a over 64 bits, twice with different bases: a 128-bit content hash.
std::string hash128(const std::string& data) {
  uint64_t a = 1469598103934665603ULL, b = 1099511628211ULL ^ 0x9e3779b97f4a7c15ULL;
  for (unsigned char c : data) {
    a = (a ^ c) * 1099511628211ULL;
    b = (b ^ c) * 0x100000001b3ULL + 0x7f4a7c15ULL;
  }
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(a),
                static_cast<unsigned long long>(b));
  return buf;
}

std::string run_capture(const std::string& cmd) {
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    std::array<char, 512> buf{};
    while (fgets(buf.data(), buf.size(), p)) out += buf.data();
    pclose(p);
  }
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& data) {
  TORCH_CHECK(rt::write_private_file(path, data), "torch_neuronx compiler: could not write ", path, ": ",
              std::strerror(errno));
}

bool exists(const std::string& p) { return ::access(p.c_str(), F_OK) == 0; }

std::string temp_name(const std::string& dir, const std::string& stem) {
  static std::mt19937_64 rng(std::random_device{}());
  static std::mutex mu;
  std::lock_guard<std::mutex> g(mu);
  return dir + "/.tmp-" + std::to_string(::getpid()) + "-" + std::to_string(rng()) + "-" + stem;
}

std::once_flag g_corrupt_warned;

// The torch installation this process runs (for headers and libraries): libtorch_cpu's directory's parent.
std::string torch_root() {
  Dl_info info{};
  TORCH_CHECK(::dladdr(reinterpret_cast<void*>(&at::get_cpu_capability), &info) && info.dli_fname,
              "torch_neuronx compiler: cannot locate libtorch_cpu");
  std::string lib = info.dli_fname;
  lib = lib.substr(0, lib.rfind('/'));     // .../torch/lib
  return lib.substr(0, lib.rfind('/'));    // .../torch
}

// The vector ISA eager's kernels run with (ATen_CPU_CAPABILITY honoured): generated code uses the same.
std::string capability_flags() {
  const std::string cap = at::get_cpu_capability();  // "AVX512", "AVX2" or "DEFAULT"
  if (cap == "AVX512")
    return "-DCPU_CAPABILITY=AVX512 -DCPU_CAPABILITY_AVX512 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma";
  if (cap == "AVX2") return "-DCPU_CAPABILITY=AVX2 -DCPU_CAPABILITY_AVX2 -mavx2 -mfma";
  return "-DCPU_CAPABILITY=DEFAULT";
}

}  // namespace

SharedObject::~SharedObject() {
  if (handle) ::dlclose(handle);
}

KernelCache& KernelCache::instance() {
  static KernelCache* c = new KernelCache();
  return *c;
}

KernelCache::KernelCache() {
  const char* cxx = std::getenv("CXX");
  compiler_ = cxx && *cxx ? cxx : "c++";
  // Inductor's CPU flags: optimized, tuned for this host, IEEE math (no fast-math).
  const std::string root = torch_root();
  flags_ = "-O3 -march=native -fPIC -shared -std=c++17 -fno-math-errno -fno-trapping-math -w " + capability_flags() +
           " -I" + root + "/include";
  libs_ = "-L" + root + "/lib -Wl,-rpath," + root + "/lib -ltorch_cpu -lc10";  // after the source (--as-needed)
  const std::string version = run_capture(compiler_ + " --version 2>/dev/null | head -1");
  TORCH_CHECK(!version.empty(), "torch_neuronx compiler: the C++ compiler '", compiler_,
              "' was not found. Install g++ (Debian: apt-get install g++) or set CXX.");
  // The host ISA: what -march=native resolves to.
  const std::string isa = run_capture(compiler_ + " -march=native -Q --help=target 2>/dev/null | grep -E "
                                      "'^ +-march=|^ +-m(avx|sse|fma|bmi)[^ ]* +\\[enabled\\]'");
  toolchain_key_ = hash128(compiler_ + "|" + version + "|" + flags_ + "|" + libs_ + "|" + isa + "|" + TORCH_VERSION +
                           "|compiler-v1");
}

std::string KernelCache::directory() const {
  const char* d = std::getenv("TORCH_NEURONX_CACHE_DIR");
  if (d && *d) return d;
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.cache/torch_neuronx";
}

std::string KernelCache::private_directory() const {
  const std::string dir = directory();
  if (const std::string why = unwritable(dir); !why.empty()) return scratch_directory(dir, why);
  const std::string why = rt::private_directory(dir);
  TORCH_CHECK(why.empty(), "torch_neuronx compiler: the cache directory ", dir, " is not private (", why,
              "). Compiled kernels and graphs are loaded back from it, so only you may be able to change it: "
              "make it yours with mode 700 (chmod 700 ", dir, "), or set TORCH_NEURONX_CACHE_DIR to such a directory.");
  return dir;
}

std::string KernelCache::unwritable(const std::string& dir) {
  // The directory, or else its nearest existing ancestor (where it would be created).
  std::string cur = dir;
  struct stat st{};
  while (::stat(cur.c_str(), &st) != 0 && errno == ENOENT) {
    const auto slash = cur.find_last_of('/');
    if (slash == std::string::npos || slash == 0) {
      cur = slash == 0 ? "/" : ".";
      break;
    }
    cur.resize(slash);
  }
  if (::access(cur.c_str(), W_OK | X_OK) == 0) return "";
  return cur + ": " + std::strerror(errno);
}

std::string KernelCache::scratch_directory(const std::string& read_only, const std::string& why_read_only) const {
  static std::once_flag once;
  static std::string scratch;
  static pid_t owner = 0;
  std::call_once(once, [&] {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/torch_neuronx-" + std::to_string(::getpid()) +
                        "-XXXXXX";
    TORCH_CHECK(::mkdtemp(templ.data()), "torch_neuronx compiler: the cache directory ", read_only,
                " cannot be written and no scratch directory could be made under ", templ, ": ",
                std::strerror(errno), ". Set TORCH_NEURONX_CACHE_DIR to a writable directory.");
    scratch = templ;
    owner = ::getpid();
    // Kernels of this process stay mapped after their files are gone; nothing else reads them.
    // A forked child that exits normally runs this too: only the creator removes it.
    std::atexit([] {
      std::error_code ec;
      if (::getpid() == owner) std::filesystem::remove_all(scratch, ec);
    });
    TORCH_WARN("torch_neuronx compiler: the cache directory ", read_only, " cannot be written (",
               why_read_only, "). Kernels found there are used; kernels and graphs "
               "compiled now are kept for this process only (in ", scratch, ", removed at exit). Set "
               "TORCH_NEURONX_CACHE_DIR to a writable directory to keep them.");
  });
  const std::string why = rt::private_directory(scratch);
  TORCH_CHECK(why.empty(), "torch_neuronx compiler: the scratch directory ", scratch, " is not private (", why, ").");
  return scratch;
}

std::string KernelCache::hash(const std::string& data) const { return hash128(toolchain_key_ + "|" + data); }

std::optional<std::string> KernelCache::cached(const std::string& dir, const std::string& key, bool may_remove,
                                               BuildStats& stats) const {
  const std::string so = dir + "/" + key + ".so", sum = dir + "/" + key + ".sum";
  if (!exists(so) || !exists(sum)) return std::nullopt;
  // Loaded only if this user wrote it and no one else can have changed it since.
  const bool mine = rt::private_file(so) && rt::private_file(sum);
  if (mine && read_file(sum) == hash128(read_file(so))) {
    stats.kernel_cache_hits++;
    return so;
  }
  std::call_once(g_corrupt_warned, [&] {
    TORCH_WARN("torch_neuronx compiler: the cache entry ", so, mine ? " is corrupted or truncated (checksum mismatch)"
                                                                    : " is not private (another user wrote it, or others can change it)",
               may_remove ? "; it is removed and rebuilt." : "; it is rebuilt for this process (the cache is read-only).");
  });
  stats.kernel_cache_corrupt++;
  if (may_remove) {
    ::unlink(so.c_str());
    ::unlink(sum.c_str());
  }
  return std::nullopt;
}

std::string KernelCache::build_one(const std::string& source, BuildStats& stats) {
  const std::string home = directory() + "/kernels";
  const std::string dir = private_directory() + "/kernels";
  const std::string why = rt::private_directory(dir);
  TORCH_CHECK(why.empty(), "torch_neuronx compiler: the kernel cache ", dir, " is not private (", why,
              "). Remove it, or set TORCH_NEURONX_CACHE_DIR to a directory only you can change.");
  const std::string key = hash(source);
  // A read-only cache still serves the kernels it holds, if it is private.
  if (dir != home && exists(home) && rt::private_directory(home).empty())
    if (auto hit = cached(home, key, /*may_remove=*/false, stats)) return *hit;
  if (auto hit = cached(dir, key, /*may_remove=*/true, stats)) return *hit;
  const std::string so = dir + "/" + key + ".so", sum = dir + "/" + key + ".sum";
  const std::string src = temp_name(dir, key + ".cpp"), tmp_so = temp_name(dir, key + ".so");
  write_file(src, source);
  const std::string cmd = compiler_ + " " + flags_ + " -o '" + tmp_so + "' '" + src + "' " + libs_ + " 2>&1";
  const std::string log = run_capture(cmd + "; echo \"rc=$?\"");
  ::unlink(src.c_str());
  if (log.find("rc=0") == std::string::npos || !exists(tmp_so)) {
    ::unlink(tmp_so.c_str());
    TORCH_CHECK(false, "torch_neuronx compiler: building a generated kernel failed:\n", log,
                "\nSet TORCH_NEURONX_DEBUG_DIR to keep the generated source.");
  }
  // User-only (the compiler made it with the umask's mode).
  TORCH_CHECK(::chmod(tmp_so.c_str(), 0700) == 0, "torch_neuronx compiler: cannot set the mode of ", tmp_so, ": ",
              std::strerror(errno));
  // The checksum goes in first: a reader that sees the .so also sees its checksum.
  const std::string tmp_sum = temp_name(dir, key + ".sum");
  write_file(tmp_sum, hash128(read_file(tmp_so)));
  TORCH_CHECK(::rename(tmp_sum.c_str(), sum.c_str()) == 0, "torch_neuronx compiler: cannot write ", sum);
  TORCH_CHECK(::rename(tmp_so.c_str(), so.c_str()) == 0, "torch_neuronx compiler: cannot write ", so);
  stats.kernels_built++;
  return so;
}

std::vector<std::vector<KernelFn>> KernelCache::load(const std::vector<std::string>& sources,
                                                     const std::vector<std::vector<std::string>>& names,
                                                     std::vector<std::shared_ptr<SharedObject>>& keep,
                                                     BuildStats& stats) {
  stats.kernel_units = static_cast<int>(sources.size());
  std::vector<std::string> paths(sources.size());
  std::vector<std::string> errors(sources.size());
  std::vector<BuildStats> per(sources.size());
  std::vector<std::thread> threads;
  const size_t parallel = std::max<size_t>(1, std::thread::hardware_concurrency());
  for (size_t start = 0; start < sources.size(); start += parallel) {
    for (size_t i = start; i < std::min(sources.size(), start + parallel); ++i)
      threads.emplace_back([&, i] {
        try {
          paths[i] = build_one(sources[i], per[i]);
        } catch (const c10::Error& e) {
          errors[i] = e.what_without_backtrace();
        } catch (const std::exception& e) {
          errors[i] = e.what();
        }
      });
    for (auto& t : threads) t.join();
    threads.clear();
  }
  for (const auto& p : per) {
    stats.kernel_cache_hits += p.kernel_cache_hits;
    stats.kernels_built += p.kernels_built;
    stats.kernel_cache_corrupt += p.kernel_cache_corrupt;
  }
  for (const auto& e : errors) TORCH_CHECK(e.empty(), e);
  std::vector<std::vector<KernelFn>> fns(sources.size());
  for (size_t i = 0; i < sources.size(); ++i) {
    auto lib = std::make_shared<SharedObject>();
    lib->handle = ::dlopen(paths[i].c_str(), RTLD_NOW | RTLD_LOCAL);
    TORCH_CHECK(lib->handle, "torch_neuronx compiler: cannot load ", paths[i], ": ", ::dlerror(),
                ". Remove the cache directory ", directory(), " to rebuild.");
    for (const auto& n : names[i]) {
      void* sym = ::dlsym(lib->handle, n.c_str());
      TORCH_CHECK(sym, "torch_neuronx compiler: ", paths[i], " lacks kernel ", n);
      fns[i].push_back(reinterpret_cast<KernelFn>(sym));
    }
    keep.push_back(std::move(lib));
  }
  return fns;
}

}  // namespace neuronx::compiler
