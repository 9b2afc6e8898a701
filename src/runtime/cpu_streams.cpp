// CpuStreams: stream 0 inline on the host thread, every other stream a worker thread (see
// streams.h). A failed task does not leave waiters hanging: the stream skips its later work
// tasks but still fires its events, and the failure is rethrown by synchronize(). Timelines
// hold every task that takes time: kernels, GEMMs, copies, collectives, and a stream's waits
// for events (TaskKind::Wait).
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "meshfuse/error.h"
#include "runtime/streams.h"

namespace meshfuse {
namespace {

using Clock = std::chrono::steady_clock;

// The names of the event tasks, made once (a name is copied only into a worker's queue).
const std::string kRecord = "record";
const std::string kWaitForEvent = "wait for an event";

class CpuEvent final : public Event {
 public:
  void set() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      done_ = true;
    }
    cv_.notify_all();
  }
  void wait() override {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [this] { return done_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
};

struct Task {
  TaskKind kind;
  std::string name;
  std::function<void()> fn;
  bool always = false;  // runs even after a failure (event bookkeeping)
  bool traced = true;   // appears in timelines (not: recording an event, which takes no time)
};

class CpuStreams final : public Streams {
 public:
  ~CpuStreams() override {
    for (auto& [id, w] : workers_) {
      {
        std::lock_guard<std::mutex> lk(w->mu);
        w->stop = true;
      }
      w->cv.notify_all();
      w->thread.join();
    }
  }

  void submit(int64_t stream, TaskKind kind, const std::string& name, std::function<void()> task) override {
    enqueue(stream, kind, name, std::move(task), /*always=*/false);
  }

  std::shared_ptr<Event> record(int64_t stream) override {
    auto e = std::make_shared<CpuEvent>();
    enqueue(stream, TaskKind::Wait, kRecord, [e] { e->set(); }, /*always=*/true, /*traced=*/false);
    return e;
  }

  void wait(int64_t stream, std::shared_ptr<Event> event) override {
    enqueue(stream, TaskKind::Wait, kWaitForEvent, [event] { event->wait(); }, /*always=*/true);
  }

  void synchronize() override {
    for (auto& [id, worker] : workers_) {
      auto& w = worker;  // (clang 14 cannot capture a structured binding)
      std::unique_lock<std::mutex> lk(w->mu);
      w->idle_cv.wait(lk, [&] { return w->queue.empty() && !w->busy; });
    }
    std::exception_ptr first = nullptr;
    std::swap(first, failure_);
    for (auto& [id, w] : workers_) w->failed = false;
    if (first) std::rethrow_exception(first);
  }

  void setTracing(bool on) override {
    std::lock_guard<std::mutex> lk(trace_mu_);
    tracing_ = on;
    epoch_ = Clock::now();
    trace_.clear();
  }
  std::vector<TraceEvent> takeTrace() override {
    std::lock_guard<std::mutex> lk(trace_mu_);
    return std::move(trace_);
  }

 private:
  struct Worker {
    std::thread thread;
    std::mutex mu;
    std::condition_variable cv, idle_cv;
    std::deque<Task> queue;
    bool busy = false, stop = false, failed = false;
  };

  // Stream 0 runs the task here and now, so nothing is copied (the per-launch cost of the
  // host-IR interpreter: benchmarks/results/runtime.md); another stream's worker gets a Task.
  void enqueue(int64_t stream, TaskKind kind, const std::string& name, std::function<void()> fn, bool always,
               bool traced = true) {
    if (stream == 0) {
      run(0, kind, name, fn, always, traced, main_failed_);
      return;
    }
    Worker& w = worker(stream);
    {
      std::lock_guard<std::mutex> lk(w.mu);
      w.queue.push_back({kind, name, std::move(fn), always, traced});
    }
    w.cv.notify_one();
  }

  Worker& worker(int64_t stream) {
    auto it = workers_.find(stream);
    if (it != workers_.end()) return *it->second;
    auto w = std::make_unique<Worker>();
    Worker* raw = w.get();
    raw->thread = std::thread([this, raw, stream] { loop(*raw, stream); });
    return *workers_.emplace(stream, std::move(w)).first->second;
  }

  void loop(Worker& w, int64_t stream) {
    std::unique_lock<std::mutex> lk(w.mu);
    while (true) {
      w.cv.wait(lk, [&] { return w.stop || !w.queue.empty(); });
      if (w.queue.empty()) return;  // stop requested and drained
      Task t = std::move(w.queue.front());
      w.queue.pop_front();
      w.busy = true;
      lk.unlock();
      run(stream, t.kind, t.name, t.fn, t.always, t.traced, w.failed);
      lk.lock();
      w.busy = false;
      if (w.queue.empty()) w.idle_cv.notify_all();
    }
  }

  // Runs one task (under the compute lock when it computes), recording it when tracing.
  void run(int64_t stream, TaskKind kind, const std::string& name, const std::function<void()>& fn, bool always,
           bool traced, bool& failed) {
    if (failed && !always) return;
    try {
      std::unique_lock<std::mutex> compute;
      if (kind == TaskKind::Compute) compute = std::unique_lock<std::mutex>(compute_mu_);
      const bool tracing = traced && tracing_;
      const Clock::time_point begin = tracing ? Clock::now() : Clock::time_point();
      fn();
      if (tracing) {
        auto end = Clock::now();
        std::lock_guard<std::mutex> lk(trace_mu_);
        trace_.push_back({name, kind, stream, std::chrono::duration<double, std::micro>(begin - epoch_).count(),
                          std::chrono::duration<double, std::micro>(end - epoch_).count()});
      }
    } catch (...) {
      failed = true;
      std::lock_guard<std::mutex> lk(trace_mu_);
      if (!failure_) failure_ = std::current_exception();
      if (stream == 0) {  // the host sees it now; skip nothing later on the main stream
        failed = false;
        std::exception_ptr e = failure_;
        failure_ = nullptr;
        std::rethrow_exception(e);
      }
    }
  }

  std::map<int64_t, std::unique_ptr<Worker>> workers_;
  std::mutex compute_mu_;
  std::mutex trace_mu_;
  std::atomic<bool> tracing_{false};
  Clock::time_point epoch_ = Clock::now();
  std::vector<TraceEvent> trace_;
  std::exception_ptr failure_ = nullptr;
  bool main_failed_ = false;
};

}  // namespace

std::unique_ptr<Streams> makeCpuStreams() { return std::make_unique<CpuStreams>(); }

}  // namespace meshfuse
