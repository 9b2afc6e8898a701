// layout-for-communication: every collective moves contiguous per-rank chunks.
//
// An allgather, reduce-scatter, gather or scatter exchanges one block per rank along its
// sharded dim. The blocks are contiguous in a row-major buffer only when that dim is outermost
// (or every dim before it has extent 1); otherwise the runtime would have to pack and unpack
// strided blocks around the collective. This pass makes the layout explicit instead: it moves
// the sharded dim outermost with a `permute` before the collective and back after it, so the
// host program's collectives always run on dim 0, directly on the tensors' buffers. Nothing is inserted when the dim is
// already outermost ("copy only when required"). All-to-all keeps its runtime packing (its send
// and receive blocks run along different dims, so no single permutation makes both contiguous).
//
// requires: decompose-reshardings (each resharding `set` changes one mesh axis).
// guarantees: every allgather / reduce-scatter / gather / scatter `set` is sharded on a dim
//   preceded only by static size-1 dims, except the keys and values of ring attention
//   (decompose-ring-attention marked them: they rotate as whole local blocks, never gathered).
//
//   before: %g = set(%x) : f32[2, 8, 32] @m {}                       %x is Shard(1)
//   after:  %0 = permute(%x, dims=[1, 0, 2]) : f32[8, 2, 32] @m {split(0, 2), parallelize(0, DIDx)}
//           %1 = set(%0) : f32[8, 2, 32] @m {}                        allgather on dim 0
//           %g = permute(%1, dims=[1, 0, 2]) : f32[2, 8, 32] @m {}
#pragma once

namespace meshfuse {
class Fusion;
void layoutForCommunication(Fusion& fusion);
}  // namespace meshfuse
