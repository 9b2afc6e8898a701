// Each op's sharding rule: how its operands' dims relate to its output's logical dims
// (DESIGN.md "Sharding propagation"; STYLE.md #10). Rules are declared per op category in
// sharding_rule.cpp; propagation and decomposition only consult this struct.
//
//   linear [t, k] x [n, k] -> [t, n, r{k}]:  x: t->0, k->2(r)   weight: n->1, k->2(r)
//   a sharded contracted dim (r) makes the output Partial; a dim mapped to -1 (normalized,
//   max/mean-reduced, sliced, attention's sequence) cannot stay sharded: it is gathered first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "meshfuse/ir/extent.h"

namespace meshfuse {

class Expr;

struct ShardingRule {
  // operand_maps[i][d]: output logical index that operand i's dim d (its dims()) becomes, or
  // -1. Empty for scalars and absent optional operands.
  std::vector<std::vector<int64_t>> operand_maps;
  // How a Partial operand passes through the op:
  //   None: never (the pending sum must be reduced first: the op is not linear);
  //   AnyOne: the op is linear in each operand marked in `linear_in`, so one Partial operand
  //           gives a Partial output when all other tensor operands are Replicate on that axis;
  //   All: Partial when every tensor operand is Partial (add, sub, cat) and no scalar is added.
  enum class PartialMode { None, AnyOne, All } partial_mode = PartialMode::None;
  std::vector<bool> linear_in;
  // A contracted (reduction) output dim may be sharded, producing Partial. False for a linear
  // with a bias (the bias would be added once per shard).
  bool contraction_ok = true;
  // The operand whose sharding wins a conflict (a parameter: never moved), or -1.
  int64_t weight_operand = -1;
  // The output's first reduction dim that operand dims map to (linear's k, sum's reduced dim)
  // when contraction_ok, else -1: what a Partial the user pins on the output means when no
  // operand is a pending sum (applyPlacements gives such a pin a dim of its own).
  int64_t contracted_dim = -1;

  // Whether some operand dim becomes output logical dim `out_logical`: only then can the op
  // give that dim sharded from sharded operands, computing locally (softmax's normalized dim,
  // a slice's cut dim cannot).
  bool fromOperands(int64_t out_logical) const;
};

ShardingRule shardingRuleOf(const Expr* e);

// Whether sharding operand `operand`'s dim `dim` over `devices` (the device counts of the mesh
// axes that split it, outermost first: torch.chunk blocks, nested) gives every rank the part of
// the output that the same sharding of the output dim it maps to gives it, so that the op
// computes locally. A dim mapped to a dim of the same extent (pointwise ops, a GEMM's rows, a
// reshape's untouched dims) always does; a contracted dim too (each rank sums its own block).
// A reshape that splits or merges the dim does when torch.chunk's blocks of both line up in
// elements: [8, 4] -> [32] over 2 ranks (16 + 16 elements either way), but not [7, 4] -> [28]
// (rows 4 + 3 are 16 + 12 elements, the output's blocks 14 + 14); sizes are evaluated under
// `sizes`, and an unbound symbolic size in a split or merge is not known to line up. Other dims
// of different extents (grouped attention heads) only where both divide evenly.
bool carriesShard(const Expr* e, const ShardingRule& rule, size_t operand, int64_t dim,
                  const std::vector<int64_t>& devices, const SymbolBindings& sizes);

// Whether operand `operand`'s dim `dim` (a dims() index) is a broadcast dim that `e` expands to a
// larger output dim (add([1, h], [t, h]), broadcast_in_dim): each shard of that output dim needs
// the operand's dim whole, so it neither gives nor carries a shard there.
bool expands(const Expr* e, const ShardingRule& rule, size_t operand, int64_t dim);

}  // namespace meshfuse
