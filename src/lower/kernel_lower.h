// Lowering of segments to kernel IR programs (the entry point is kir::lowerSegment in
// meshfuse/kernel_ir.h). Each segment kind has its own file:
//   kernel_lower.cpp  Kernel segments: the element graph scheduled as one loop nest
//   kernel_gemm.cpp   Gemm segments: linear / matmul / sdpa as GEMM calls plus small loop nests
#pragma once

#include "meshfuse/kernel_ir.h"

namespace meshfuse::kir {

// Both append steps (and temporaries) to `program`, whose buffers already are the segment's
// inputs then its outputs.
void lowerKernelSegment(const Segment& seg, const LocalShapeFn& shape_of, Program& program);
void lowerGemmSegment(const Segment& seg, const LocalShapeFn& shape_of, Program& program);

}  // namespace meshfuse::kir
