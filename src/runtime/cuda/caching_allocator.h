// A caching allocator for memory that asynchronous work (GPU streams) reads and writes.
//
// Freeing device memory with cudaFree synchronizes the whole device, and allocating with
// cudaMalloc costs tens of microseconds; the host program allocates and frees every
// intermediate on every run. So released blocks are kept and handed out again. A block released
// while work already submitted may still use it (the host runs ahead of the GPU) becomes reusable
// only once a *fence* taken at release time has passed: the fence marks "all work submitted so
// far, on every stream", which is safe without tracking which streams used which block.
//
// The raw allocation, free and fence are hooks, so the same logic serves device memory and
// pinned host memory, and is unit-tested on the host with fake fences.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace meshfuse::cuda {

class Fence {
 public:
  virtual ~Fence() = default;
  virtual bool done() = 0;  // non-blocking
  virtual void wait() = 0;  // blocks the host until done
};

// Fences shared between frees: a fence covers all work submitted before it was taken, so the
// frees that follow it may share it until more work is submitted. Whoever submits work calls
// noteWork() AFTER submitting it (while still holding the buffers the work uses): a free that
// can only happen after that sees the new count and gets a fresh fence. Thread-safe.
class SharedFences {
 public:
  explicit SharedFences(std::function<std::shared_ptr<Fence>()> make) : make_(std::move(make)) {}
  std::shared_ptr<Fence> get();
  void noteWork() { work_.fetch_add(1, std::memory_order_acq_rel); }
  void clear();  // drops the cached fence

 private:
  std::function<std::shared_ptr<Fence>()> make_;
  std::atomic<uint64_t> work_{0};
  std::mutex mu_;
  std::shared_ptr<Fence> last_;
  uint64_t last_work_ = ~uint64_t{0};
};

class CachingAllocator {
 public:
  struct Hooks {
    std::function<void*(size_t)> alloc;             // nullptr when out of memory; throws on other errors
    std::function<void(void*)> free;                // never throws
    std::function<std::shared_ptr<Fence>()> fence;  // passes when all work submitted so far is done
  };
  struct Stats {
    int64_t in_use_bytes = 0, cached_bytes = 0, peak_in_use_bytes = 0;
    int64_t raw_allocs = 0, reuses = 0;
    int64_t unfenced = 0;  // blocks released when no fence could be taken (leaked, never reused)
  };

  // `what` names the memory in out-of-memory errors ("GPU memory", "pinned host memory").
  CachingAllocator(std::string what, Hooks hooks);
  ~CachingAllocator();  // waits for pending fences, then frees every block (never throws)
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // At least `bytes` bytes (a distinct pointer also for 0). When the raw allocation fails, waits
  // for pending blocks, frees the cache and retries; then throws RuntimeError naming the sizes.
  void* allocate(size_t bytes);
  // Gives back a pointer from allocate(); reusable once the fence taken now has passed. Never
  // throws (it runs in tensors' destructors): when no fence can be taken (the device faulted, the
  // runtime is shutting down) the block is never reused nor freed -- leaked, as work queued on it
  // may still run -- and counted in Stats::unfenced.
  void release(void* p) noexcept;
  // Frees every cached block (waiting for pending ones first).
  void emptyCache();
  Stats stats() const;

  // Block sizes are rounded so that blocks are reusable across slightly different requests:
  // 512-byte granules below 1 MiB, 2 MiB granules above.
  static size_t roundSize(size_t bytes);

 private:
  struct Pending {
    std::shared_ptr<Fence> fence;
    void* ptr;
    size_t size;
  };
  void collectLocked(bool wait);  // moves passed pending blocks to the free lists
  void freeCachedLocked();

  std::string what_;
  Hooks hooks_;
  mutable std::mutex mu_;
  std::unordered_map<void*, size_t> in_use_;
  std::multimap<size_t, void*> free_;  // size -> block, ready for reuse
  std::deque<Pending> pending_;        // in release order
  Stats stats_;
};

}  // namespace meshfuse::cuda
