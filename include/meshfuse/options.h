// Options of the passes (explicit structs: no pass reads the environment; STYLE.md #12).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "meshfuse/ir/extent.h"

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

// Everything compile() (src/lower/pipeline.h) needs: the options of each pass, plus how to
// verify, dump and time them.
struct PipelineOptions {
  PropagationOptions propagation;  // propagate-shardings (e.g. FSDP: gather parameters)
  OverlapOptions overlap;          // decompose-for-overlap and the stream pool of its loops
  // Symbolic sizes known at compile time (empty: bound at run time). Chunked loops (overlap,
  // microbatches) are checked against them, and default chunk counts chosen to divide them.
  SymbolBindings sizes;
  bool verify = true;              // run the verifier after every pass
  std::ostream* dump = nullptr;    // when set, print the IR after each pass here, each headed
                                   // by "# ----- IR after <pass>" (readable with --split-input-file)
  std::ostream* timing = nullptr;  // when set, print each pass's wall time here
};

}  // namespace meshfuse
