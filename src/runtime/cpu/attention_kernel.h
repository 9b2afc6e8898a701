// The CPU's tiled attention (a kir::Attention step): query tiles against key/value tiles with an
// online softmax, scores of one tile pair at a time (docs/kernels.md "Tiled attention").
#pragma once

#include <cstdint>

#include "codegen/kernel_ir.h"

namespace meshfuse::cpu {

// Tile sizes: 64 query rows x 128 keys. One tile pair's scores are 32 KiB of f32, the running
// output 64 x dv floats (32 KiB at dv = 128), a K or V tile 128 x d floats (64 KiB at d = 128):
// together they stay in a core's L2 (>= 512 KiB on current x86 server cores), and each GEMM is
// large enough (64 x 128 x d) for BLAS to run near its peak.
inline constexpr int64_t kAttentionQueryTile = 64;
inline constexpr int64_t kAttentionKeyTile = 128;

// Runs `a` on the program's buffer pointers (f32). Memory: O(tile^2 + tile * dv) per thread, from
// a thread-local scratch that is reused (never O(s * skv)).
void runAttention(const kir::Attention& a, void* const* buffers);

// exp(x[i] - shift) into x[i], vectorized (a Cephes-style range reduction and a degree-6
// polynomial; relative error < 3e-7; -inf and anything below -87 give exactly 0). Exposed for
// the unit test against std::exp.
void expShiftedInPlace(float* x, int64_t n, float shift);

}  // namespace meshfuse::cpu
