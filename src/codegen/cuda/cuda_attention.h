// The CUDA kernels of kir::Attention steps: flash-attention style tiling with an online softmax
// for the forward, FlashAttention's backward for the gradient (docs/cuda.md "Tiled attention").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codegen/kernel_ir.h"
#include "codegen/cuda/cuda_emitter.h"

namespace meshfuse::cuda {

// Where an attention launch's rows lie in the global sequence, and whether it continues what its
// outputs hold (the runtime's AttentionLaunch, as a kernel argument): every attention kernel takes
// it by value as its second parameter (KernelLaunch::attention_rows). The layout is the CUDA C
// struct MfAttentionRows the kernels declare (kAttentionRowsSource), field for field.
inline constexpr int kMaxRowBlocks = 4;
struct AttentionRowsArg {
  // Local rows [local[i], local[i] + count[i]) are global positions [global[i], ...), in local
  // order, covering the local rows.
  struct Blocks {
    long long local[kMaxRowBlocks] = {}, global[kMaxRowBlocks] = {}, count[kMaxRowBlocks] = {};
    int n = 0;
    // Appends the next `count` local rows at global position `start`; an InternalError past
    // kMaxRowBlocks blocks (`what`: "query" or "key").
    void add(int64_t start, int64_t count, const char* what);
    int64_t rows() const { return n == 0 ? 0 : local[n - 1] + count[n - 1]; }
  };
  Blocks query, key;
  int accumulate = 0;  // continue the online softmax (forward) or add into the gradient (backward)

  // Every row at its own position, starting afresh: a launch that is not a ring step.
  static AttentionRowsArg whole(int64_t query_rows, int64_t key_rows);
};
static_assert(sizeof(AttentionRowsArg) == 2 * (12 * 8 + 8) + 8, "AttentionRowsArg must match MfAttentionRows");

// Tiles of one attention kernel: query rows and keys per tile, chosen so the block's shared memory
// stays within the 48 KiB a kernel gets without opting in, and each thread's accumulators within
// 32 registers.
struct AttentionTiles {
  int rows = 0, keys = 0;
  int64_t shared_floats = 0;
};
// Throws UnsupportedError when head sizes are too large for any tile (d + dv above ~700).
AttentionTiles attentionTiles(const kir::Attention& a);

// The kernel's source (named `launch.name`, taking `bufs_type` as the other emitted kernels do,
// then the AttentionRowsArg) and its launch geometry, written into `launch`: the forward kernel,
// or (a.wrt >= 0) the gradient's (cuda_attention_grad.cpp). `buffers`: the program's (the dtypes
// of the 16-bit outputs a continuing launch reads its state from).
// `arch`: the GPU's compute capability (emitCuda's). A forward step whose operands were 16-bit
// runs on tensor cores where attentionOnTensorCores says so (cuda_attention_mma.cpp).
std::string emitAttentionKernel(const kir::Attention& a, const std::vector<kir::Buffer>& buffers,
                                const std::string& bufs_type, KernelLaunch& launch, int arch = 90);
std::string emitAttentionGradKernel(const kir::Attention& a, const std::vector<kir::Buffer>& buffers,
                                    const std::string& bufs_type, KernelLaunch& launch);

// Whether the forward step `a` runs on tensor cores on a GPU of compute capability `arch`: its
// operands were bf16 or f16 (kir::Attention::operands), sm_80 or later, head sizes up to 256, and
// the environment variable MESHFUSE_CUDA_ATTENTION is not "scalar" (benchmarks compare the two).
bool attentionOnTensorCores(const kir::Attention& a, int arch);
std::string emitAttentionMmaKernel(const kir::Attention& a, const std::vector<kir::Buffer>& buffers,
                                   const std::string& bufs_type, KernelLaunch& launch);

// Shared by the attention kernels' sources: MfAttentionRows and the position helpers (guarded, so a
// program with several attention steps declares them once).
extern const char* kAttentionRowsSource;
// The forward kernels' operand declarations: SCALE, the pointers q, k, v, o and lse, and
// O_STATE(i), the running output a continuing launch starts from.
std::string attentionOperands(const kir::Attention& a, const std::vector<kir::Buffer>& buffers);
// A pointer expression for buffer `b` ("nullptr" when b < 0), of `type` ("const float*", ...).
std::string attentionBuffer(int64_t b, const char* type);
// The f32 value of element `index` (a C expression) of the 16-bit or f32 buffer `b` of `dtype`.
std::string attentionLoad(int64_t b, DataType dtype, const std::string& index);

}  // namespace meshfuse::cuda
