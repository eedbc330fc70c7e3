#include "runtime/telemetry.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>

namespace neuronx::rt::telemetry {

namespace {

std::atomic<Segment*> g_segment{nullptr};
pid_t g_owner = 0;
std::mutex g_mu;

std::string command_line() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  for (char& c : raw)
    if (c == '\0') c = ' ';
  while (!raw.empty() && raw.back() == ' ') raw.pop_back();
  return raw;
}

}  // namespace

std::string segment_name(int64_t pid) { return "/torch_neuronx." + std::to_string(pid); }

void unpublish() {
  std::lock_guard<std::mutex> g(g_mu);
  // A forked child inherits the mapping but not the segment: only the
  // creating process removes it.
  if (g_segment.load() && g_owner == getpid()) shm_unlink(segment_name(g_owner).c_str());
}

void publish(int num_cores) {
  std::lock_guard<std::mutex> g(g_mu);
  if (g_segment.load()) return;
  if (const char* v = std::getenv("TORCH_NEURONX_TELEMETRY"); v && std::strcmp(v, "0") == 0) return;
  const pid_t pid = getpid();
  const std::string name = segment_name(pid);
  // User-only: other users' tools should not read our counters. The name is predictable, so a
  // segment already there is used only if it is ours (left by an earlier process with this pid);
  // one another user made is left alone, and this process publishes nothing.
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 && errno == EEXIST) {
    struct stat st{};
    const int old = shm_open(name.c_str(), O_RDONLY, 0);
    const bool ours = old >= 0 && fstat(old, &st) == 0 && st.st_uid == geteuid();
    if (old >= 0) close(old);
    if (!ours) return;
    shm_unlink(name.c_str());
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  }
  if (fd < 0) return;
  if (ftruncate(fd, sizeof(Segment)) != 0) {
    close(fd);
    shm_unlink(name.c_str());
    return;
  }
  void* p = mmap(nullptr, sizeof(Segment), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name.c_str());
    return;
  }
  auto* s = new (p) Segment{};
  s->version = kVersion;
  s->num_cores = static_cast<uint32_t>(num_cores < kMaxCores ? num_cores : kMaxCores);
  s->pid = pid;
  s->start_unix_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
  const std::string cmd = command_line();
  std::strncpy(s->command, cmd.c_str(), kCommandBytes - 1);
  for (auto& c : s->cores) c.physical_core.store(-1, std::memory_order_relaxed);
  // Readers ignore the segment until the magic is written.
  std::atomic_thread_fence(std::memory_order_release);
  s->magic = kMagic;
  g_owner = pid;
  g_segment.store(s, std::memory_order_release);
  std::atexit(&unpublish);
}

CoreCounters* core(int index) {
  Segment* s = g_segment.load(std::memory_order_acquire);
  if (!s || index < 0 || index >= static_cast<int>(s->num_cores)) return nullptr;
  return &s->cores[index];
}

}  // namespace neuronx::rt::telemetry
