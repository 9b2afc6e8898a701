// Context parallelism of attention (docs/parallelisms.md "Context parallelism"). When an attention
// op's keys and values arrive split along their sequence on a mesh axis, something has to move:
// every query row attends every key. This file chooses what, per mesh axis; propagate-shardings
// asks it which output sharding to offer the op, decompose-ring-attention whether the gathered
// keys and values rotate instead.
//
//   Ulysses  q, k and v all-to-all from the sequence split to a split of the heads; attention on
//            whole sequences for heads/n heads (4 all-to-alls when the output goes back). Each
//            sends (n-1)/n of a rank's block: the fewest bytes. Needs the heads to divide.
//   ring     the query keeps its rows; k and v rotate around the axis by send/recv in n - 1 steps,
//            each rank attending the block it holds while the next one travels, the partial
//            outputs merged by log-sum-exp. As many bytes as gathering ((n-1)/n of k and v), but
//            at most a block in flight instead of the whole sequence (O(seq/n) memory; half a
//            block by default, the ring running once per head group: lower_ring_attention.h),
//            and the transfers overlap the attention. Needs q, k and v split along the sequence
//            alike.
//   gather   k and v all-gathered; the query keeps its rows (the output stays sequence-split).
//
// `auto` takes, per axis, Ulysses where the heads divide, else ring where it applies, else gather.
// Ulysses goes to inner axes first: with the sequence split on both axes of a 2-D mesh, an
// all-to-all over the inner axis stays within the outer axis's block of the sequence, so heads
// that divide only one axis give Ulysses on the inner and ring on the outer (the 2-D hybrid).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "meshfuse/options.h"
#include "propagation/sharding.h"

namespace meshfuse {

class Expr;
class Fusion;
class DeviceMesh;

enum class CpStrategy { Ulysses, Ring, Gather };

struct CpChoice {
  CpStrategy strategy;
  std::string why;  // for the output's provenance
};

// Each operand's state on every mesh axis of the op's mesh (nullopt: undecided, or a scalar, or
// on a mesh of another shape), aligned with the op's inputs.
using OperandStates = std::vector<std::optional<std::vector<AxisState>>>;

// The strategy of mesh axis `a` for attention op `e` on `mesh`, or nullopt when its keys' and
// values' sequence does not arrive sharded there. A forced `option` that cannot apply is an
// UnsupportedError naming the op, the operand, its shape and the mesh.
std::optional<CpChoice> chooseContextParallel(const Fusion& f, const Expr* e, const OperandStates& operands,
                                              const DeviceMesh& mesh, int64_t a, ContextParallel option);

// Whether, under `option`, k and v that an sdpa needs whole along a mesh axis where its query,
// keys and values are sequence-split rotate around the ring rather than being all-gathered.
inline bool keysRotate(ContextParallel option) {
  return option == ContextParallel::Auto || option == ContextParallel::Ring;
}

}  // namespace meshfuse
