// The per-GPU state (see cuda_context.h).
#include "runtime/cuda/cuda_context.h"

#include "meshfuse/error.h"
#include "runtime/cuda/cuda_error.h"

namespace meshfuse::cuda {
namespace {

thread_local cudaStream_t t_current_stream = nullptr;

// Events recorded on every stream: passes when each stream reached its event.
class StreamsFence final : public Fence {
 public:
  StreamsFence(CudaContext& ctx, std::vector<cudaEvent_t> events) : ctx_(ctx), events_(std::move(events)) {}
  ~StreamsFence() override {
    for (cudaEvent_t e : events_) ctx_.giveEvent(e, false);
  }
  bool done() override {
    std::lock_guard<std::mutex> lk(mu_);  // one fence may guard blocks of both allocators
    while (!events_.empty()) {
      cudaError_t err = cudaEventQuery(events_.back());
      if (err == cudaErrorNotReady) return false;
      MF_CUDA_CHECK(err);
      ctx_.giveEvent(events_.back(), false);
      events_.pop_back();
    }
    return true;
  }
  void wait() override {
    std::lock_guard<std::mutex> lk(mu_);
    for (cudaEvent_t e : events_) MF_CUDA_CHECK(cudaEventSynchronize(e));
  }

 private:
  std::mutex mu_;
  CudaContext& ctx_;
  std::vector<cudaEvent_t> events_;
};

}  // namespace

cudaStream_t currentStream() { return t_current_stream; }

StreamScope::StreamScope(cudaStream_t s) : saved_(t_current_stream) { t_current_stream = s; }
StreamScope::~StreamScope() { t_current_stream = saved_; }

std::shared_ptr<CudaContext> CudaContext::create(int device) {
  const int d = requireDevice(device);
  static std::mutex mu;
  static std::map<int, std::weak_ptr<CudaContext>> contexts;
  std::lock_guard<std::mutex> lk(mu);
  if (std::shared_ptr<CudaContext> ctx = contexts[d].lock()) return ctx;
  std::shared_ptr<CudaContext> ctx(new CudaContext(d));
  contexts[d] = ctx;
  return ctx;
}

Submission::Submission(CudaContext& ctx, int64_t fallback) : ctx_(ctx) {
  cudaStream_t s = currentStream();
  stream_ = s != nullptr ? s : ctx.stream(fallback);
}

Submission::~Submission() { ctx_.fences_->noteWork(); }

CudaContext::CudaContext(int device) : device_(device), props_(deviceProperties(device)) {
  fences_ = std::make_unique<SharedFences>([this] { return makeFence(); });
  activate();
  MF_CUDA_CHECK(cudaFree(nullptr));  // creates the primary context now, not in the first timed call
  CachingAllocator::Hooks dev;
  dev.alloc = [this](size_t n) -> void* {
    activate();
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, n);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    MF_CUDA_CHECK(err);
    return p;
  };
  dev.free = [this](void* p) {  // never throws: it runs in the allocator's destructor
    (void)cudaSetDevice(device_);
    (void)cudaFree(p);  // errors at exit (driver already unloading) are harmless here
  };
  dev.fence = [this] { return fence(); };
  device_memory_ = std::make_unique<CachingAllocator>(fmt::format("GPU memory on device {}", device_), dev);
  CachingAllocator::Hooks host = dev;
  host.alloc = [this](size_t n) -> void* {
    activate();
    void* p = nullptr;
    cudaError_t err = cudaHostAlloc(&p, n, cudaHostAllocPortable);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    MF_CUDA_CHECK(err);
    return p;
  };
  host.free = [](void* p) { (void)cudaFreeHost(p); };
  pinned_memory_ = std::make_unique<CachingAllocator>("pinned host memory", host);
}

CudaContext::~CudaContext() {
  (void)cudaSetDevice(device_);  // no activate(): it throws, and the runtime may be tearing down
  for (auto& [id, s] : streams_) (void)cudaStreamSynchronize(s);
  fences_->clear();
  device_memory_.reset();
  pinned_memory_.reset();
  for (auto& [id, s] : streams_) (void)cudaStreamDestroy(s);
  for (auto& pool : events_)
    for (cudaEvent_t e : pool) (void)cudaEventDestroy(e);
}

void CudaContext::activate() const {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device_) MF_CUDA_CHECK(cudaSetDevice(device_));
}

cudaStream_t CudaContext::stream(int64_t id) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = streams_.find(id);
  if (it != streams_.end()) return it->second;
  activate();
  cudaStream_t s = nullptr;
  MF_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  streams_.emplace(id, s);
  return s;
}

std::vector<cudaStream_t> CudaContext::allStreams() {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<cudaStream_t> out;
  for (auto& [id, s] : streams_) out.push_back(s);
  return out;
}

cudaEvent_t CudaContext::takeEvent(bool timing) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto& pool = events_[timing ? 1 : 0];
    if (!pool.empty()) {
      cudaEvent_t e = pool.back();
      pool.pop_back();
      return e;
    }
  }
  activate();
  cudaEvent_t e = nullptr;
  MF_CUDA_CHECK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  return e;
}

void CudaContext::giveEvent(cudaEvent_t e, bool timing) {
  std::lock_guard<std::mutex> lk(mu_);
  events_[timing ? 1 : 0].push_back(e);
}

std::shared_ptr<Fence> CudaContext::makeFence() {
  activate();
  std::vector<cudaEvent_t> events;
  try {
    for (cudaStream_t s : allStreams()) {
      cudaEvent_t e = takeEvent(false);
      events.push_back(e);
      MF_CUDA_CHECK(cudaEventRecord(e, s));
    }
  } catch (...) {
    for (cudaEvent_t e : events) giveEvent(e, false);
    throw;
  }
  return std::make_shared<StreamsFence>(*this, std::move(events));
}

Tensor CudaContext::allocateTensor(const std::shared_ptr<CudaContext>& ctx, DataType dtype,
                                   const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  void* p = ctx->device_memory_->allocate(static_cast<size_t>(n * dtypeSize(dtype)));
  // The owner returns the block to the cache; it keeps the context (and its allocator) alive.
  std::shared_ptr<void> owner(p, [ctx](void* q) { ctx->device_memory_->release(q); });
  return Tensor::wrap(p, dtype, shape, std::move(owner), Device::Cuda);
}

std::shared_ptr<void> CudaContext::pinned(const std::shared_ptr<CudaContext>& ctx, size_t bytes) {
  void* p = ctx->pinned_memory_->allocate(bytes);
  return std::shared_ptr<void>(p, [ctx](void* q) { ctx->pinned_memory_->release(q); });
}

}  // namespace meshfuse::cuda
