#include "distributed/peer_access.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <chrono>
#include <functional>
#include <random>
#include <sstream>
#include <string>

namespace neuronx::distributed {

// A rank's part of the shared block, on its own cache line. Each word is
// written by its rank only; `waiters` counts the peers asleep on its words,
// so a rank makes the wake-up system call only when someone sleeps.
struct PeerLink::Slot {
  std::atomic<uint32_t> announced, finished, waiters;
  std::atomic<uint32_t> broken;  // 1: this rank gave up on the group (mark_broken)
  std::atomic<uint64_t> address;
  std::atomic<int64_t> bytes;
  std::atomic<uint64_t> check;
  char pad[24];
};
static_assert(sizeof(PeerLink::Slot) == 64, "one cache line per rank");
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "the shared block needs lock-free atomics (they work across processes)");

bool peer_access_requested() {
  const char* v = std::getenv("TORCH_NEURONX_DIST_PEER_ACCESS");
  if (!v) return true;
  const std::string s = v;
  TORCH_CHECK_VALUE(s == "0" || s == "1", "TORCH_NEURONX_DIST_PEER_ACCESS=", s,
                    ": expected 1 (ranks on one host read and write each other's device memory, the default) or 0 "
                    "(every byte goes through Gloo)");
  return s == "1";
}

namespace {

// Processes with the same identity share a boot, a network namespace (the
// unit a "host" is for the transport: ranks in two namespaces joined by a
// veth pair are two hosts) and a pid namespace (their pids mean the same).
uint64_t host_identity() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  if (boot.empty()) return 0;
  uint64_t h = std::hash<std::string>{}(boot);
  for (const char* ns : {"/proc/self/ns/net", "/proc/self/ns/pid"}) {
    struct stat st {};
    if (stat(ns, &st) != 0) return 0;  // unknown: no peer access
    h = (h * 0x9e3779b97f4a7c15ULL) ^ static_cast<uint64_t>(st.st_ino) ^ (static_cast<uint64_t>(st.st_dev) << 40);
  }
  return h == 0 ? 1 : h;
}

// Where pidfds are missing: a process is alive while kill() reaches it and
// /proc/PID/stat (field 3, after the name in parentheses) is not a zombie's.
bool alive_by_pid(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::stringstream all;
  all << f.rdbuf();  // the whole file: a process name may hold a newline
  const std::string text = all.str();
  const auto close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return false;
  const char state = text[close + 2];
  return state != 'Z' && state != 'X';
}


long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

bool reached(uint32_t value, uint64_t n) {  // wraps around after 2^32 collectives
  return static_cast<int32_t>(value - static_cast<uint32_t>(n)) >= 0;
}

template <typename Call>
void transfer(const char* what, pid_t pid, int peer, char* local, uintptr_t remote, size_t bytes, Call call) {
  while (bytes > 0) {
    iovec l{local, bytes}, r{reinterpret_cast<void*>(remote), bytes};
    const ssize_t n = call(pid, &l, 1, &r, 1, 0);
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      TORCH_CHECK(false, "peer access: could not ", what, " the device memory of rank ", peer, " (pid ", pid, "): ",
                  std::strerror(err), err == ESRCH ? " (the process has exited)" : "");
    }
    local += n;
    remote += static_cast<uintptr_t>(n);
    bytes -= static_cast<size_t>(n);
  }
}

size_t block_bytes(int size) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (static_cast<size_t>(size) * sizeof(PeerLink::Slot) + page - 1) / page * page;
}

}  // namespace

std::shared_ptr<PeerLink> PeerLink::negotiate(c10d::Backend& control) {
  const int n = control.getSize(), rank = control.getRank();
  constexpr int64_t kWords = 7, kMagic = 0x4e4e5850;  // "NNXP"
  std::string bad_setting;
  bool requested = false;
  try {
    requested = peer_access_requested() && n > 1;
  } catch (const c10::ValueError& e) {
    bad_setting = e.what_without_backtrace();
  }
  // The shared block: created by rank 0, opened by the others through its
  // descriptor in /proc (allowed where reading its memory is).
  const size_t bytes = block_bytes(n);
  int fd = -1;
  void* block = MAP_FAILED;
  std::vector<int> pidfds(n, -1);
  auto release = [&] {
    if (fd >= 0) ::close(fd);
    fd = -1;
  };
  auto unmap = [&] {
    if (block != MAP_FAILED) munmap(block, bytes);
    block = MAP_FAILED;
    for (int& p : pidfds)
      if (p >= 0) ::close(p), p = -1;
  };
  if (requested && rank == 0) {
    fd = static_cast<int>(syscall(SYS_memfd_create, "torch_neuronx_peer_access", MFD_CLOEXEC));
    if (fd >= 0 && ftruncate(fd, static_cast<off_t>(bytes)) == 0)
      block = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  // A word peers read back: a fresh random token, so a pid that names some
  // other process cannot pass.
  std::mt19937_64 seed(static_cast<uint64_t>(getpid()) ^
                       static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  volatile uint64_t probe = seed() | 1;
  at::Tensor mine = at::empty({kWords}, at::kLong), all = at::empty({n * kWords}, at::kLong);
  int64_t* m = mine.data_ptr<int64_t>();
  m[0] = kMagic;
  m[1] = requested && (rank != 0 || block != MAP_FAILED) ? static_cast<int64_t>(host_identity()) : 0;
  m[2] = getpid();
  m[3] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(&probe));
  m[4] = static_cast<int64_t>(probe);
  m[5] = bad_setting.empty() ? 0 : 1;
  m[6] = fd;
  try {
    control._allgather_base(all, mine)->wait();
  } catch (...) {
    release();
    unmap();
    throw;
  }
  const int64_t* a = all.data_ptr<int64_t>();
  for (int r = 0; r < n; ++r) {
    if (a[r * kWords + 5] == 0) continue;
    release();  // every rank raises here, at the same point
    unmap();
    TORCH_CHECK_VALUE(bad_setting.empty(), bad_setting);
    TORCH_CHECK_VALUE(false, "rank ", r, " of this group has a bad TORCH_NEURONX_DIST_PEER_ACCESS (see its error)");
  }
  bool ok = m[1] != 0;
  std::vector<pid_t> pids(n);
  for (int r = 0; r < n && ok; ++r) {
    const int64_t* x = a + r * kWords;
    ok = x[0] == kMagic && x[1] == m[1];
    pids[r] = static_cast<pid_t>(x[2]);
    if (!ok || r == rank) continue;
    uint64_t seen = 0;
    iovec l{&seen, sizeof seen}, rem{reinterpret_cast<void*>(static_cast<uintptr_t>(x[3])), sizeof seen};
    ok = process_vm_readv(pids[r], &l, 1, &rem, 1, 0) == static_cast<ssize_t>(sizeof seen) &&
         seen == static_cast<uint64_t>(x[4]);
    pidfds[r] = static_cast<int>(syscall(SYS_pidfd_open, pids[r], 0));  // -1: alive_by_pid()
  }
  if (ok && rank != 0) {
    const std::string path = "/proc/" + std::to_string(pids[0]) + "/fd/" + std::to_string(a[6]);
    fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd >= 0) block = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ok = block != MAP_FAILED;
  }
  // Everyone agrees. Until this exchange returns, every rank's probe word and
  // rank 0's descriptor are still there for the others.
  at::Tensor flag = at::empty({1}, at::kLong), flags = at::empty({n}, at::kLong);
  flag.data_ptr<int64_t>()[0] = ok ? 1 : 0;
  std::exception_ptr failed;
  try {
    control._allgather_base(flags, flag)->wait();
  } catch (...) {
    failed = std::current_exception();
  }
  release();  // the mapping stays
  for (int r = 0; r < n && ok && !failed; ++r) ok = flags.data_ptr<int64_t>()[r] == 1;
  if (!ok || failed) {
    unmap();
    if (failed) std::rethrow_exception(failed);
    return nullptr;
  }
  return std::shared_ptr<PeerLink>(new PeerLink(rank, std::move(pids), std::move(pidfds), static_cast<Slot*>(block), bytes));
}

PeerLink::PeerLink(int rank, std::vector<pid_t> pids, std::vector<int> pidfds, Slot* slots, size_t mapped)
    : rank_(rank), pids_(std::move(pids)), pidfds_(std::move(pidfds)), slots_(slots), mapped_(mapped) {}

PeerLink::~PeerLink() {
  munmap(slots_, mapped_);
  for (int p : pidfds_)
    if (p >= 0) ::close(p);
}

bool PeerLink::alive(int peer) const {
  if (pidfds_[peer] < 0) return alive_by_pid(pids_[peer]);
  pollfd p{pidfds_[peer], POLLIN, 0};  // readable once the process has exited
  return poll(&p, 1, 0) == 0;
}

void PeerLink::publish(std::atomic<uint32_t> Slot::*word, uint64_t n) {
  Slot& me = slots_[rank_];
  (me.*word).store(static_cast<uint32_t>(n), std::memory_order_seq_cst);
  if (me.waiters.load(std::memory_order_seq_cst) > 0) futex(&(me.*word), FUTEX_WAKE, INT_MAX, nullptr);
}

void PeerLink::await(std::atomic<uint32_t> Slot::*word, int peer, uint64_t n,
                     std::chrono::steady_clock::time_point deadline, const char* what) {
  Slot& p = slots_[peer];
  std::atomic<uint32_t>& w = p.*word;
  // The peer is never ahead: it waits for this rank at every collective. A
  // peer that is means the ranks numbered their collectives differently.
  auto done = [&](uint32_t value) {
    if (value == static_cast<uint32_t>(n)) return true;
    TORCH_CHECK(!reached(value, n + 1), "peer access: rank ", peer, " is at collective ", value,
                " of the group's peer-access collectives and this rank at ", n,
                ": the ranks took different paths for some collective (or one dropped one); the group cannot be "
                "used any more");
    TORCH_CHECK(p.broken.load(std::memory_order_acquire) == 0, "peer access: rank ", peer,
                " gave up on the group (see its error) before it ", what, " collective ", n);
    return false;
  };
  // A short spin first: the peer is usually moments behind.
  for (int i = 0; i < 200; ++i) {
    if (done(w.load(std::memory_order_acquire))) return;
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  for (;;) {
    p.waiters.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = w.load(std::memory_order_seq_cst);
    if (seen != static_cast<uint32_t>(n) && p.broken.load(std::memory_order_seq_cst) == 0) {
      timespec slice{0, 50 * 1000 * 1000};  // then check that the peer lives and the deadline
      futex(&w, FUTEX_WAIT, seen, &slice);
    }
    p.waiters.fetch_sub(1, std::memory_order_seq_cst);
    if (done(w.load(std::memory_order_acquire))) return;
    TORCH_CHECK(alive(peer), "peer access: rank ", peer, " (pid ", pids_[peer], ") exited before it ", what,
                " collective ", n, " of its group");
    TORCH_CHECK(std::chrono::steady_clock::now() < deadline, "peer access: rank ", peer, " has not ", what,
                " collective ", n, " of its group within the group's timeout");
  }
}

void PeerLink::announce(uint64_t n, const Buffer& b) {
  Slot& me = slots_[rank_];
  me.address.store(b.address, std::memory_order_relaxed);
  me.bytes.store(b.bytes, std::memory_order_relaxed);
  me.check.store(b.check, std::memory_order_relaxed);
  publish(&Slot::announced, n);  // releases the three above
}

PeerLink::Buffer PeerLink::announced(int peer, uint64_t n, std::chrono::steady_clock::time_point deadline) {
  await(&Slot::announced, peer, n, deadline, "reached");
  const Slot& p = slots_[peer];
  return {p.address.load(std::memory_order_relaxed), p.bytes.load(std::memory_order_relaxed),
          p.check.load(std::memory_order_relaxed)};
}

void PeerLink::finish(uint64_t n) { publish(&Slot::finished, n); }

void PeerLink::await_finished(int peer, uint64_t n, std::chrono::steady_clock::time_point deadline) {
  await(&Slot::finished, peer, n, deadline, "finished");
}

void PeerLink::mark_broken(const std::string& why) {
  {
    std::lock_guard<std::mutex> g(broken_mu_);
    if (!broken_.empty()) return;
    broken_ = why.empty() ? "unknown error" : why;
  }
  Slot& me = slots_[rank_];
  me.broken.store(1, std::memory_order_seq_cst);
  if (me.waiters.load(std::memory_order_seq_cst) > 0) {  // peers asleep on this rank
    futex(&me.announced, FUTEX_WAKE, INT_MAX, nullptr);
    futex(&me.finished, FUTEX_WAKE, INT_MAX, nullptr);
  }
}

bool PeerLink::broken() const {
  std::lock_guard<std::mutex> g(broken_mu_);
  return !broken_.empty();
}

std::string PeerLink::broken_reason() const {
  std::lock_guard<std::mutex> g(broken_mu_);
  return broken_;
}

void PeerLink::read(int peer, void* local, uintptr_t remote, size_t bytes) const {
  transfer("read", pids_[peer], peer, static_cast<char*>(local), remote, bytes, process_vm_readv);
}

void PeerLink::write(int peer, const void* local, uintptr_t remote, size_t bytes) const {
  transfer("write", pids_[peer], peer, const_cast<char*>(static_cast<const char*>(local)), remote, bytes,
           process_vm_writev);
}

}  // namespace neuronx::distributed
