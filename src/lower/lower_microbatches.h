// Lowering of microbatched programs (pipeline parallelism; part of lower-to-host-ir).
//
// The segments whose outputs are split into microbatches (propagate-streams) run in one
// Stream-parallel loop, microbatch by microbatch: fusion inputs and outputs are whole tensors
// the loop reads and writes block by block (`s*` in the seed: split in the loop only), other
// microbatched tensors are one-microbatch buffers allocated in the loop body. Segments that do
// not touch microbatched rows run before the loop. Once specialized, a stage's rank runs only
// its stage's part of each iteration, and the stage-boundary send/recv nodes make the GPipe
// schedule: stage k works on microbatch i while stage k + 1 works on microbatch i - 1.
#pragma once

#include <vector>

#include "lower/host_ir.h"

namespace meshfuse {

// Whether any fusion input is split into microbatches.
bool isMicrobatched(const Fusion& fusion);
void lowerMicrobatched(const Fusion& fusion, const std::vector<Segment>& segments, std::vector<HostNode>& out);

}  // namespace meshfuse
