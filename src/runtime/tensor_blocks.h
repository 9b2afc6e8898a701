// Copying rectangular blocks between row-major tensors (used to slice shards out of full
// tensors, assemble them back, and pack/unpack collective staging buffers).
#pragma once

#include <vector>

#include "meshfuse/tensor.h"

namespace meshfuse {

// dst[dst_offsets + i] = src[src_offsets + i] for every index i < sizes (same dtype and rank).
void copyBlock(const Tensor& src, const std::vector<int64_t>& src_offsets, Tensor& dst,
               const std::vector<int64_t>& dst_offsets, const std::vector<int64_t>& sizes);
// dst[dst_offsets + i] += src[i]-block (element-wise add, via double).
void addBlock(const Tensor& src, const std::vector<int64_t>& src_offsets, Tensor& dst,
              const std::vector<int64_t>& dst_offsets, const std::vector<int64_t>& sizes);

}  // namespace meshfuse
