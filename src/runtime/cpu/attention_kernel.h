// The CPU's tiled attention (a kir::Attention step): query tiles against key/value tiles with an
// online softmax, scores of one tile pair at a time (docs/kernels.md "Tiled attention").
#pragma once

#include <cstdint>
#include <vector>

#include "codegen/kernel_ir.h"
#include "runtime/backend.h"

namespace meshfuse::cpu {

// Tile sizes: 64 query rows x 128 keys. One tile pair's scores are 32 KiB of f32, the running
// output 64 x dv floats (32 KiB at dv = 128), a K or V tile 128 x d floats (64 KiB at d = 128):
// together they stay in a core's L2 (>= 512 KiB on current x86 server cores), and each GEMM is
// large enough (64 x 128 x d) for BLAS to run near its peak.
inline constexpr int64_t kAttentionQueryTile = 64;
inline constexpr int64_t kAttentionKeyTile = 128;

// Runs `a` on the program's buffer pointers (f32). Memory: O(tile^2 + tile * dv) per thread, from
// a thread-local scratch that is reused (never O(s * skv)). `launch` (a ring attention step, or
// nullptr): the global positions of the rows, and whether to continue the online softmax the
// outputs hold (the running output read from a.o_rounded, of `rounded_dtype`, when it is set).
void runAttention(const kir::Attention& a, void* const* buffers, const AttentionLaunch* launch = nullptr,
                  DataType rounded_dtype = DataType::Float);

// Local rows [local, local + count) are global positions [global, global + count).
struct RowBlock {
  int64_t local = 0, global = 0, count = 0;
};

// The blocks of `rows` local rows: `launch`'s (`what`: "query" or "key", for the error), or one
// block where local is global.
std::vector<RowBlock> rowBlocks(const std::vector<AttentionLaunch::Rows>* launch, int64_t rows, const char* what);

// Runs the attention gradient `a` (a.wrt >= 0; attention_grad_kernel.cpp) on the program's buffer
// pointers: tiles of the same sizes, each tile pair's terms added into the gradient, which starts
// at 0, or (a ring step's `launch` that accumulates) at what a.o (or the 16-bit a.o_rounded) holds.
void runAttentionGrad(const kir::Attention& a, void* const* buffers, const AttentionLaunch* launch = nullptr,
                      DataType rounded_dtype = DataType::Float);

// exp(x[i] - shift) into x[i], vectorized (a Cephes-style range reduction and a degree-6
// polynomial; relative error < 3e-7; -inf and anything below -87 give exactly 0). Exposed for
// the unit test against std::exp.
void expShiftedInPlace(float* x, int64_t n, float shift);

}  // namespace meshfuse::cpu
