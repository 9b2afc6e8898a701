// Recycling host allocator (contract in host_allocator.h).
#include "runtime/cpu/host_allocator.h"

#include <cstdlib>
#include <mutex>
#include <unordered_map>

#include "meshfuse/error.h"
#include "meshfuse/ir/extent.h"
#include "runtime/memory.h"

namespace meshfuse::cpu {

struct HostAllocator::Pool {
  explicit Pool(size_t limit) : limit(limit) {}
  ~Pool() {
    for (auto& [bytes, blocks] : free)
      for (void* p : blocks) std::free(p);
  }

  void* take(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = free.find(bytes);
      if (it != free.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached -= bytes;
        return p;
      }
    }
    return std::aligned_alloc(64, bytes);  // nullptr: out of memory (allocate() says for what)
  }

  void give(void* p, size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (cached + bytes <= limit) {
        free[bytes].push_back(p);
        cached += bytes;
        return;
      }
    }
    std::free(p);
  }

  std::mutex mu;
  std::unordered_map<size_t, std::vector<void*>> free;  // by byte size
  size_t cached = 0;
  const size_t limit;
};

HostAllocator::HostAllocator(size_t max_cached_bytes) : pool_(std::make_shared<Pool>(max_cached_bytes)) {}

Tensor HostAllocator::allocate(DataType dtype, const std::vector<int64_t>& shape) {
  for (int64_t s : shape) MF_USER_CHECK(s >= 0, ErrorKind::Shape, "negative tensor size {}", s);
  // A tensor larger than the machine (or than an int64 can count) is refused before it is tried.
  checkAllocation("", dtype, shape, hostMemoryLimit());
  const int64_t n = *checkedNumel(shape, dtypeSize(dtype)) * dtypeSize(dtype);
  const size_t bytes = std::max<size_t>(64, (static_cast<size_t>(n) + 63) / 64 * 64);
  void* p = pool_->take(bytes);
  MF_USER_CHECK(p != nullptr, ErrorKind::Runtime,
                "cannot allocate a {} tensor of shape [{}]: {} bytes ({}): out of host memory", dtypeName(dtype),
                fmt::join(shape, ", "), n, formatBytes(n));
  std::shared_ptr<Pool> pool = pool_;
  std::shared_ptr<void> owner(p, [pool, bytes](void* q) { pool->give(q, bytes); });
  return Tensor::wrap(p, dtype, shape, std::move(owner));
}

}  // namespace meshfuse::cpu
