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
      const auto* tv = static_cast<const TensorView*>(v);
      if (tv->dims()[d]->isBroadcast()) return Placement::replicate();
      return Placement::shard(static_cast<int64_t>(d));
    }
    return Placement::replicate();
  };
  switch (out.state.kind) {
    case Placement::Replicate:
      return Placement::replicate();
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
        if (v->valKind() == ValKind::Scalar) return std::nullopt;  // would be added once per shard
        return Placement::partial();
      }
      if (rule.partial_mode == ShardingRule::PartialMode::AnyOne) {
        if (static_cast<int64_t>(operand) == out.source_operand) return Placement::partial();
        return Placement::replicate();
      }
      return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace meshfuse
