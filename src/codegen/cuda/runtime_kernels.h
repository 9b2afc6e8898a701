// The CUDA C that every generated program starts with (the prelude: storage types and exact
// bf16/f16 conversions, no CUDA headers needed), and the runtime's own data-movement kernels:
// accumulate (dst += src, for ring reductions) and rectangular block copies (slices, all-to-all
// packing).
//
// bf16 and f16 live in memory as their 16-bit patterns (as on the host); kernels compute in f32
// and round to nearest even when storing, exactly as the CPU's floatToBf16Bits/floatToHalfBits.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "meshfuse/ir/dtype.h"

namespace meshfuse::cuda {

const std::string& cudaPrelude();
// accumulate and block-copy kernels; names below.
const std::string& runtimeKernelsSource();
std::string accumulateKernelName(DataType dt);  // "mf_accumulate_bf16"
std::string copyBlockKernelName(int64_t unit);  // "mf_copy_block_16"

constexpr int kMaxBlockDims = 8;

// How to copy a rectangular block between row-major tensors: either one contiguous run of
// `bytes` (a cudaMemcpyAsync), or a kernel moving `total` units of `unit` bytes (the widest of
// 16/8/4/2/1 that divides every run, stride and address), each unit at
//   src + src_offset + sum_d idx[d] * src_strides[d] * unit   (likewise dst)
// for idx over `sizes`. Size-1 dims are dropped and adjacent dims merged first.
struct BlockCopyPlan {
  bool contiguous = false;
  int64_t bytes = 0;  // contiguous: the run's length
  int64_t src_offset = 0, dst_offset = 0;  // bytes from the tensors' data pointers
  int64_t unit = 1;
  int rank = 0;
  std::array<int64_t, kMaxBlockDims> sizes{}, src_strides{}, dst_strides{};  // in units
  int64_t total = 0;  // units
};

// `src_addr`/`dst_addr`: the tensors' data addresses (alignment decides the unit).
BlockCopyPlan planBlockCopy(int64_t elem_size, const std::vector<int64_t>& src_shape,
                            const std::vector<int64_t>& src_offsets, const std::vector<int64_t>& dst_shape,
                            const std::vector<int64_t>& dst_offsets, const std::vector<int64_t>& sizes,
                            uintptr_t src_addr, uintptr_t dst_addr);

// The kernel arguments of a block copy, laid out as the kernel's MfDims parameter.
struct BlockCopyDims {
  long long sizes[kMaxBlockDims], src[kMaxBlockDims], dst[kMaxBlockDims];
};
BlockCopyDims kernelDims(const BlockCopyPlan& plan);

}  // namespace meshfuse::cuda
