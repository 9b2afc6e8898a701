// The CUDA kernel of a kir::Attention step: flash-attention style tiling with an online softmax
// (docs/cuda.md "Tiled attention").
#pragma once

#include <string>

#include "codegen/kernel_ir.h"
#include "codegen/cuda/cuda_emitter.h"

namespace meshfuse::cuda {

// Tiles of one attention kernel: query rows and keys per tile, chosen so the block's shared memory
// stays within the 48 KiB a kernel gets without opting in, and each thread's output accumulators
// within 32 registers.
struct AttentionTiles {
  int rows = 0, keys = 0;
  int64_t shared_floats = 0;
};
// Throws UnsupportedError when head sizes are too large for any tile (d + dv above ~700).
AttentionTiles attentionTiles(const kir::Attention& a);

// The kernel's source (named `launch.name`, taking `bufs_type` as the other emitted kernels do)
// and its launch geometry, written into `launch`.
std::string emitAttentionKernel(const kir::Attention& a, const std::string& bufs_type, KernelLaunch& launch);

}  // namespace meshfuse::cuda
