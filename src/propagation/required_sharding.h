// What an op needs of each operand, on one mesh axis, to produce a given output state: the
// backward direction of its sharding rule. Shared by propagation (to cost candidates) and by
// decomposition (to insert the communication that makes an operand what the op needs).
#pragma once

#include <optional>
#include <string>

#include "meshfuse/ir/val.h"
#include "propagation/sharding.h"
#include "propagation/sharding_rule.h"

namespace meshfuse {

class Expr;

struct OutputChoice {
  AxisState state = Placement::replicate();
  int64_t out_logical = -1;      // Shard: the output logical index
  int64_t contraction_dim = -1;  // Partial from a sharded contracted dim: its logical index
  int64_t source_operand = -1;   // Partial passing through from this operand (AnyOne)
  Provenance why;
};

// nullopt when no operand state can give that output: a scalar added to a Partial, a Partial
// through an operand the op is not linear in (div's denominator, relu), or through a value that
// fills two operands (mul(%q, %q) is not linear in %q).
std::optional<AxisState> requiredOperandState(const Expr* e, const ShardingRule& rule, const OutputChoice& out,
                                              size_t operand);

}  // namespace meshfuse
