// The backward direction of sharding rules.
#include "propagation/required_sharding.h"

#include <algorithm>

#include "meshfuse/ir/fusion.h"

namespace meshfuse {

std::optional<AxisState> requiredOperandState(const Expr* e, const ShardingRule& rule, const OutputChoice& out,
                                              size_t operand) {
  const Val* v = e->inputs()[operand];
  const std::vector<int64_t>& map = rule.operand_maps[operand];
  auto shardOf = [&](int64_t out_logical) -> AxisState {
    for (size_t d = 0; d < map.size(); ++d) {
      if (map[d] != out_logical) continue;
      if (expands(e, rule, operand, static_cast<int64_t>(d))) return Placement::replicate();
      return Placement::shard(static_cast<int64_t>(d));
    }
    return Placement::replicate();
  };
  switch (out.state.kind) {
    case Placement::Replicate: return Placement::replicate();
    case Placement::Shard: {
      int64_t ol = out.out_logical;
      if (ol < 0) {  // derive from the output's dims index
        const TensorView* o = e->output();
        const IterDomain* id = o->dims().at(out.state.dim);
        ol = std::find(o->logical().begin(), o->logical().end(), id) - o->logical().begin();
      }
      return shardOf(ol);
    }
    case Placement::Partial:
      if (out.contraction_dim >= 0) return shardOf(out.contraction_dim);
      if (rule.partial_mode == ShardingRule::PartialMode::All) {
        // add/sub/cat of pending sums: a scalar (or any non-Partial value) would be added once
        // per shard.
        if (v->valKind() == ValKind::Scalar) return std::nullopt;
        return Placement::partial();
      }
      if (rule.partial_mode == ShardingRule::PartialMode::AnyOne) {
        const int64_t src = out.source_operand;
        // The pending sum passes only through an operand the op is linear in (not div's
        // denominator), and only when that value fills no other operand: mul(%q, %q) is
        // quadratic in %q.
        if (src < 0 || static_cast<size_t>(src) >= rule.linear_in.size() || !rule.linear_in[src]) return std::nullopt;
        const Val* source = e->inputs()[src];
        for (size_t i = 0; i < e->inputs().size(); ++i)
          if (static_cast<int64_t>(i) != src && e->inputs()[i] == source) return std::nullopt;
        if (static_cast<int64_t>(operand) == src) return Placement::partial();
        return Placement::replicate();
      }
      return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace meshfuse
