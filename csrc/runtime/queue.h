#pragma once
// Hardware queues and the engines that execute them.
//
// A Queue is a FIFO of tasks (a stream). An Engine is one execution unit of a
// NeuronCore: a worker thread serving a set of queues, always taking the
// ready head task of the highest-priority queue (round robin among equals).
// A task waiting on an event that has not completed blocks only its queue.
//
// Error model: a kernel that throws poisons its queue. Later kernels on that
// queue are skipped until the error is reported by a synchronization that
// covers it (queue/device/event sync); then the queue runs normally again.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/error.h"
#include "runtime/event.h"
#include "runtime/kernel.h"

namespace neuronx::rt {

class Engine;

struct Task {
  enum class Kind : uint8_t { kKernel, kRecord, kWait };
  Kind kind = Kind::kKernel;
  std::unique_ptr<Kernel> kernel;
  std::shared_ptr<Event> event;
  uint64_t version = 0;
  uint64_t seq = 0;
};

// Per-kernel timing, delivered to an observer (the profiler) when one is set.
// Times are now_ns() (steady clock); name lives only during the call.
struct TaskRecord {
  const char* name;
  int device;
  uint64_t queue_id;
  int64_t enqueue_ns, start_ns, end_ns;
  bool failed, skipped;
  uint64_t correlation;  // what the launch tag function returned on the host
};
using TaskObserver = void (*)(const TaskRecord&);
// Called on the launching thread for each kernel while an observer is set.
using LaunchTagFn = uint64_t (*)();
void set_task_observer(TaskObserver fn, LaunchTagFn tag = nullptr);
// Where the host enqueues work: `capture` runs on the launching thread for every kernel and
// returns a token for the caller's code location (0: unknown), kept in Kernel::origin; `resolve`
// turns a token into "file.py:12" when a failure is described. Set by the layer above.
using OriginCaptureFn = uint64_t (*)();
using OriginResolveFn = std::string (*)(uint64_t);
void set_origin_hooks(OriginCaptureFn capture, OriginResolveFn resolve);
std::string resolve_origin(uint64_t token);  // "" when unknown or no resolver is set
// Whether an observer is set: a kernel made of steps (a compiled program) then reports each
// step with report_step, as a task of the running kernel's queue linked to its host op, and
// marks itself so that the whole is not reported again on top of its steps.
bool observing();
// Whether the calling thread is an engine's worker (it must not wait for a queue).
bool on_engine_thread();
void report_step(const char* name, int64_t start_ns, int64_t end_ns);
// Steps of a model of the running kernel (an NKI program's instructions on the NeuronCore's
// engines, as its cost model places them): reported on tracks of their own, ids from
// kModeledTrackBase, named with set_track_name, linked to the kernel's host op.
constexpr uint64_t kModeledTrackBase = uint64_t{1} << 30;  // above any queue id, within a trace's int32
void report_track_step(const char* name, uint64_t track, int64_t start_ns, int64_t end_ns);
void set_track_name(uint64_t track, const std::string& name);
std::string track_name(uint64_t track);  // "" when unnamed

// Host threads that block on the device (synchronize) may hold a lock the
// layer above owns (Python's GIL) that a finishing kernel needs to release
// its operands. That layer installs hooks to drop and retake it around waits.
struct BlockingHooks {
  void* (*enter)() = nullptr;   // returns a token for exit
  void (*exit)(void*) = nullptr;
};
void set_blocking_hooks(BlockingHooks hooks);

class BlockingScope {
 public:
  BlockingScope();
  ~BlockingScope();
  BlockingScope(const BlockingScope&) = delete;
  BlockingScope& operator=(const BlockingScope&) = delete;

 private:
  void* token_ = nullptr;
};

// The adaptive-eager tier (the layer above) groups consecutive kernels of one queue into one:
// when the engine takes a kernel it may offer it, with the kernels queued right behind it, to the
// grouper. Only kernels are offered (a record, wait or any later task ends the run), and only on a
// queue that has no pending error.
class Queue;
// What the grouper is shown behind the kernel taken.
struct GroupWindow {
  const Kernel* const* next = nullptr;  // the kernels queued right behind it, in order
  size_t n = 0;
  bool complete = false;      // next holds every task queued behind it when they were gathered
  const Queue* queue = nullptr;
  uint64_t submitted = 0;     // the queue's submitted_seq() when they were gathered
};

class Grouper {
 public:
  virtual ~Grouper() = default;
  // Cheap first test, under the engine's lock: whether `head` could start a group.
  virtual bool candidate(const Kernel& head) = 0;
  // How many of the kernels in w.next join `head`: 0 for none. Called on the engine's thread
  // without its lock; the kernels stay queued (and alive) meanwhile.
  virtual size_t plan(const Kernel& head, const GroupWindow& w) = 0;
  // The kernel that runs `members` (head first; the 1 + plan() kernels planned) as one. It owns
  // them: they are destroyed with it, by the host, like any finished kernel.
  virtual std::unique_ptr<Kernel> make(std::vector<std::unique_ptr<Kernel>> members) = 0;
};
// nullptr: no grouping (plain eager). The grouper must outlive every engine.
void set_grouper(Grouper* g);

class Queue {
 public:
  // Backpressure, like a hardware queue's depth: a host that runs this far
  // ahead waits until the queue drains to half, which bounds the memory that
  // queued work keeps alive.
  static constexpr uint64_t kMaxPending = 1024;

  Queue(Engine* engine, int device, uint64_t id, int priority);
  int device() const { return device_; }
  uint64_t id() const { return id_; }
  int priority() const { return priority_; }

  // Enqueue a kernel. With NEURON_LAUNCH_BLOCKING=1 waits for it and throws
  // its error here.
  void launch(std::unique_ptr<Kernel> k);
  void record(std::shared_ptr<Event> e, uint64_t version);
  void wait(std::shared_ptr<Event> e, uint64_t version);

  // Work the host ran itself on this queue's behalf (after synchronizing it):
  // reported to the observer and the counters like an executed kernel.
  void report_inline(const char* name, int64_t start_ns, int64_t end_ns, bool failed);

  void synchronize();   // waits for everything submitted so far; reports errors
  void wait_idle();     // waits likewise but leaves any error for the next synchronize()
  bool query() const;   // true when idle
  // Waits at most timeout_ns for everything submitted so far; true when it all ran (errors stay
  // for synchronize()). A host thread waiting in slices can look at signals in between.
  bool wait_idle_for(int64_t timeout_ns);
  // Kernels not yet started, and any queued later, are skipped (their outputs are left as they
  // are); event records and waits still complete. For a process leaving after an interrupt.
  void discard_pending();
  size_t pending() const;
  // The queue's position, read without locks: tasks are numbered 1, 2, ... as submitted and
  // complete in order, so "completed_seq() >= n" means task n and everything before it ran.
  uint64_t submitted_seq() const { return submitted_.load(std::memory_order_acquire); }
  uint64_t completed_seq() const { return completed_.load(std::memory_order_acquire); }
  // Waits until task `seq` has completed; errors stay for the next synchronize().
  void wait_reached(uint64_t seq);
  // Visits queued, not yet started tasks in order, under the engine lock.
  void inspect(const std::function<void(const Task&)>& fn) const;

  void clear_error_if(const TaskError* e);
  std::shared_ptr<const TaskError> peek_error() const;

 private:
  friend class Engine;
  uint64_t submit(Task&& t);
  void wait_done_locked(std::unique_lock<std::mutex>& lk, uint64_t target);  // engine_->mu_ held
  Engine* engine_;
  const int device_;
  const uint64_t id_;
  const int priority_;
  std::deque<Task> tasks_;       // guarded by engine_->mu_
  // Written under engine_->mu_; atomic so that the allocator can read a queue's position
  // (submitted_seq/completed_seq) without the engine's lock.
  std::atomic<uint64_t> submitted_{0};
  uint64_t refresh_completed_seen();
  // The last completed_ a submitter read: the backpressure bound is checked against it, and
  // completed_ (a line the engine writes every task) is read only when it may have been reached.
  std::atomic<uint64_t> completed_seen_{0};
  // Written by the engine after every task: its own cache line, apart from what hosts write.
  alignas(64) std::atomic<uint64_t> completed_{0};
  uint64_t last_served_ = 0;     // guarded by engine_->mu_
  bool running_ = false;         // guarded by engine_->mu_
  bool discarding_ = false;      // guarded by engine_->mu_
  std::shared_ptr<const TaskError> error_;  // guarded by engine_->mu_
};

class Engine {
 public:
  // spin_ns: how long the thread polls for new work before it sleeps (the
  // host usually submits the next op within microseconds, and a futex
  // wake-up costs more than that).
  static constexpr int64_t kDefaultSpinNs = 20000;
  // The most kernels a grouper is offered at once (head and followers).
  static constexpr size_t kMaxGroup = 64;
  Engine(int device, std::string name, int64_t spin_ns = kDefaultSpinNs);
  ~Engine();
  void attach(Queue* q);
  static void wake_all();  // an event completed: blocked queues may be ready

 private:
  friend class Queue;
  void loop();
  Queue* pick_locked();
  void wake();
  void ensure_started_locked();
  // Destroys the kernels the worker finished (under `lk`, which it releases): see finished_.
  void release_finished(std::unique_lock<std::mutex>& lk);
  // Offers the kernel just taken from q (with lk held) and its followers to the grouper; returns
  // with lk released. Fuses in place (task.kernel becomes the group) and returns the number of
  // followers taken, whose last sequence number becomes task.seq.
  size_t offer_group(std::unique_lock<std::mutex>& lk, Queue* q, Task& task);

  const int device_;
  const std::string name_;
  const int64_t spin_ns_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::vector<Queue*> queues_;
  // Kernels that ran, destroyed by the next host thread that launches or synchronizes here: the
  // host allocated them (and their operands' host-side objects), and freeing them on the worker
  // would make the two threads contend for the allocator's arena lock at every op.
  std::vector<std::unique_ptr<Kernel>> finished_;
  std::thread thread_;
  bool started_ = false, stop_ = false, idle_ = false;
  int sync_waiters_ = 0;
  uint64_t tick_ = 0;
  std::atomic<uint64_t> pending_{0};
};

}  // namespace neuronx::rt
