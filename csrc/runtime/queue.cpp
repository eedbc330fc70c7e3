#include "runtime/queue.h"

#include <algorithm>
#include <map>

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
    : engine_(engine), device_(device), id_(id), priority_(priority) {
  engine_->attach(this);
}

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
  std::unique_lock<std::mutex> lk(engine_->mu_, std::defer_lock);
  lock_spinning(lk);
  engine_->ensure_started_locked();
  t.seq = ++submitted_;
  uint64_t seq = t.seq;
  tasks_.push_back(std::move(t));
  engine_->pending_.fetch_add(1, std::memory_order_release);
  if (telemetry::CoreCounters* c = telemetry::core(device_)) c->submitted.fetch_add(1, std::memory_order_relaxed);
  const bool wake = engine_->idle_;
  engine_->release_finished(lk);
  if (wake) engine_->work_cv_.notify_one();
  return seq;
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
  if (started_) return;
  started_ = true;
  thread_ = std::thread([this] { loop(); });
}

void Engine::wake() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!idle_) return;
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
  w.submitted = q->submitted_.load(std::memory_order_relaxed);
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
  pending_.fetch_sub(k, std::memory_order_acq_rel);
  lk.unlock();
  task.kernel = grouper->make(std::move(members));
  return k;
}

void Engine::loop() {
  t_engine_thread = true;
  std::unique_lock<std::mutex> lk(mu_);
  while (true) {
    Queue* q = pick_locked();
    if (!q) {
      if (stop_) return;
      // Spin briefly (spin_ns_) before sleeping.
      lk.unlock();
      const int64_t until = now_ns() + spin_ns_;
      // (a pause loop, not sched_yield: a syscall per iteration costs the host core too)
      for (int i = 0; pending_.load(std::memory_order_acquire) == 0; ++i) {
        if ((i & 63) == 0 && now_ns() >= until) break;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#else
        std::this_thread::yield();
#endif
      }
      lock_spinning(lk);
      q = pick_locked();
      if (!q) {
        if (stop_) return;
        idle_ = true;
        work_cv_.wait(lk);
        idle_ = false;
        continue;
      }
    }
    Task task = std::move(q->tasks_.front());
    q->tasks_.pop_front();
    q->running_ = true;
    q->last_served_ = ++tick_;
    pending_.fetch_sub(1, std::memory_order_acq_rel);
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
