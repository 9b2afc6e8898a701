// The order of single-axis steps that takes one sharding to another, and the steps of a move
// between meshes.
//
// Several mesh axes may shard one dim; they nest in mesh-axis order (axis 0 outermost, as
// applyPlacements splits). A single-axis step is only a plain collective or local slice when it
// touches the innermost split of the dims it changes: gathering an outer split while an inner
// one stays would interleave blocks, and slicing an outer split under an existing inner one
// would take a block the rank does not hold. So the planner first takes away, inner axes first,
// every split of a dim that changes (a pending sum that becomes Replicate is reduced then
// too), and then adds, outer axes first, what the target has on those dims (slices, and
// reduce-scatters of pending sums). A Shard(a) -> Shard(b) change stays one all-to-all when no
// other axis shards a or b, or, made while taking away, when it is the innermost split of a and
// of b and no outer split of b changes (context parallelism's 2-D hybrid:
// [Shard(2), Shard(2)] -> [Shard(2), Shard(1)] is one all-to-all over axis 1).
//
//   [Replicate, Shard(1)] -> [Shard(1), Replicate] on a 2x2 mesh:
//     allgather on axis 1 ([Replicate, Replicate]), then slice on axis 0.
//
// Between meshes (planResharding), each step is one `set` that lower-to-host-ir makes one
// communication (or a local slice or copy):
//   same shape (pipeline stages): the per-axis steps on the source mesh, then a send/recv from
//     each device to the device at its coordinates in the target mesh;
//   from one device r: broadcast from r over the target mesh, or a scatter when the target is
//     Shard(d) on its only axis of more than one device; an N-d target with Shard axes is
//     broadcast and then sliced locally (Replicate -> Shard needs no communication);
//   to one device r: the per-axis steps on the source mesh down to at most one non-Replicate
//     axis (its outermost), then a gather (Shard) or reduce (Partial) to r over that axis's
//     slice of the source mesh, or, for a replicated value, a send from the source mesh's first
//     device (a local copy when r is in it);
//   a root outside the team goes through a single-device mesh that the planner adds to the
//     fusion: {B[0]} before a broadcast/scatter over mesh B, {A[0]} after a gather/reduce over
//     mesh A, joined to r by a same-shape send/recv. So every rooted collective's root is in
//     its team.
//   Both meshes of more than one device and of different shapes: an UnsupportedError.
//
//   [0, 1] {Shard(0)} -> [3] {}:  gather to [0] (new mesh), then send/recv [0] -> [3].
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "propagation/sharding.h"

namespace meshfuse {

class Fusion;
class TensorView;

// The shardings after each step (the last is `to`, except for its mesh: this plans on one
// mesh). Empty when `from` and `to` agree on every axis. Given the mesh's axis sizes, another
// order of one-axis steps is taken where it needs fewer collectives, or as many and fewer bytes
// (wireBytes' measure), e.g. on a 2x2 mesh:
//   [Shard(1), Shard(0)] -> [Shard(0), Replicate]: allgather on axis 1, then one all-to-all on
//     axis 0 (the nesting order gathers both axes and slices: more bytes);
//   [Partial, Shard(0)] -> [Replicate, Replicate]: the allreduce on axis 0 first, of each rank's
//     half, then the allgather (the other order all-reduces whole values).
// Intermediate placements shard only the dims `from` or `to` shard.
// `by_bytes` (Fusion::reshardByBytes, which the plan search sets): the order of fewest bytes,
// then fewest collectives, instead, whose intermediate placements may also split any dim of the
// value's `extents` that has as many elements as the mesh's largest axis has devices. A plan may
// spend a collective on one conversion where it saves one elsewhere, e.g. on a 2x2 mesh
//   [Partial, Shard(0)] -> [Shard(0), Replicate] of a [2, 5] value: by collectives, an allgather
//     of the pending sums on axis 1, then a reduce-scatter on axis 0 (2 collectives); by bytes, a
//     reduce-scatter to [Shard(1), Shard(0)], an allgather on axis 1 and an all-to-all on axis 0
//     (3, which send a quarter less: the pending sums are reduced before they travel whole).
std::vector<Sharding> reshardingSteps(const Sharding& from, const Sharding& to, const std::vector<int64_t>& sizes = {},
                                      bool by_bytes = false, const std::vector<int64_t>& extents = {});

struct ReshardingStep {
  Sharding to;       // the sharding after the step (mesh included)
  std::string what;  // for provenance: "Shard(0) -> Replicate() on mesh axis 0", "gathered to stage [2]"
};

// Every step from `from` to `to` of `value`, on one mesh or between two (see above), by bytes
// where f.reshardByBytes(). May add single-device meshes to `f`. `name` names the value in the
// error for a move it cannot make. Neither side may ask for a pending sum the other does not
// have (callers check that first, with context).
std::vector<ReshardingStep> planResharding(Fusion& f, const TensorView* value, const Sharding& from, const Sharding& to,
                                           const std::string& name);

// What taking `tv`'s value from `from` to `to` on one mesh puts on the wire, summed over the
// ranks (reshardingSteps' steps, each as ring algorithms send on a mesh axis of n devices from
// what each rank holds, b: an allgather (n-1) b per rank, a reduce-scatter or an all-to-all
// (n-1)/n b, an allreduce 2 (n-1)/n b; a slice nothing), times the mesh's device count so that
// it is an integer. b is each rank's own block: summed over the ranks, torch.chunk's blocks
// (however uneven) make the whole value once per replica, so uneven blocks count exactly, as the
// placement fuzzer measures the executed collectives. nullopt when it cannot be told: a symbolic
// size, two meshes, or a pending sum `from` does not have. Its steps are planResharding's (by
// bytes where f.reshardByBytes()). The plan search ranks plans by it; decomposition converts
// from the copy of a value it makes cheapest.
std::optional<int64_t> wireBytes(const Fusion& f, const TensorView* tv, const Sharding& from, const Sharding& to);

}  // namespace meshfuse
