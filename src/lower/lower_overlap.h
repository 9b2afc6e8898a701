// Lowering of the (collective, GEMM) pairs decompose-for-overlap marked: Stream-parallel loops
// over chunks of the GEMM's rows (part of lower-to-host-ir).
//
// With n devices on the collective's mesh axis, s chunks, r this rank's index on that axis:
//   allgather + GEMM, collective-based: iteration i gathers chunk i of every rank's rows (an
//     s-th of its shard) and runs the GEMM on each rank's part of it, writing rows
//     [r'*s + i of n*s] of the output (so the output keeps Shard(0) order);
//   GEMM + reduce-scatter, collective-based: iteration i computes the same rows of the partial
//     result and reduce-scatters them into chunk i of this rank's output;
//   GEMM + allreduce, collective-based: iteration i computes rows [i of s] and all-reduces them;
//   ring-based (s = c*n): n - 1 circular-shift steps (send to r + 1, receive from r - 1) pass
//     the blocks around while the GEMM runs on the block that arrived in the previous step; the
//     reduce-scatter ring adds the partial it receives to its own and passes the sum on.
// Chunks are torch.chunk's, of each rank's rows (of its block of a gathered or reduced tensor):
// with uneven shards or chunks they differ in size, possibly empty, and each collective moves
// blocks of different sizes (v-collectives), each ring step a block of its own size.
// Collective-based iterations rotate through a pool of streams (each waits for the main stream
// at the loop's start, the main stream joins them at the end); ring-based loops put the
// send/recv steps on stream 1 beside the GEMMs on the main stream, ordered by events.
#pragma once

#include <cstdint>
#include <vector>

#include "lower/host_ir.h"

namespace meshfuse {

struct OverlapLoweringState {
  int64_t handles = 0;  // communication handles used so far
  int64_t events = 0;   // events used so far
};

// Appends the nodes of the marked `set` (comm_seg) and its GEMM partner (gemm_seg, index
// gemm_index into the program's segments) to `out`.
void lowerOverlappedPair(const Segment& comm_seg, const Segment& gemm_seg, int64_t gemm_index, int64_t stream_pool,
                         OverlapLoweringState& state, std::vector<HostNode>& out);

}  // namespace meshfuse
