// CUDA staging memory for the host-staged communicator: pinned host twins from a caching pool,
// copies on the current task's stream (see host_staged_communicator.h).
#include "meshfuse/error.h"
#include "runtime/cuda/caching_allocator.h"
#include "runtime/cuda/cuda_context.h"
#include "runtime/cuda/cuda_error.h"
#include "runtime/cuda/host_staged_communicator.h"

namespace meshfuse::cuda {
namespace {

// Passes when the stream that was current at release time reached this point: the only
// asynchronous use of a twin is the copy back queued on that stream just before its release.
class EventFence final : public Fence {
 public:
  EventFence() {
    cudaStream_t s = currentStream();
    if (s == nullptr) return;  // outside tasks every copy was synchronous
    MF_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    MF_CUDA_CHECK(cudaEventRecord(event_, s));
  }
  ~EventFence() override {
    if (event_ != nullptr) (void)cudaEventDestroy(event_);
  }
  bool done() override {
    if (event_ == nullptr) return true;
    cudaError_t err = cudaEventQuery(event_);
    if (err == cudaErrorNotReady) return false;
    MF_CUDA_CHECK(err);
    return true;
  }
  void wait() override {
    if (event_ != nullptr) MF_CUDA_CHECK(cudaEventSynchronize(event_));
  }

 private:
  cudaEvent_t event_ = nullptr;
};

class CudaStagingMemory final : public StagingMemory {
 public:
  CudaStagingMemory() {
    CachingAllocator::Hooks hooks;
    hooks.alloc = [](size_t n) -> void* {
      void* p = nullptr;
      cudaError_t err = cudaHostAlloc(&p, n, cudaHostAllocPortable);
      if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return nullptr;
      }
      MF_CUDA_CHECK(err);
      return p;
    };
    hooks.free = [](void* p) { (void)cudaFreeHost(p); };
    hooks.fence = [] { return std::make_shared<EventFence>(); };
    pool_ = std::make_shared<CachingAllocator>("pinned host memory for communication", hooks);
  }

  bool onDevice(const void* p) override {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError();  // not memory CUDA knows: plain host memory
      return false;
    }
    return a.type == cudaMemoryTypeDevice;
  }

  std::shared_ptr<void> hostBuffer(size_t bytes) override {
    std::shared_ptr<CachingAllocator> pool = pool_;
    void* p = pool->allocate(bytes);
    return std::shared_ptr<void>(p, [pool](void* q) { pool->release(q); });
  }

  void toHost(void* host, const void* device, size_t bytes) override {
    cudaStream_t s = currentStream();
    if (s == nullptr) {  // outside a task: whatever produced the data may be on any stream
      MF_CUDA_CHECK(cudaDeviceSynchronize());
      MF_CUDA_CHECK(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost));
      return;
    }
    // Queued after the stream's earlier work (the producers, or the events it waits for).
    MF_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, s));
    MF_CUDA_CHECK(cudaStreamSynchronize(s));
  }

  void toDevice(void* device, const void* host, size_t bytes) override {
    cudaStream_t s = currentStream();
    if (s == nullptr) {
      // Outside a task: the buffer may still be read by work queued on any stream (all of them
      // non-blocking, so a copy on the legacy stream would not wait for them). Wait for the device,
      // then copy synchronously (pinned -> device: cudaMemcpy returns when it is done).
      MF_CUDA_CHECK(cudaDeviceSynchronize());
      MF_CUDA_CHECK(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice));
      return;
    }
    MF_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, s));
  }

 private:
  std::shared_ptr<CachingAllocator> pool_;
};

}  // namespace

std::shared_ptr<StagingMemory> makeCudaStagingMemory() {
  std::string why = unavailableReason();
  MF_USER_CHECK(why.empty(), ErrorKind::Runtime, "no CUDA device: {} (host staging needs one)", why);
  return std::make_shared<CudaStagingMemory>();
}

}  // namespace meshfuse::cuda
