#include "distributed/completer.h"

#include "distributed/direct_algorithms.h"

namespace neuronx::distributed {

Completer::Completer() : thread_([this] { loop(); }) {}

Completer::~Completer() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

namespace {
std::mutex g_pending_mu;
std::condition_variable g_pending_cv;
int64_t g_pending = 0;  // completions queued or running, all groups
}  // namespace

bool Completer::drain(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(g_pending_mu);
  return g_pending_cv.wait_for(lk, timeout, [] { return g_pending == 0; });
}

namespace {
void count_pending() {
  std::lock_guard<std::mutex> g(g_pending_mu);
  ++g_pending;
}

void count_done() {
  {
    std::lock_guard<std::mutex> g(g_pending_mu);
    --g_pending;
  }
  g_pending_cv.notify_all();
}

}  // namespace

QueuedCollective::QueuedCollective() { count_pending(); }
QueuedCollective::~QueuedCollective() { count_done(); }

void Completer::add(c10::intrusive_ptr<c10d::Work> work, Done done, bool on_future) {
  // The transport's collectives complete a future on its worker thread: the
  // completion runs right there, without waking this thread (a wake-up costs
  // tens of microseconds of kernel time here, per collective).
  if (on_future && !dynamic_cast<DirectWork*>(work.get())) {
    auto future = work->getFuture();  // before counting: it may throw
    count_pending();
    future->addCallback([done = std::move(done)](c10::ivalue::Future& f) mutable {
      std::string error;
      if (f.hasError()) error = f.tryRetrieveErrorMessage();
      done(f.hasError() ? &error : nullptr);
      done = nullptr;  // drop the tensors before counting it done
      count_done();
    });
    return;
  }
  count_pending();
  {
    std::lock_guard<std::mutex> g(mu_);
    pending_.emplace_back(std::move(work), std::move(done));
  }
  cv_.notify_one();
}

void Completer::loop() {
  for (;;) {
    std::pair<c10::intrusive_ptr<c10d::Work>, Done> item;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !pending_.empty(); });
      if (pending_.empty()) return;  // stopping, nothing left
      item = std::move(pending_.front());
      pending_.pop_front();
    }
    std::string error;
    bool failed = false;
    try {
      item.first->wait();
    } catch (const std::exception& e) {
      error = e.what();
      failed = true;
    }
    item.second(failed ? &error : nullptr);
    item = {};  // drop the work and the callback before counting it done
    count_done();
  }
}

}  // namespace neuronx::distributed
