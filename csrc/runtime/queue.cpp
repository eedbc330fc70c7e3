#include "runtime/queue.h"

#include <algorithm>
#include <map>

#if defined(__linux__)
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "runtime/config.h"
#include "runtime/recycled.h"
#include "runtime/telemetry.h"

namespace neuronx::rt {

namespace {

std::atomic<TaskObserver> g_observer{nullptr};
std::atomic<LaunchTagFn> g_launch_tag{nullptr};
std::atomic<OriginCaptureFn> g_origin_capture{nullptr};
std::atomic<OriginResolveFn> g_origin_resolve{nullptr};
std::atomic<Grouper*> g_grouper{nullptr};

std::mutex& engines_mu() {
  static auto* m = new std::mutex;
  return *m;
}
std::vector<Engine*>& engines() {
  static auto* v = new std::vector<Engine*>;
  return *v;
}

}  // namespace

void set_origin_hooks(OriginCaptureFn capture, OriginResolveFn resolve) {
  g_origin_resolve.store(resolve);
  g_origin_capture.store(capture);
}

std::string resolve_origin(uint64_t token) {
  OriginResolveFn f = g_origin_resolve.load(std::memory_order_relaxed);
  return token && f ? f(token) : std::string();
}

void set_grouper(Grouper* g) { g_grouper.store(g); }

void set_task_observer(TaskObserver fn, LaunchTagFn tag) {
  g_launch_tag.store(tag);
  g_observer.store(fn);
}

namespace {
// The kernel this engine thread is running, for report_step.
struct Running {
  const Kernel* kernel = nullptr;
  int device = -1;
  uint64_t queue = 0;
};
thread_local Running t_running;
thread_local bool t_engine_thread = false;
}  // namespace

bool on_engine_thread() { return t_engine_thread; }

bool observing() { return g_observer.load(std::memory_order_relaxed) != nullptr; }

void report_step(const char* name, int64_t start_ns, int64_t end_ns) {
  TaskObserver obs = g_observer.load(std::memory_order_relaxed);
  if (!obs || !t_running.kernel) return;
  obs(TaskRecord{name, t_running.device, t_running.queue, t_running.kernel->enqueue_ns, start_ns, end_ns, false, false,
                 t_running.kernel->correlation});
}

void report_track_step(const char* name, uint64_t track, int64_t start_ns, int64_t end_ns) {
  TaskObserver obs = g_observer.load(std::memory_order_relaxed);
  if (!obs || !t_running.kernel) return;
  obs(TaskRecord{name, t_running.device, track, t_running.kernel->enqueue_ns, start_ns, end_ns, false, false,
                 t_running.kernel->correlation});
}

namespace {
std::mutex g_track_names_mu;
std::map<uint64_t, std::string> g_track_names;  // guarded by g_track_names_mu
}  // namespace

void set_track_name(uint64_t track, const std::string& name) {
  std::lock_guard<std::mutex> g(g_track_names_mu);
  g_track_names[track] = name;
}

std::string track_name(uint64_t track) {
  std::lock_guard<std::mutex> g(g_track_names_mu);
  auto it = g_track_names.find(track);
  return it == g_track_names.end() ? std::string() : it->second;
}

namespace {
BlockingHooks g_hooks;
}

void set_blocking_hooks(BlockingHooks hooks) { g_hooks = hooks; }

BlockingScope::BlockingScope() {
  if (g_hooks.enter) token_ = g_hooks.enter();
}

BlockingScope::~BlockingScope() {
  if (g_hooks.exit) g_hooks.exit(token_);
}

namespace {
// An asymmetric fence between submitters and an engine going to sleep (as in folly's
// asymmetricLightBarrier/HeavyBarrier). A submitter stores its inbox tail, then reads idle_; the
// engine stores idle_, then reads the tails. Each side needs a full fence between its store and
// its load, or both may read the old value and the engine sleeps on a queued task. The submitter
// does this at every op and the engine only before it sleeps, so the submitter's fence is a
// compiler barrier and the engine's is membarrier(2), which runs a full fence on every thread of
// the process. Where membarrier is missing, both sides use a full fence.
bool asymmetric_fences() {
#if defined(__linux__) && !defined(__SANITIZE_THREAD__)  // (TSan models fences, not membarrier)
  static const bool ok = syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
  return ok;
#else
  return false;
#endif
}
const bool g_asymmetric = asymmetric_fences();  // (registered before any engine runs)

inline void light_barrier() {
  if (g_asymmetric) std::atomic_signal_fence(std::memory_order_seq_cst);
  else std::atomic_thread_fence(std::memory_order_seq_cst);
}

// False where submitters' light barrier is not matched (membarrier failed after registering):
// the engine then cannot trust that it sees a task pushed while it went to sleep, and sleeps
// with a timeout instead.
bool heavy_barrier() {
#if defined(__linux__)
  if (g_asymmetric) return syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0;
#endif
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return true;
}

// The engine's lock guards short sections that the host (submit) and the engine (take a task,
// complete it) enter once per op. Sleeping in the kernel when the other holds it costs more
// than those sections (futex wait and wake); spinning briefly for it costs less.
void lock_spinning(std::unique_lock<std::mutex>& lk) {
  for (int i = 0; i < 256; ++i) {
    if (lk.try_lock()) return;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    std::this_thread::yield();
#endif
  }
  lk.lock();
}
}  // namespace

// ---------------------------------------------------------------- Queue

Queue::Queue(Engine* engine, int device, uint64_t id, int priority)
    : engine_(engine), device_(device), id_(id), priority_(priority),
      inbox_(std::make_unique<InboxSlot[]>(kInboxSlots)) {
  engine_->attach(this);
}

Queue::~Queue() {
  // Tasks still in the inbox (the engine stopped first): destroyed as tasks_ destroys its own.
  const uint64_t tail = inbox_tail_.load(std::memory_order_acquire);
  for (uint64_t i = inbox_head_.load(std::memory_order_acquire); i != tail; ++i) inbox_task(i)->~Task();
}

// A spinlock: its release is a plain store, where a mutex's unlock is a locked instruction that
// would wait for the stores just made to the lines the engine reads.
class Queue::ProducerLock {
 public:
  explicit ProducerLock(Queue& q) : busy_(q.producer_busy_) {
    for (int i = 0; busy_.exchange(true, std::memory_order_acquire); ++i) {
      while (busy_.load(std::memory_order_relaxed)) {
        // Held by another host thread for a few stores, unless it was preempted holding it.
        if (++i % 64 == 0) std::this_thread::yield();
#if defined(__x86_64__) || defined(__i386__)
        else __builtin_ia32_pause();
#endif
      }
    }
  }
  ~ProducerLock() { busy_.store(false, std::memory_order_release); }
  ProducerLock(const ProducerLock&) = delete;
  ProducerLock& operator=(const ProducerLock&) = delete;

 private:
  std::atomic<bool>& busy_;
};

uint64_t Queue::submit(Task&& t) {
  // The bound is a throttle, read without the lock (one lock per submit, not two): completed_ only
  // grows, and concurrent submitters can pass it by no more than their number.
  if (submitted_.load(std::memory_order_relaxed) - completed_seen_.load(std::memory_order_relaxed) >= kMaxPending &&
      submitted_.load(std::memory_order_relaxed) - refresh_completed_seen() >= kMaxPending) {
    BlockingScope blocking;  // the engine may need what the caller holds (GIL)
    std::unique_lock<std::mutex> wait_lk(engine_->mu_);
    engine_->sync_waiters_++;
    engine_->done_cv_.wait(wait_lk, [&] { return submitted_ - completed_ < kMaxPending / 2; });
    engine_->sync_waiters_--;
  }
  if (!engine_->started_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lk(engine_->mu_);
    engine_->ensure_started_locked();
  }
  if (telemetry::CoreCounters* c = telemetry::core(device_)) c->submitted.fetch_add(1, std::memory_order_relaxed);
  uint64_t seq;
  bool release = false;
  {
    ProducerLock producer(*this);
    const uint64_t tail = inbox_tail_.load(std::memory_order_relaxed);
    if (tail - inbox_head_seen_ >= kInboxSlots) {
      inbox_head_seen_ = inbox_head_.load(std::memory_order_acquire);
      if (tail - inbox_head_seen_ >= kInboxSlots) {
        std::lock_guard<std::mutex> lk(engine_->mu_);
        drain_locked();
        inbox_head_seen_ = inbox_head_.load(std::memory_order_relaxed);
      }
    }
    // Counted before it is published: a task the engine can take (and complete) is counted, so
    // completed_seq() never passes submitted_seq(). Sequence number n is the inbox's n-th task.
    seq = tail + 1;
    t.seq = seq;
    new (inbox_[tail % kInboxSlots].bytes) Task(std::move(t));
    submitted_.store(seq, std::memory_order_relaxed);
    inbox_tail_.store(seq, std::memory_order_release);  // (also publishes submitted_)
    if (++since_release_ >= kReleaseEvery) {
      since_release_ = 0;
      release = true;
    }
  }
  // The tail's store, then idle_'s load: the light side of the fence an engine that goes to sleep
  // makes heavy (Engine::loop).
  light_barrier();
  if (engine_->idle_.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lk(engine_->mu_);
    engine_->work_cv_.notify_one();
  }
  if (release) {
    std::unique_lock<std::mutex> lk(engine_->mu_, std::defer_lock);
    lock_spinning(lk);
    engine_->release_finished(lk);
  }
  return seq;
}

void Queue::drain_locked() {
  const uint64_t tail = inbox_tail_.load(std::memory_order_acquire);
  uint64_t head = inbox_head_.load(std::memory_order_relaxed);
  for (; head != tail; ++head) {
    Task* t = inbox_task(head);
    tasks_.push_back(std::move(*t));  // (may throw: the slot then stays the inbox's)
    t->~Task();
    inbox_head_.store(head + 1, std::memory_order_release);  // the slot is free for submitters
  }
}

uint64_t Queue::refresh_completed_seen() {
  const uint64_t c = completed_.load(std::memory_order_acquire);
  completed_seen_.store(c, std::memory_order_relaxed);
  return c;
}

void Queue::launch(std::unique_ptr<Kernel> k) {
  if (OriginCaptureFn capture = g_origin_capture.load(std::memory_order_relaxed); capture && !k->origin)
    k->origin = capture();
  if (g_observer.load(std::memory_order_relaxed)) {
    k->enqueue_ns = now_ns();
    if (LaunchTagFn tag = g_launch_tag.load(std::memory_order_relaxed)) k->correlation = tag();
  }
  Task t;
  t.kind = Task::Kind::kKernel;
  t.kernel = std::move(k);
  submit(std::move(t));
  if (config().launch_blocking) synchronize();
}

void Queue::report_inline(const char* name, int64_t start_ns, int64_t end_ns, bool failed) {
  if (telemetry::CoreCounters* c = telemetry::core(device_)) {
    c->kernels.fetch_add(1, std::memory_order_relaxed);
    c->busy_ns.fetch_add(static_cast<uint64_t>(end_ns - start_ns), std::memory_order_relaxed);
  }
  if (TaskObserver obs = g_observer.load(std::memory_order_relaxed)) {
    LaunchTagFn tag = g_launch_tag.load(std::memory_order_relaxed);
    obs(TaskRecord{name, device_, id_, start_ns, start_ns, end_ns, failed, false, tag ? tag() : 0});
  }
}

void Queue::record(std::shared_ptr<Event> e, uint64_t version) {
  {
    std::unique_lock<std::mutex> lk(engine_->mu_);
    // Nothing queued or running: the event is reached now, as on an idle CUDA
    // stream, without a round trip through the engine's thread (every
    // collective records one on the caller's stream).
    if (submitted_ == completed_) {
      std::shared_ptr<const TaskError> err = error_;
      lk.unlock();
      e->complete(version, now_ns(), std::move(err), this);
      return;
    }
  }
  Task t;
  t.kind = Task::Kind::kRecord;
  t.event = std::move(e);
  t.version = version;
  submit(std::move(t));
}

void Queue::wait(std::shared_ptr<Event> e, uint64_t version) {
  if (e->reached(version)) return;
  Task t;
  t.kind = Task::Kind::kWait;
  t.event = std::move(e);
  t.version = version;
  submit(std::move(t));
}

void Queue::wait_done_locked(std::unique_lock<std::mutex>& lk, uint64_t target) {
  engine_->sync_waiters_++;
  engine_->done_cv_.wait(lk, [&] { return completed_ >= target; });
  engine_->sync_waiters_--;
}

void Queue::synchronize() {
  std::shared_ptr<const TaskError> err;
  {
    BlockingScope blocking;
    std::unique_lock<std::mutex> lk(engine_->mu_);
    wait_done_locked(lk, submitted_.load());
    err = std::move(error_);
    error_.reset();
    engine_->release_finished(lk);
  }
  if (err) throw Error(ErrorCode::kKernelFailed, err->describe(), err->category);
}

void Queue::wait_reached(uint64_t seq) {
  if (completed_seq() >= seq) return;
  BlockingScope blocking;
  std::unique_lock<std::mutex> lk(engine_->mu_);
  wait_done_locked(lk, seq);
  if (!on_engine_thread()) engine_->release_finished(lk);
}

void Queue::wait_idle() {
  BlockingScope blocking;
  std::unique_lock<std::mutex> lk(engine_->mu_);
  wait_done_locked(lk, submitted_.load());
  engine_->release_finished(lk);
}

bool Queue::wait_idle_for(int64_t timeout_ns) {
  BlockingScope blocking;
  std::unique_lock<std::mutex> lk(engine_->mu_);
  const uint64_t target = submitted_.load();
  engine_->sync_waiters_++;
  const bool done = engine_->done_cv_.wait_for(lk, std::chrono::nanoseconds(timeout_ns),
                                               [&] { return completed_ >= target; });
  engine_->sync_waiters_--;
  if (done) engine_->release_finished(lk);
  return done;
}

void Queue::discard_pending() {
  std::lock_guard<std::mutex> lk(engine_->mu_);
  discarding_ = true;
}

bool Queue::query() const {
  std::lock_guard<std::mutex> lk(engine_->mu_);
  return completed_ >= submitted_;
}

size_t Queue::pending() const {
  std::lock_guard<std::mutex> lk(engine_->mu_);
  return static_cast<size_t>(submitted_ - completed_);
}

void Queue::inspect(const std::function<void(const Task&)>& fn) const {
  std::lock_guard<std::mutex> lk(engine_->mu_);
  const_cast<Queue*>(this)->drain_locked();  // (moves tasks between two containers of this queue)
  for (const Task& t : tasks_) fn(t);
}

std::shared_ptr<const TaskError> Queue::peek_error() const {
  std::lock_guard<std::mutex> lk(engine_->mu_);
  return error_;
}

void Queue::clear_error_if(const TaskError* e) {
  std::lock_guard<std::mutex> lk(engine_->mu_);
  if (error_.get() == e) error_.reset();
}

// ---------------------------------------------------------------- Engine

Engine::Engine(int device, std::string name, int64_t spin_ns)
    : device_(device), name_(std::move(name)), spin_ns_(spin_ns) {
  std::lock_guard<std::mutex> g(engines_mu());
  engines().push_back(this);
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> g(engines_mu());
    auto& v = engines();
    v.erase(std::remove(v.begin(), v.end(), this), v.end());
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Engine::attach(Queue* q) {
  std::lock_guard<std::mutex> lk(mu_);
  queues_.push_back(q);
  // Highest priority first (lower number = higher priority, as in CUDA).
  std::stable_sort(queues_.begin(), queues_.end(),
                   [](Queue* a, Queue* b) { return a->priority_ < b->priority_; });
  attached_.store(queues_.size(), std::memory_order_seq_cst);
}

void Engine::release_finished() {
  std::unique_lock<std::mutex> lk(mu_);
  release_finished(lk);
}

void Engine::release_finished(std::unique_lock<std::mutex>& lk) {
  if (finished_.empty()) {
    lk.unlock();
    return;
  }
  // The vectors swapped keep their capacity (the engine appends to finished_ every op).
  std::vector<std::unique_ptr<Kernel>> done = Recycled<std::vector<std::unique_ptr<Kernel>>, 4>::take();
  done.swap(finished_);
  lk.unlock();
  // (may free device memory (operands kept for another stream): no engine lock held)
  Recycled<std::vector<std::unique_ptr<Kernel>>, 4>::give(std::move(done));
}

void Engine::ensure_started_locked() {
  if (started_.load(std::memory_order_relaxed)) return;
  thread_ = std::thread([this] { loop(); });
  started_.store(true, std::memory_order_release);
}

void Engine::drain_all_locked() {
  drained_tails_.resize(queues_.size());
  for (size_t i = 0; i < queues_.size(); ++i) {
    queues_[i]->drain_locked();
    drained_tails_[i] = queues_[i]->inbox_head_.load(std::memory_order_relaxed);
  }
}

bool Engine::inbox_moved_locked() const {
  if (attached_.load(std::memory_order_seq_cst) != drained_tails_.size()) return true;
  for (size_t i = 0; i < queues_.size(); ++i)
    if (queues_[i]->inbox_tail_.load(std::memory_order_seq_cst) != drained_tails_[i]) return true;
  return false;
}

void Engine::wake() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!idle_.load(std::memory_order_relaxed)) return;
    drain_all_locked();
    // An event can only release a queue held at a wait: waking an engine that
    // has none costs a thread switch (and on 2 cores, the other process's time)
    // for nothing, at every event of every device.
    if (std::none_of(queues_.begin(), queues_.end(), [](Queue* q) {
          return !q->tasks_.empty() && q->tasks_.front().kind == Task::Kind::kWait;
        }))
      return;
  }
  work_cv_.notify_one();
}

void Engine::wake_all() {
  std::lock_guard<std::mutex> g(engines_mu());
  for (Engine* e : engines()) e->wake();
}

Queue* Engine::pick_locked() {
  Queue* best = nullptr;
  for (Queue* q : queues_) {
    if (q->tasks_.empty() || q->running_) continue;
    const Task& head = q->tasks_.front();
    if (head.kind == Task::Kind::kWait && !head.event->reached(head.version)) continue;
    if (!best) {
      best = q;
    } else if (q->priority_ != best->priority_) {
      break;  // sorted: every remaining queue has lower priority
    } else if (q->last_served_ < best->last_served_) {
      best = q;
    }
  }
  return best;
}

size_t Engine::offer_group(std::unique_lock<std::mutex>& lk, Queue* q, Task& task) {
  // Tasks are numbered as they enter the inbox (the n-th task pushed has sequence number n), so
  // after draining, the tail is the last task in view: work counted since is known to the grouper
  // as submitted_seq() moving past it.
  q->drain_locked();
  const uint64_t submitted = q->inbox_head_.load(std::memory_order_relaxed);
  Grouper* grouper = g_grouper.load(std::memory_order_relaxed);
  if (!grouper || q->tasks_.empty() || q->tasks_.front().kind != Task::Kind::kKernel ||
      !grouper->candidate(*task.kernel)) {
    lk.unlock();
    return 0;
  }
  // Pointers to the queued kernels stay valid without the lock: only this thread pops tasks.
  thread_local std::vector<const Kernel*> next;
  next.clear();
  for (const Task& t : q->tasks_) {
    if (t.kind != Task::Kind::kKernel || next.size() + 1 >= kMaxGroup) break;
    next.push_back(t.kernel.get());
  }
  GroupWindow w;
  w.complete = next.size() == q->tasks_.size();
  w.queue = q;
  w.submitted = submitted;
  lk.unlock();
  w.next = next.data();
  w.n = next.size();
  const size_t k = std::min(grouper->plan(*task.kernel, w), next.size());
  if (k == 0) return 0;
  std::vector<std::unique_ptr<Kernel>> members;
  members.reserve(k + 1);
  members.push_back(std::move(task.kernel));
  lock_spinning(lk);
  for (size_t i = 0; i < k; ++i) {
    Task& t = q->tasks_.front();
    members.push_back(std::move(t.kernel));
    task.seq = t.seq;
    q->tasks_.pop_front();
  }
  lk.unlock();
  task.kernel = grouper->make(std::move(members));
  return k;
}

void Engine::loop() {
  t_engine_thread = true;
  std::unique_lock<std::mutex> lk(mu_);
  bool spun = false;
  std::vector<std::pair<const std::atomic<uint64_t>*, uint64_t>> watch;  // (tail, drained) while spinning
  while (true) {
    drain_all_locked();
    Queue* q = pick_locked();
    if (!q) {
      if (stop_) return;
      if (!spun) {
        // Spin briefly (spin_ns_) for a new submission before sleeping, reading the inbox tails
        // (lines the submitters write anyway) without the lock.
        watch.clear();
        for (size_t i = 0; i < queues_.size(); ++i) watch.emplace_back(&queues_[i]->inbox_tail_, drained_tails_[i]);
        const size_t attached = queues_.size();
        lk.unlock();
        const int64_t until = now_ns() + spin_ns_;
        auto moved = [&] {
          if (attached_.load(std::memory_order_acquire) != attached) return true;
          for (const auto& [tail, drained] : watch)
            if (tail->load(std::memory_order_acquire) != drained) return true;
          return false;
        };
        // (a pause loop, not sched_yield: a syscall per iteration costs the host core too)
        for (int i = 0; !moved(); ++i) {
          if ((i & 63) == 0 && now_ns() >= until) break;
#if defined(__x86_64__) || defined(__i386__)
          __builtin_ia32_pause();
#else
          std::this_thread::yield();
#endif
        }
        lock_spinning(lk);
        spun = true;
        continue;
      }
      idle_.store(true, std::memory_order_relaxed);
      // (under mu_: wake() and attach() decide by idle_ under it, and their notify must find the
      // worker waiting or not yet past this check)
      const bool fenced = heavy_barrier();
      if (!inbox_moved_locked()) {
        if (fenced) work_cv_.wait(lk);
        else work_cv_.wait_for(lk, std::chrono::milliseconds(1));  // a submission may go unseen
      }
      idle_.store(false, std::memory_order_relaxed);
      spun = false;
      continue;
    }
    spun = false;
    Task task = std::move(q->tasks_.front());
    q->tasks_.pop_front();
    q->running_ = true;
    q->last_served_ = ++tick_;
    // Both engines of a device (compute, collectives) count into its counters.
    telemetry::CoreCounters* counters = telemetry::core(device_);
    if (counters) counters->started.fetch_add(1, std::memory_order_relaxed);
    std::shared_ptr<const TaskError> poisoned = q->error_;
    const bool discard = q->discarding_;
    size_t grouped = 0;
    if (task.kind == Task::Kind::kKernel && !poisoned && !discard && g_grouper.load(std::memory_order_relaxed))
      grouped = offer_group(lk, q, task);
    else
      lk.unlock();
    if (grouped && counters) counters->started.fetch_add(grouped, std::memory_order_relaxed);

    const int64_t start = now_ns();
    bool failed = false, skipped = false;
    std::shared_ptr<const TaskError> new_error;
    switch (task.kind) {
      case Task::Kind::kKernel:
        if (poisoned || discard) {
          skipped = true;  // outputs of work after a failure are undefined until it is reported
        } else {
          try {
            t_running = {task.kernel.get(), device_, q->id_};
            task.kernel->run();
            t_running = {};
          } catch (const KernelError& ex) {
            failed = true;
            auto te = std::make_shared<TaskError>();
            te->op = task.kernel->name();
            te->message = ex.what();
            te->origin = task.kernel->origin;
            te->category = ex.category;
            new_error = std::move(te);
          } catch (const std::exception& ex) {
            failed = true;
            auto te = std::make_shared<TaskError>();
            te->op = task.kernel->name();
            te->message = ex.what();
            te->origin = task.kernel->origin;
            new_error = std::move(te);
          } catch (...) {
            failed = true;
            auto te = std::make_shared<TaskError>();
            te->op = task.kernel->name();
            te->message = "unknown exception";
            new_error = std::move(te);
          }
        }
        break;
      case Task::Kind::kRecord:
        task.event->complete(task.version, start, poisoned, q);
        break;
      case Task::Kind::kWait:
        break;  // picked only once the event was reached
    }
    const int64_t end = now_ns();
    if (counters) {
      counters->busy_ns.fetch_add(static_cast<uint64_t>(end - start), std::memory_order_relaxed);
      if (task.kind == Task::Kind::kKernel) counters->kernels.fetch_add(1 + grouped, std::memory_order_relaxed);
    }
    t_running = {};
    if (TaskObserver obs = g_observer.load(std::memory_order_relaxed);
        obs && task.kind == Task::Kind::kKernel && (!task.kernel->reported_steps || failed))
      obs(TaskRecord{task.kernel->name(), device_, q->id_, task.kernel->enqueue_ns, start, end, failed, skipped,
                    task.kernel->correlation});
    task.event.reset();

    lock_spinning(lk);
    // Destroyed by the host (finished_); a synchronize() that returns has released them.
    if (task.kernel) finished_.push_back(std::move(task.kernel));
    if (new_error && !q->error_) q->error_ = std::move(new_error);
    q->completed_.store(task.seq, std::memory_order_release);
    q->running_ = false;
    if (sync_waiters_ > 0) done_cv_.notify_all();
  }
}

}  // namespace neuronx::rt
