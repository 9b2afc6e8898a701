// The per-process state of one GPU that the CUDA backend, its streams and its communicators
// share: the device, the CUDA streams (created on first use), pooled events, the caching device
// allocator and pinned host staging memory.
//
// Device tensors hold a reference to their context (in the Tensor's owner), so memory is given
// back to the cache, and the context outlives every tensor it allocated.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "meshfuse/tensor.h"
#include "runtime/cuda/caching_allocator.h"
#include "runtime/cuda/cuda_device.h"

namespace meshfuse::cuda {

// The stream of the task this thread is running (CudaStreams sets it around each task), or
// nullptr outside tasks. The backend's operations and the NCCL communicator enqueue on it.
cudaStream_t currentStream();

// Makes `s` the current stream of this thread until destroyed.
class StreamScope {
 public:
  explicit StreamScope(cudaStream_t s);
  ~StreamScope();
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  cudaStream_t saved_;
};

class CudaContext {
 public:
  // Throws RuntimeError "no CUDA device: ..." when `device` is not usable (-1: current device).
  static std::shared_ptr<CudaContext> create(int device);
  ~CudaContext();

  int device() const { return device_; }
  const DeviceProperties& properties() const { return props_; }
  // Makes this context's device current on the calling thread (cheap when it already is).
  void activate() const;

  // Stream `id` of the host program (0 is the main stream), created on first use as a
  // non-blocking stream, so that it never synchronizes implicitly with the legacy stream.
  cudaStream_t stream(int64_t id);
  // Every stream created so far (the allocator's fences and synchronize() cover these).
  std::vector<cudaStream_t> allStreams();
  // The current stream of this thread, else the main stream.
  cudaStream_t currentOrMain() { cudaStream_t s = currentStream(); return s != nullptr ? s : stream(0); }

  // Pooled events: creating one costs a driver call; `timing` events can measure elapsed time.
  cudaEvent_t takeEvent(bool timing);
  void giveEvent(cudaEvent_t e, bool timing);

  // A fence over every stream created so far (see caching_allocator.h). Reused while no new
  // work was submitted (noteWork()).
  std::shared_ptr<Fence> fence();
  void noteWork() { work_epoch_.fetch_add(1, std::memory_order_relaxed); }

  // Uninitialized device memory from the cache, as a Device::Cuda tensor.
  static Tensor allocateTensor(const std::shared_ptr<CudaContext>& ctx, DataType dtype,
                               const std::vector<int64_t>& shape);
  // Pinned host memory from its cache (staging for uploads, downloads and host-staged
  // communication); back to the cache when the last reference goes.
  static std::shared_ptr<void> pinned(const std::shared_ptr<CudaContext>& ctx, size_t bytes);

  CachingAllocator& deviceMemory() { return *device_memory_; }
  CachingAllocator& pinnedMemory() { return *pinned_memory_; }

 private:
  explicit CudaContext(int device);

  int device_;
  DeviceProperties props_;
  std::mutex mu_;
  std::map<int64_t, cudaStream_t> streams_;
  std::vector<cudaEvent_t> events_[2];  // [timing]
  std::atomic<uint64_t> work_epoch_{0};
  std::shared_ptr<Fence> last_fence_;
  uint64_t last_fence_epoch_ = ~uint64_t{0};
  std::unique_ptr<CachingAllocator> device_memory_, pinned_memory_;
};

}  // namespace meshfuse::cuda
