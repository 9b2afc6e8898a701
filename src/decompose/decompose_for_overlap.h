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
// Chunk counts and sizes: chunks are torch.chunk's blocks of each rank's rows (leading chunks
// ceil(rows / s), trailing ones less, possibly empty), so any count works, with even or uneven
// shards alike; a ring needs a multiple of the devices (one block per device, each cut into
// s / n). The default count (one per device) is capped, for a collective-based pair whose
// sizes are known (static extents, or symbolic ones known at compile time: MultiDeviceExecutor
// compiles chunked programs for the sizes of each run), at the rows of the largest shard (a
// pair with one row is not decomposed), and the collective's provenance says so. A pipeline's
// microbatches are torch.chunk's blocks of each rank's rows too.
//
// requires: layout-for-communication (collectives exchange dim-0 blocks), propagate-streams.
// guarantees: a marked set is a single-axis allgather / reduce-scatter / allreduce along dim 0
//   whose GEMM partner is its only reader (allgather) or only producer-and-use (the others);
//   ring-marked sets have chunks divisible by the team size.
//
//   before: %0 = set(%inp) : f32[?t, 64] @tp {}
//   after:  %0 = set(%inp, overlap="ring", chunks=4) : f32[?t, 64] @tp {}
#pragma once

#include "meshfuse/ir/extent.h"
#include "meshfuse/options.h"

namespace meshfuse {

class Fusion;

void decomposeForOverlap(Fusion& fusion, const OverlapOptions& options, const SymbolBindings& sizes = {});


}  // namespace meshfuse
