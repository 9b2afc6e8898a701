// Options of the passes (explicit structs: no pass reads the environment; STYLE.md #12).
#pragma once

#include <cstdint>
#include <string>

namespace meshfuse {

// propagate-shardings.
struct PropagationOptions {
  // Fully sharded data parallelism: parameters are all-gathered where they are used and the
  // activations keep their sharding (by default parameters stay and activations move).
  bool gather_parameters = false;
};

// decompose-for-overlap and the streams of its loops.
struct OverlapOptions {
  // Applied to every allgather+GEMM, GEMM+reduce-scatter and GEMM+allreduce pair:
  //   "none" (only pairs the user's schedule chunks), "collective" or "ring".
  std::string algorithm = "none";
  int64_t chunks = 0;   // 0: as many as devices on the collective's mesh axis
  int64_t streams = 2;  // the stream pool collective-based iterations rotate through
};

}  // namespace meshfuse
