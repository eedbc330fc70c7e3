#pragma once
// Peer access between the ranks of a group on one host: a rank reads and
// writes its peers' device memory directly, one copy by the kernel (Linux
// cross-memory attach: process_vm_readv/writev), as NeuronCores of one
// instance reach each other's HBM over the device interconnect and NCCL's
// P2P and SHM transports move data between GPUs of one node. The accesses of
// a collective are ordered through a small block of memory the ranks share
// (a sequence word per rank, waited on with futexes). Gloo carries everything
// between hosts, and every rank's check before each collective.
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <sys/types.h>
#include <vector>

namespace neuronx::distributed {

// Whether TORCH_NEURONX_DIST_PEER_ACCESS allows it ("1", the default, or
// "0"); anything else raises a ValueError saying what is accepted.
bool peer_access_requested();

class PeerLink {
 public:
  // Run by every rank of a group at its creation, over `control`. A link
  // when every rank is on this host (same boot, network and pid namespaces),
  // every rank asked for it, and every rank could read a probe word of every
  // other one and map the shared block; otherwise nullptr, on every rank.
  // `requested` comes from peer_access_requested(), called here so that a
  // bad setting on one rank raises on every rank instead of leaving the
  // others waiting in the exchange.
  static std::shared_ptr<PeerLink> negotiate(c10d::Backend& control);
  ~PeerLink();

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(pids_.size()); }

  // The number of the next collective that takes this path (from 1; the
  // ranks take them in the same order).
  uint64_t take_number() { return ++taken_; }

  // One collective, number n, on every rank: announce() this rank's buffer;
  // announced(peer) waits for the peer's (it arrives once the peer has
  // finished collective n - 1); move the data; finish(); await_finished(peer)
  // for every peer, after which no peer touches this rank's buffer again.
  // The waits raise when the peer has exited or `deadline` passes.
  struct Buffer {
    uintptr_t address;
    int64_t bytes;
    uint64_t check;  // the collective's sequence number in the group's fingerprint check
  };
  void announce(uint64_t n, const Buffer& b);
  Buffer announced(int peer, uint64_t n, std::chrono::steady_clock::time_point deadline);
  void finish(uint64_t n);
  void await_finished(int peer, uint64_t n, std::chrono::steady_clock::time_point deadline);

  // Copies `bytes` between this process's `local` and `remote` in the peer's
  // memory; raises a runtime_error naming the peer and the system error.
  void read(int peer, void* local, uintptr_t remote, size_t bytes) const;
  void write(int peer, const void* local, uintptr_t remote, size_t bytes) const;

  // After a collective failed part-way, the ranks' sequence words disagree:
  // every later collective of the group fails at once, with the first reason,
  // and so do the peers' waits on this rank (a word in the shared block).
  void mark_broken(const std::string& why);
  bool broken() const;
  std::string broken_reason() const;

  struct Slot;

 private:
  PeerLink(int rank, std::vector<pid_t> pids, std::vector<int> pidfds, Slot* slots, size_t mapped);
  void await(std::atomic<uint32_t> Slot::*word, int peer, uint64_t n, std::chrono::steady_clock::time_point deadline,
             const char* what);
  void publish(std::atomic<uint32_t> Slot::*word, uint64_t n);
  bool alive(int peer) const;

  int rank_;
  std::vector<pid_t> pids_;
  std::vector<int> pidfds_;  // each peer's process (a reused pid is another process); -1: none
  Slot* slots_;                        // one per rank, in the shared block
  size_t mapped_;
  std::atomic<uint64_t> taken_{0};
  mutable std::mutex broken_mu_;
  std::string broken_;
};

}  // namespace neuronx::distributed
