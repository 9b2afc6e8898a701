// The caching allocator (see caching_allocator.h).
#include "runtime/cuda/caching_allocator.h"

#include <algorithm>

#include "meshfuse/error.h"

namespace meshfuse::cuda {

CachingAllocator::CachingAllocator(std::string what, Hooks hooks) : what_(std::move(what)), hooks_(std::move(hooks)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lk(mu_);
  collectLocked(/*wait=*/true);
  freeCachedLocked();
  // Blocks still in use belong to tensors that outlive us only if their owner forgot to keep
  // the allocator alive; they are leaked rather than freed under a user.
}

size_t CachingAllocator::roundSize(size_t bytes) {
  constexpr size_t kSmall = 512, kLarge = 2u << 20, kLargeFrom = 1u << 20;
  bytes = std::max<size_t>(bytes, 1);
  if (bytes < kLargeFrom) return (bytes + kSmall - 1) / kSmall * kSmall;
  return (bytes + kLarge - 1) / kLarge * kLarge;
}

void* CachingAllocator::allocate(size_t bytes) {
  const size_t size = roundSize(bytes);
  std::lock_guard<std::mutex> lk(mu_);
  collectLocked(/*wait=*/false);
  // Best fit among cached blocks, accepting up to 25% slack so a big block is not wasted on a
  // small request.
  auto it = free_.lower_bound(size);
  if (it != free_.end() && it->first <= size + size / 4) {
    void* p = it->second;
    size_t got = it->first;
    free_.erase(it);
    stats_.cached_bytes -= static_cast<int64_t>(got);
    in_use_.emplace(p, got);
    stats_.in_use_bytes += static_cast<int64_t>(got);
    stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
    ++stats_.reuses;
    return p;
  }
  void* p = hooks_.alloc(size);
  if (p == nullptr) {  // out of memory: give the cache back and try once more
    collectLocked(/*wait=*/true);
    freeCachedLocked();
    p = hooks_.alloc(size);
  }
  MF_USER_CHECK(p != nullptr, ErrorKind::Runtime,
                "out of {} allocating {} bytes ({} bytes in use by meshfuse, peak {})", what_, size,
                stats_.in_use_bytes, stats_.peak_in_use_bytes);
  in_use_.emplace(p, size);
  stats_.in_use_bytes += static_cast<int64_t>(size);
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  ++stats_.raw_allocs;
  return p;
}

void CachingAllocator::release(void* p) {
  std::shared_ptr<Fence> fence = hooks_.fence();  // outside the lock: it may call into CUDA
  std::lock_guard<std::mutex> lk(mu_);
  auto it = in_use_.find(p);
  MF_CHECK(it != in_use_.end(), "release of a pointer this {} allocator did not hand out", what_);
  pending_.push_back({std::move(fence), p, it->second});
  stats_.in_use_bytes -= static_cast<int64_t>(it->second);
  stats_.cached_bytes += static_cast<int64_t>(it->second);
  in_use_.erase(it);
}

void CachingAllocator::emptyCache() {
  std::lock_guard<std::mutex> lk(mu_);
  collectLocked(/*wait=*/true);
  freeCachedLocked();
}

CachingAllocator::Stats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

void CachingAllocator::collectLocked(bool wait) {
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (wait) it->fence->wait();
    if (!wait && !it->fence->done()) {
      ++it;
      continue;
    }
    free_.emplace(it->size, it->ptr);
    it = pending_.erase(it);
  }
}

void CachingAllocator::freeCachedLocked() {
  for (auto& [size, p] : free_) {
    hooks_.free(p);
    stats_.cached_bytes -= static_cast<int64_t>(size);
  }
  free_.clear();
}

}  // namespace meshfuse::cuda
