// The caching allocator (see caching_allocator.h).
#include "runtime/cuda/caching_allocator.h"

#include <algorithm>
#include <cstdio>

#include "meshfuse/error.h"

namespace meshfuse::cuda {

CachingAllocator::CachingAllocator(std::string what, Hooks hooks) : what_(std::move(what)), hooks_(std::move(hooks)) {}

std::shared_ptr<Fence> SharedFences::get() {
  // Read before taking the fence: work noted later may not be covered by it, so the fence is
  // cached under this count and a later count makes a new one.
  const uint64_t work = work_.load(std::memory_order_acquire);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (last_ && last_work_ == work) return last_;
  }
  std::shared_ptr<Fence> f = make_();
  std::lock_guard<std::mutex> lk(mu_);
  last_ = f;
  last_work_ = work;
  return f;
}

void SharedFences::clear() {
  std::lock_guard<std::mutex> lk(mu_);
  last_.reset();
  last_work_ = ~uint64_t{0};
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lk(mu_);
  try {
    collectLocked(/*wait=*/true);
  } catch (...) {
    // A fence that cannot be waited for (a faulted device): its blocks are leaked, not freed
    // under work that may still run. The blocks already free are given back below.
    pending_.clear();
  }
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

void CachingAllocator::release(void* p) noexcept {
  std::shared_ptr<Fence> fence;
  try {
    fence = hooks_.fence();  // outside the lock: it may call into CUDA
  } catch (...) {
  }
  std::lock_guard<std::mutex> lk(mu_);
  auto it = in_use_.find(p);
  if (it == in_use_.end()) {  // a bug, reported without throwing (this runs in destructors)
    std::fprintf(stderr, "meshfuse: internal error (this is a bug): release of a pointer the %s allocator did not "
                 "hand out\n", what_.c_str());
    return;
  }
  stats_.in_use_bytes -= static_cast<int64_t>(it->second);
  if (fence) {
    pending_.push_back({std::move(fence), p, it->second});
    stats_.cached_bytes += static_cast<int64_t>(it->second);
  } else {
    ++stats_.unfenced;
  }
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
