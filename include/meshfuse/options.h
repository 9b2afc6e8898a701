// Options of the passes (explicit structs: no pass reads the environment; STYLE.md #12).
#pragma once

#include <cstdint>
#include <string>

namespace meshfuse {

// propagate-shardings.
// How attention whose sequence dim arrives sharded is parallelized (docs/parallelisms.md
// "Context parallelism").
//   Auto:    Ulysses where the heads divide the mesh axis, else gather the sequence;
//   Ulysses: Ulysses, with heads the mesh does not divide split as torch.chunk splits them
//            (Auto is kept apart so that ring attention can join its choice);
//   Gather:  all-gather q, k and v (every rank holds the whole sequence).
enum class ContextParallel { Auto, Ulysses, Gather };
// "auto" | "ulysses" | "gather" (the CLI's --cp, Python's cp=); a ValueError names the others.
ContextParallel parseContextParallel(const std::string& name);

struct PropagationOptions {
  // Fully sharded data parallelism: parameters are all-gathered where they are used and the
  // activations keep their sharding (by default parameters stay and activations move).
  bool gather_parameters = false;
  ContextParallel context_parallel = ContextParallel::Auto;
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
