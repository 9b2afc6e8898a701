// Options of communication/compute overlap (decompose-for-overlap and assign-streams).
#pragma once

#include <cstdint>
#include <string>

namespace meshfuse {

struct OverlapOptions {
  // Applied to every allgather+GEMM, GEMM+reduce-scatter and GEMM+allreduce pair:
  //   "none" (only pairs the user's schedule chunks), "collective" or "ring".
  std::string algorithm = "none";
  int64_t chunks = 0;   // 0: as many as devices on the collective's mesh axis
  int64_t streams = 2;  // the stream pool collective-based iterations rotate through
};

}  // namespace meshfuse
