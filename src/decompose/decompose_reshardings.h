// decompose-reshardings: every Expr becomes pure compute or pure communication.
//
// requires: propagate-shardings (every TensorView has a mesh).
// guarantees: every non-`set` Expr reads each operand in exactly the sharding its rule needs
//   for the output's sharding (so it computes locally, without communication); every `set`
//   changes the sharding on at most one mesh axis, so it is exactly one collective (or a local
//   slice/copy) of the table in DESIGN.md:
//     Shard(d) -> Replicate: allgather      Replicate -> Shard(d): local slice
//     Shard(a) -> Shard(b): all-to-all      Partial -> Replicate: allreduce
//     Partial -> Shard(d): reduce-scatter   Replicate -> Partial: local (first device keeps it)
//   and a set that only changes the mesh (a pipeline stage boundary) is a send/recv between the
//   devices at the same coordinates of the two meshes. Between meshes of different shapes a set
//   is one rooted collective with its root in its team (resharding_steps.h):
//     one device -> mesh B: broadcast (B Replicate) or scatter (Shard on B's one axis)
//     mesh A -> one device: gather (Shard on one axis of A) or reduce (Partial on one axis),
//                           or a send from A's first device (a local copy) of a replicated value
//   (an operand on another mesh than its op's output moves there the same way; a root outside
//   the team is reached by a send/recv through a single-device mesh added to the fusion). A
//   Replicate value needed Partial is a local partition (Replicate -> Partial: the axis's first
//   device keeps it, the others hold zeros); a split value needed Partial, or an op placed
//   Partial that no operand can give (a scalar added, a non-linear op: propagation computes such
//   a pinned op whole and partitions it after), is a user error saying why. (An output pinned
//   in a sharding its op cannot give, or gives at a higher cost, was already split by
//   propagate-shardings into the op and a set to the pin.)
//   A value needed in several shardings is converted once per sharding, each time from the copy
//   that sends least (wireBytes): the value, or a copy a set already made of it (for another
//   consumer, or the program's own set: a pin, an output made whole). An allreduce made for one
//   consumer is sliced for another that needs Shard(d), not reduce-scattered again; a consumer
//   of a pinned Shard(d) set reads the op's whole result rather than gathering the pin back.
//   And a value is converted first, before its first consumer, to the sharding a later consumer
//   needs when the others are cheaper from there: sending fewer bytes than converting in
//   consumer order, in no more collectives (an operand needed Shard(1), then whole: one allgather
//   and a local slice, not an all-to-all and then an allgather). When that later consumer is the
//   program's own set to that sharding, the conversion is the set's result (its name, its pin).
//
//   before: %out = linear(%inp, %up_w) : @m {Shard(1)}     with %inp Shard(0)
//   after:  %0 = set(%inp) : @m {}                          (allgather of %inp)
//           %out = linear(%0, %up_w) : @m {Shard(1)}
//
//   before: %a = set(%x) : @m {Shard(1)}    with %x Shard(0)
//           %b = set(%x) : @m {}
//   after:  %b = set(%x) : @m {}            (allgather of %x, moved before %a)
//           %a = set(%b) : @m {Shard(1)}    (local slice)
//
//   before: %y = set(%x) : @three {}       with %x Shard(0) on @two = [0, 1], and @three = [3]
//   after:  %0 = set(%x) : @m2 {}          (gather to rank 0: a new mesh @m2 = [0])
//           %y = set(%0) : @three {}       (send/recv 0 -> 3)
#pragma once

namespace meshfuse {
class Fusion;
void decomposeReshardings(Fusion& fusion);
}  // namespace meshfuse
