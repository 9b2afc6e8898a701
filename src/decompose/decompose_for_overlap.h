// decompose-for-overlap: marks collectives next to GEMMs to be pipelined in chunks, so that
// communication overlaps compute (seed: "Overlap Communication with GEMM via Decomposition").
//
//   allgather + GEMM      %X = set(%x) (Shard(0) -> Replicate) read only by %Y = linear(%X, ..)
//   GEMM + reduce-scatter %P = linear(..) (Partial) read only by %y = set(%P) (-> Shard(0))
//   GEMM + allreduce      %P = linear(..) (Partial) read only by %y = set(%P) (-> Replicate)
//
// Each becomes, at lowering, a Stream-parallel loop over chunks of the rows:
//   collective-based: one smaller collective per chunk (any number of chunks);
//   ring-based:       circular-shift send/recv steps (chunks a multiple of the devices).
// The pass only records the decision on the `set` (attributes overlap= and chunks=), so the
// decomposed fusion stays printable and the lowering has no hidden inputs.
//
// Selection: the user's schedule (a Stream-parallel split of the GEMM's output rows, e.g.
// `y.split(0, 4); y.axis(0).parallelize(stream)`; algorithm from the options, else collective),
// or the options alone (every eligible pair).
//
// Chunk counts and sizes: every chunk holds the same number of rows. When `sizes` bind the rows
// (static extents, or symbolic ones known at compile time: MultiDeviceExecutor compiles
// chunked programs for the sizes of each run), a count the user chose (schedule or options)
// that does not split each rank's rows is a ValueError naming the op, the tensor, the rows and
// the counts that would; the default count (one per device) becomes the largest count below it
// that does (or the pair is not decomposed), and the collective's provenance says so. The
// microbatches of a pipeline are checked alike.
//
// requires: layout-for-communication (collectives exchange dim-0 blocks), propagate-streams.
// guarantees: a marked set is a single-axis allgather / reduce-scatter / allreduce along dim 0
//   whose GEMM partner is its only reader (allgather) or only producer-and-use (the others);
//   ring-marked sets have chunks divisible by the team size; with the rows bound by `sizes`,
//   every marked set's chunks (and every microbatch split) divide them.
//
//   before: %0 = set(%inp) : f32[?t, 64] @tp {}
//   after:  %0 = set(%inp, overlap="ring", chunks=4) : f32[?t, 64] @tp {}
#pragma once

#include "meshfuse/ir/extent.h"
#include "meshfuse/options.h"

namespace meshfuse {

class Fusion;

void decomposeForOverlap(Fusion& fusion, const OverlapOptions& options, const SymbolBindings& sizes = {});

// Whether compiling `fusion` (placed, or decomposed) with other sizes may give other chunk
// counts or errors: it has symbolic sizes and chunked loops (overlap asked for, or Stream
// splits). MultiDeviceExecutor compiles such programs for the sizes of each run.
bool chunkingDependsOnSizes(const Fusion& fusion, const OverlapOptions& options);

}  // namespace meshfuse
