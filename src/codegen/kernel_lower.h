// Lowering of segments to kernel IR programs (the entry point is kir::lowerSegment in
// meshfuse/kernel_ir.h). Each segment kind has its own file:
//   kernel_lower.cpp  Kernel segments: the element graph scheduled as one loop nest
//   kernel_gemm.cpp   Gemm segments: linear / matmul as GEMM calls plus small loop nests, sdpa /
//                     sdpa_lse as one Attention step
#pragma once

#include "codegen/kernel_ir.h"

namespace meshfuse::kir {

// Both append steps (and temporaries) to `program`, whose buffers already are the segment's
// inputs then its outputs.
void lowerKernelSegment(const Segment& seg, const LocalShapeFn& shape_of, Program& program);
void lowerGemmSegment(const Segment& seg, const LocalShapeFn& shape_of, Program& program);

// For benchmarks only: sdpa segments lowered from now on use the lowering the tiled kernel
// replaced (a materialized [s, skv] score matrix between two GEMMs; an sdpa_lse still takes the
// tiled kernel). Backends cache lowered programs, so this affects segments a backend lowers
// afterwards. Default: MESHFUSE_SDPA_MATERIALIZED=1 in the environment.
void setMaterializedAttentionForBenchmarks(bool on);

}  // namespace meshfuse::kir
