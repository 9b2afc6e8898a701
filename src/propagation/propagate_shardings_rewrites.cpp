// Ops propagate-shardings rewrites (contract in propagate_shardings.h) because they cannot keep
// their operands' sharding as one op: a linear whose bias would be added to a pending sum, a mean
// over a sharded dim. The new ops are decided in their turn by the sweeps.
#include <algorithm>
#include <string>

#include "meshfuse/ops.h"
#include "propagation/propagator.h"

namespace meshfuse::sharding_propagation {

// Rewrites an op that cannot keep its operands' sharding as one op into ops that can. Returns
// whether it did (the new ops are decided in their turn).
bool Propagator::rewrite(Expr* e) {
  if (e->kind() == OpKind::Linear && e->input("bias") != nullptr && wouldBePartial(e)) {
    splitBias(e);
    return true;
  }
  if (e->kind() == OpKind::Mean && meanOverShardedDim(e)) {
    splitMean(e);
    return true;
  }
  return false;
}

// Whether x or weight is a pending sum or sharded along the contracted dim on some axis.
bool Propagator::wouldBePartial(const Expr* e) const {
  ShardingRule rule = shardingRuleOf(e);
  const TensorView* out = e->output();
  const DeviceMesh& mesh = f_.mesh(meshFor(e, rule));
  for (int64_t a = 0; a < mesh.rank(); ++a)
    for (size_t i = 0; i < 2; ++i) {
      const TensorView* in = tensorAt(e, i);
      if (!decided(in) || !aligned(in, mesh)) continue;
      const AxisState& st = states_.at(in).sharding.axes[a];
      if (st.kind == Placement::Partial) return true;
      if (st.kind != Placement::Shard) continue;
      int64_t ol = rule.operand_maps[i][st.dim];
      if (ol >= 0 && out->logical()[ol]->isReduction()) return true;
    }
  return false;
}

// linear(x, w, bias) -> add(linear(x, w), broadcast(bias)): the bias is added once, after
// the pending sum is reduced.
void Propagator::splitBias(Expr* e) {
  TensorView* old = e->output();
  auto* x = static_cast<TensorView*>(e->input("x"));
  auto* w = static_cast<TensorView*>(e->input("weight"));
  auto* bias = static_cast<TensorView*>(e->input("bias"));
  f_.setInsertionPoint(e);
  TensorView* y = ops::linear(x, w);
  std::vector<int64_t> shape(old->rank(), 1), bdims = {old->rank() - 1};
  shape.back() = -1;
  TensorView* b = ops::broadcastInDim(bias, shape, bdims);
  TensorView* sum = ops::add(y, b);
  f_.setInsertionPoint(nullptr);
  replaceResult(e, sum);
}

// Whether mean `e` reduces a dim that its operand has sharded on a mesh axis of its output's
// mesh, over dims of static sizes.
bool Propagator::meanOverShardedDim(const Expr* e) const {
  const TensorView* x = tensorAt(e, 0);
  if (!decided(x) || !aligned(x, f_.mesh(meshFor(e, shardingRuleOf(e))))) return false;
  std::vector<int64_t> dims = e->attr<std::vector<int64_t>>("dims");
  for (int64_t& d : dims) {
    d = d < 0 ? d + x->rank() : d;
    if (!x->dims()[d]->extent().isStatic()) return false;
  }
  for (const AxisState& st : states_.at(x).sharding.axes)
    if (st.kind == Placement::Shard && std::find(dims.begin(), dims.end(), st.dim) != dims.end()) return true;
  return false;
}

// mean(x, dims) -> div(sum(x, dims), count): a mean over a sharded dim is then a pending sum
// on each device, divided there by the global count (a mean kernel divides by the count of
// what it holds, so a local mean is not a share of the global one). The count must be static:
// a scalar is a literal.
void Propagator::splitMean(Expr* e) {
  auto* x = static_cast<TensorView*>(e->input(size_t{0}));
  const std::vector<int64_t>& dims = e->attr<std::vector<int64_t>>("dims");
  int64_t count = 1;
  for (int64_t d : dims) count *= x->dims()[d < 0 ? d + x->rank() : d]->extent().value();
  f_.setInsertionPoint(e);
  TensorView* mean = ops::div(ops::sum(x, dims), static_cast<double>(count));
  f_.setInsertionPoint(nullptr);
  replaceResult(e, mean);
}

// Makes `replacement`, computed just before e, stand for e's output: its uses, its name and
// the user's pin (as placements: the two may differ in reduction dims), and removes e.
void Propagator::replaceResult(Expr* e, TensorView* replacement) {
  TensorView* old = e->output();
  f_.replaceAllUses(old, replacement);
  f_.removeExpr(e);
  if (std::string name = old->name(); !name.empty()) {
    f_.rename(old, "");
    f_.rename(replacement, name);
  }
  if (old->pinned()) {
    writeSharding(replacement, states_.at(old).sharding);
    pin(replacement);
  }
}

}  // namespace meshfuse::sharding_propagation
