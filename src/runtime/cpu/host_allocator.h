// The CPU backend's memory: 64-byte aligned host buffers recycled by exact size.
//
// The host-IR evaluator allocates every intermediate of every run and frees it after its last
// use; with plain malloc each large buffer is fresh mmap'd memory whose first touch page-faults
// (a 256 MB tensor costs ~100 ms of faults, more than the kernel that writes it). A freed buffer
// goes back to a per-backend pool and the next allocation of the same byte size takes it, so a
// cached run touches no new pages. Pooled-but-free memory is bounded (beyond the bound buffers
// are released to the system). Buffers may outlive the backend: the pool is shared with them.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "meshfuse/tensor.h"

namespace meshfuse::cpu {

class HostAllocator {
 public:
  explicit HostAllocator(size_t max_cached_bytes = size_t{2} << 30);
  Tensor allocate(DataType dtype, const std::vector<int64_t>& shape);

 private:
  struct Pool;
  std::shared_ptr<Pool> pool_;
};

}  // namespace meshfuse::cpu
