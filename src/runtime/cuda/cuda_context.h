// The per-process state of one GPU that every CUDA backend on it, their streams and the NCCL
// communicator share: the device, the CUDA streams (created on first use), pooled events, the
// caching device allocator and pinned host staging memory. One context per device and process
// (CudaContext::create), so that a block freed by any of them is fenced on every stream that may
// use it, also when a tensor passes from one backend to another.
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
  // The process's context of `device` (-1: the current device), made on first use and shared
  // while anyone holds it. Throws RuntimeError "no CUDA device: ..." when it is not usable.
  static std::shared_ptr<CudaContext> create(int device);
  ~CudaContext();  // never throws (it may run during the CUDA runtime's own teardown)

  // The stream id of the NCCL communicator's work outside tasks: a stream of this context, so
  // that fences cover it.
  static constexpr int64_t kCommunicatorStream = -1;

  int device() const { return device_; }
  const DeviceProperties& properties() const { return props_; }
  // Makes this context's device current on the calling thread (cheap when it already is).
  void activate() const;

  // Stream `id` of the host program (0 is the main stream), created on first use as a
  // non-blocking stream, so that it never synchronizes implicitly with the legacy stream.
  cudaStream_t stream(int64_t id);
  // Every stream created so far (the allocator's fences and synchronize() cover these).
  std::vector<cudaStream_t> allStreams();

  // Pooled events: creating one costs a driver call; `timing` events can measure elapsed time.
  cudaEvent_t takeEvent(bool timing);
  void giveEvent(cudaEvent_t e, bool timing);

  // A fence over every stream created so far (see caching_allocator.h). Reused while no new
  // work was submitted: all work is enqueued inside a Submission, which notes it.
  std::shared_ptr<Fence> fence() { return fences_->get(); }

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

  friend class Submission;
  std::shared_ptr<Fence> makeFence();

  int device_;
  DeviceProperties props_;
  std::mutex mu_;
  std::map<int64_t, cudaStream_t> streams_;
  std::vector<cudaEvent_t> events_[2];  // [timing]
  std::unique_ptr<SharedFences> fences_;
  std::unique_ptr<CachingAllocator> device_memory_, pinned_memory_;
};

// Work about to be enqueued on a context's streams, the only way to get a stream to enqueue on:
// stream() is the calling task's stream (else the context's stream `fallback`, 0: the main
// stream). When the Submission ends the work counts as submitted, so that every block freed
// afterwards is fenced after it (caching_allocator.h: SharedFences). Keep the buffers the work
// uses alive until then.
class Submission {
 public:
  explicit Submission(CudaContext& ctx, int64_t fallback = 0);
  ~Submission();
  Submission(const Submission&) = delete;
  Submission& operator=(const Submission&) = delete;
  cudaStream_t stream() const { return stream_; }

 private:
  CudaContext& ctx_;
  cudaStream_t stream_;
};

}  // namespace meshfuse::cuda
