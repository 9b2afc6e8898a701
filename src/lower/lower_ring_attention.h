// Lowering of ring attention (part of lower-to-host-ir): an attention segment (an sdpa and its
// sdpa_lse) whose keys and values decompose-ring-attention marked to rotate becomes a
// Stream-parallel loop of n steps over the ring of its mesh axis (n devices, r this rank's index):
//
//   step j (0 <= j < n):  attention of this rank's query rows against the key/value block it holds
//                         (block r - j: its own at step 0), merged into the online softmax the
//                         output and the f32 log-sum-exp hold (exactly, by log-sum-exp);
//                         beside it, on stream 1 (j < n - 1): the block travels on by one
//                         send/recv per tensor (to r + 1, from r - 1), received into the buffer
//                         of the next block.
//
// So each of k and v takes exactly n - 1 send/recv steps, and the transfers run while the
// attention computes. After the step the arrived block is copied into the attended block's
// buffer (a local copy, so that the loop body is the same every step). Besides its own block a
// rank holds the attended one and the arriving one (kCur and kNext), or only kCur when its own
// is a dead intermediate whose buffer the ring reuses as kNext, or when n = 2 (no step attends
// one block while another arrives).
//
// Head groups. Attention is independent per (batch, head) pair, so the ring runs once per group
// of consecutive pairs (a loop over the groups, BlockRef::heads views of the kept operands and
// the outputs), and kCur and kNext hold one group's block: with g groups each rotating tensor
// takes g (n - 1) send/recvs of 1/g of a block, and what is in flight besides a rank's own block
// is 2/g of a block (1/g when the own buffer is reused or n = 2). g is
// OverlapOptions::ring_groups, or by default the most of 4 (2 when the own buffers are reused)
// that the rank's [batch, heads] split into, in groups of whole heads of one batch entry or of
// whole batch entries: at most half a block in flight, so that with the merge state (the f32
// log-sum-exp: per row one float against the 2e of k and v, e the head size) a rank holds less
// than its share of the attention plus one block in flight. Groups are contiguous in every
// operand: a group's send/recv needs no staging buffer. The causal balance's mirror exchanges stay
// whole, before and after the groups' loop.
//
// Causal attention with 2n chunks (decompose-ring-attention): the work is balanced. Rank r keeps
// the first chunk of the rows it keeps (chunk 2r) and trades its second with rank n - 1 - r (one
// mirror send/recv of half of each kept operand before the loop -- the query; for the query's
// gradient also the output's gradient, lse and delta; the key and value when the queries rotate --
// and of half of each output after it), so that it holds chunks 2r and 2n - 1 - 2r: one chunk i
// and its mirror 2n - 1 - i, every rank the same amount of causal work. The forward's own
// log-sum-exp, the merge state nothing else reads, stays in that layout. The attention steps
// take the global positions of their rows (the launch's `rows`/`keys`): the mask compares them
// and key blocks entirely after a query chunk are skipped.
//
// One ring (n = 4, one head group; with g > 1 groups the part from `record e0` to the last step
// is the body of `for i0 in [0, g)`, the event instances offset by 4 * i0 and %q, %a and %lse
// read as %q[i0 of g heads] ...):
//
//   allocate %a ; allocate %lse ; allocate %k~1 ; allocate %k~2 ; (same for v)
//   record e0[0] ; stream 1 ; wait_event e0[0]
//   comm h0 send_recv %k -> %k~1 shift 1 axis 0 ; ... ; wait h0 ; ... ; record e1[0] ; stream 0
//   gemm #3 (%q, %k, %v) -> (%a, %lse) {sdpa, sdpa_lse} rows (%q[r of 4]) keys (%k[r of 4])
//   record e2[0]
//   for i in [0, 2) {
//     stream 1 ; wait_event e2[i] ; comm h2 send_recv %k~1 -> %k~2 shift 1 axis 0 ; ... ; record e1[i + 1]
//     stream 0 ; wait_event e1[i]
//     gemm #3 (%q, %k~1, %v~1) -> (%a, %lse) {sdpa, sdpa_lse} accumulate rows (%q[r of 4]) keys (%k[(r - i - 1) % 4 of 4])
//     wait_event e1[i + 1] ; copy %k~2 -> %k~1 ; ... ; record e2[i + 1]
//   }
//   wait_event e1[2] ; gemm #3 (%q, %k~1, %v~1) -> ... accumulate ... keys (%k[(r - 3) % 4 of 4]) ; sync
#pragma once

#include <vector>

#include "lower/host_ir.h"
#include "lower/lower_overlap.h"

namespace meshfuse {

// Whether segment `seg` is the attention of a ring (its key is a ring-marked set).
bool isRingAttention(const Segment& seg);

// Appends the ring of attention segment `index` of `segments` to `out` (the segments of its
// keys' and values' sets are part of it: lower-to-host-ir skips them).
// `groups`: OverlapOptions::ring_groups.
void lowerRingAttention(const std::vector<Segment>& segments, int64_t index, int64_t groups,
                        OverlapLoweringState& state, std::vector<HostNode>& out);

}  // namespace meshfuse
