// The order of single-axis steps that takes one sharding to another.
//
// Several mesh axes may shard one dim; they nest in mesh-axis order (axis 0 outermost, as
// applyPlacements splits). A single-axis step is only a plain collective or local slice when it
// touches the innermost split of the dims it changes: gathering an outer split while an inner
// one stays would interleave blocks, and slicing an outer split under an existing inner one
// would take a block the rank does not hold. So the planner first takes away, inner axes first,
// every split of a dim that changes (a pending sum that becomes Replicate is reduced then
// too), and then adds, outer axes first, what the target has on those dims (slices, and
// reduce-scatters of pending sums). A Shard(a) -> Shard(b) change stays one all-to-all when no
// other axis shards a or b.
//
//   [Replicate, Shard(1)] -> [Shard(1), Replicate] on a 2x2 mesh:
//     allgather on axis 1 ([Replicate, Replicate]), then slice on axis 0.
#pragma once

#include <vector>

#include "propagation/sharding.h"

namespace meshfuse {

// The shardings after each step (the last is `to`, except for its mesh: the mesh change of a
// pipeline stage boundary is left to the caller). Empty when `from` and `to` agree on every axis.
std::vector<Sharding> reshardingSteps(const Sharding& from, const Sharding& to);

}  // namespace meshfuse
