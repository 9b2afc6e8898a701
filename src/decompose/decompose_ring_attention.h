// decompose-ring-attention: keys and values that an sdpa needs whole along a mesh axis where its
// query, keys and values are all split along the sequence rotate around that axis's ring instead
// of being all-gathered (ring attention; docs/parallelisms.md "Context parallelism"). The pass
// records the decision in the IR; lower_ring_attention.h writes the loop.
//
// Why no placement of its own: a partial attention output pending an online-softmax merge (the
// analogue of Partial(), DESIGN.md's suggestion) would be a state across ranks only when each
// rank held all query rows and a block of keys; then every rank keeps the whole query and a
// whole-sequence partial output, O(seq) memory, which ring attention exists to avoid. Rotating
// k and v instead, the pending merge never crosses ranks: it is the loop-carried state of one
// rank (output and log-sum-exp), and what is sharded is k and v, as plain Shard(seq). So the ring
// is derived like ring-based overlap: propagation decides that the op needs k and v whole
// (context_parallel.h), decomposition makes that an allgather, and this pass turns the allgather
// and its consumer into rotation steps, as decompose-for-overlap does for allgather + GEMM.
//
// requires: decompose-reshardings (each set changes one mesh axis). Runs before
//   layout-for-communication, which leaves ring-marked sets alone (a ring sends whole local
//   blocks: no contiguity is needed).
// guarantees: when `option` lets keys rotate (auto, ring), every sdpa whose key and value are
//   sets all-gathering the sequence (dim 2) along one mesh axis a of n > 1 devices, read by
//   nothing else, and whose query and output are split along the sequence on a: those sets carry
//   overlap="ring" and chunks = the number of sequence chunks (n; 2n for a causal attention, or
//   attention gradient, whose query and key rows split in 2n: the chunks balance the work, each
//   rank then attending with chunks i and 2n - 1 - i, see lower_ring_attention.h), and an
//   sdpa_lse of the same query, key and attributes, sharded like the sdpa, follows it: the f32
//   log-sum-exp the steps merge their partial outputs by (segmentation puts both in one
//   attention kernel). Sets the input already marked so (a
//   decomposed fusion written back as text) get that sdpa_lse again where dead-code-elimination
//   removed it, whatever `option` says.
//
//   before: %3 = set(%k) : f32[2, 4, 64, 8] @m {}                 (Shard(2) -> Replicate)
//           %4 = set(%v) : f32[2, 4, 64, 8] @m {}
//           %a = sdpa(%q, %3, %4) : f32[2, 4, 64, 8] @m {split(2, 4), parallelize(2, DIDx)}
//   after:  %3 = set(%k, overlap="ring", chunks=4) : f32[2, 4, 64, 8] @m {}
//           %4 = set(%v, overlap="ring", chunks=4) : f32[2, 4, 64, 8] @m {}
//           %a = sdpa(%q, %3, %4) : f32[2, 4, 64, 8] @m {split(2, 4), parallelize(2, DIDx)}
//           %5 = sdpa_lse(%q, %3) : f32[2, 4, 64] @m {split(2, 4), parallelize(2, DIDx)}
#pragma once

#include "meshfuse/options.h"

namespace meshfuse {

class Fusion;
class Expr;

void decomposeRingAttention(Fusion& fusion, ContextParallel option);

// The attention op a ring-marked set's blocks feed, or nullptr when `set` is not one.
const Expr* ringAttentionOf(const Expr* set);

// Whether a and b are the key's and the value's gradient (sdpa_grad, either order) of one
// attention, with the same operands and attributes: one kernel computes both from one P, and
// their ring rotates the query side's blocks once (segmentation puts them in one segment).
bool keyValueGradientPair(const Expr* a, const Expr* b);

}  // namespace meshfuse
