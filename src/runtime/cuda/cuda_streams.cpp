// CUDA streams and events behind the Streams interface (see cuda_streams.h).
#include "runtime/cuda/cuda_streams.h"

#include "meshfuse/error.h"
#include "runtime/cuda/cuda_error.h"

namespace meshfuse::cuda {
namespace {

class CudaEvent final : public Event {
 public:
  CudaEvent(std::shared_ptr<CudaContext> ctx, cudaEvent_t e) : ctx_(std::move(ctx)), event_(e) {}
  ~CudaEvent() override { ctx_->giveEvent(event_, false); }
  void wait() override { MF_CUDA_CHECK(cudaEventSynchronize(event_)); }
  cudaEvent_t handle() const { return event_; }

 private:
  std::shared_ptr<CudaContext> ctx_;
  cudaEvent_t event_;
};

class CudaStreams final : public Streams {
 public:
  explicit CudaStreams(std::shared_ptr<CudaContext> ctx) : ctx_(std::move(ctx)) {}
  ~CudaStreams() override {
    try {
      dropTrace();
    } catch (...) {
    }
  }

  void submit(int64_t stream, TaskKind kind, const std::string& name, std::function<void()> task) override {
    ctx_->activate();
    cudaStream_t s = ctx_->stream(stream);
    StreamScope scope(s);
    if (!tracing_ || kind == TaskKind::Wait) {
      task();  // what it enqueues is noted by its Submissions (cuda_context.h)
      return;
    }
    Traced t{name, kind, stream, ctx_->takeEvent(true), ctx_->takeEvent(true)};
    try {
      MF_CUDA_CHECK(cudaEventRecord(t.begin, s));
      task();
      MF_CUDA_CHECK(cudaEventRecord(t.end, s));
    } catch (...) {  // a failed task leaves no half-recorded entry
      ctx_->giveEvent(t.begin, true);
      ctx_->giveEvent(t.end, true);
      throw;
    }
    trace_.push_back(std::move(t));
  }

  std::shared_ptr<Event> record(int64_t stream) override {
    ctx_->activate();
    auto e = std::make_shared<CudaEvent>(ctx_, ctx_->takeEvent(false));
    MF_CUDA_CHECK(cudaEventRecord(e->handle(), ctx_->stream(stream)));
    return e;
  }

  void wait(int64_t stream, std::shared_ptr<Event> event) override {
    ctx_->activate();
    if (auto* e = dynamic_cast<CudaEvent*>(event.get())) {
      MF_CUDA_CHECK(cudaStreamWaitEvent(ctx_->stream(stream), e->handle(), 0));
      return;
    }
    event->wait();  // an event of another Streams implementation: the host waits for it
  }

  void synchronize() override {
    ctx_->activate();
    for (cudaStream_t s : ctx_->allStreams()) MF_CUDA_CHECK(cudaStreamSynchronize(s));
  }

  void setTracing(bool on) override {
    dropTrace();
    tracing_ = on;
    if (!on) return;
    ctx_->activate();
    epoch_ = ctx_->takeEvent(true);
    MF_CUDA_CHECK(cudaEventRecord(epoch_, ctx_->stream(0)));
  }

  std::vector<TraceEvent> takeTrace() override {
    std::vector<TraceEvent> out;
    if (epoch_ == nullptr) return out;
    synchronize();
    for (const Traced& t : trace_) {
      float begin_ms = 0, end_ms = 0;
      MF_CUDA_CHECK(cudaEventElapsedTime(&begin_ms, epoch_, t.begin));
      MF_CUDA_CHECK(cudaEventElapsedTime(&end_ms, epoch_, t.end));
      out.push_back({t.name, t.kind, t.stream, begin_ms * 1e3, end_ms * 1e3});
    }
    // The next run's trace starts afresh from a new epoch.
    bool on = tracing_;
    setTracing(on);
    return out;
  }

 private:
  struct Traced {
    std::string name;
    TaskKind kind = TaskKind::Compute;
    int64_t stream = 0;
    cudaEvent_t begin = nullptr, end = nullptr;
  };

  void dropTrace() {
    for (const Traced& t : trace_) {
      ctx_->giveEvent(t.begin, true);
      ctx_->giveEvent(t.end, true);
    }
    trace_.clear();
    if (epoch_ != nullptr) ctx_->giveEvent(epoch_, true);
    epoch_ = nullptr;
  }

  std::shared_ptr<CudaContext> ctx_;
  bool tracing_ = false;
  cudaEvent_t epoch_ = nullptr;
  std::vector<Traced> trace_;
};

}  // namespace

std::unique_ptr<Streams> makeCudaStreams(std::shared_ptr<CudaContext> ctx) {
  return std::make_unique<CudaStreams>(std::move(ctx));
}

}  // namespace meshfuse::cuda
