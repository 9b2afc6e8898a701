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

// A staging buffer for `n` chunks of `chunk_shape`, laid out as one tensor whose dim 0 is n
// times longer: chunk j is the block at dim-0 offset j * chunk_shape[0] (contiguous).
inline std::vector<int64_t> stagingShape(std::vector<int64_t> chunk_shape, int64_t n) {
  chunk_shape.at(0) *= n;
  return chunk_shape;
}

}  // namespace meshfuse
