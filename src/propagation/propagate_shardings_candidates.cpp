// The shardings an op's output may take on one mesh axis (propagate-shardings, contract in
// propagate_shardings.h): what its operands' shards and pending sums carry through its rule,
// what context parallelism decides for attention, and the upstream hints a later pending sum is
// scattered to. Which candidate wins is propagate_shardings_cost.cpp's.
#include <algorithm>
#include <optional>

#include "propagation/context_parallel.h"
#include "propagation/propagator.h"

namespace meshfuse::sharding_propagation {

std::vector<OutputChoice> Propagator::candidates(const Expr* e, const ShardingRule& rule, const DeviceMesh& mesh,
                                                 int64_t a) const {
  std::vector<OutputChoice> out;
  const int64_t n = mesh.size(a);
  // (A pending sum that passes through from one operand or from another is two candidates:
  // each needs the other operand whole, linear(x Partial, w Partial) reduces x or w.)
  auto add = [&](OutputChoice c) {
    for (const OutputChoice& x : out)
      if (x.state == c.state && x.contraction_dim == c.contraction_dim && x.source_operand == c.source_operand) return;
    out.push_back(std::move(c));
  };
  auto fromDim = [&](size_t i, int64_t d, const char* how) {
    if (std::optional<OutputChoice> c = carried(e, rule, i, d, n, how)) add(*c);
  };
  for (size_t i = 0; i < e->inputs().size(); ++i) {
    const TensorView* in = tensorAt(e, i);
    if (in == nullptr || !decided(in) || !aligned(in, mesh)) continue;
    const AxisState& st = states_.at(in).sharding.axes[a];
    if (st.kind == Placement::Shard)
      fromDim(i, st.dim, static_cast<int64_t>(i) == rule.weight_operand ? "weight" : "sharded");
    // A pending sum passes through an op linear in this operand (requiredOperandState says
    // what the other operands must be; a scalar added to it makes the candidate infeasible).
    bool passes = rule.partial_mode == ShardingRule::PartialMode::All ||
                  (rule.partial_mode == ShardingRule::PartialMode::AnyOne && rule.linear_in[i]);
    if (st.kind == Placement::Partial && passes) {
      OutputChoice c;
      c.state = Placement::partial();
      c.source_operand = static_cast<int64_t>(i);
      c.why = {fmt::format("Partial(): pending sum of {{}} passes through {}", e->name()), {in}};
      add(c);
    }
  }
  // Dims sharded upstream (hints) are candidates too: the place a pending sum is scattered to.
  for (size_t i = 0; i < e->inputs().size(); ++i) {
    const TensorView* in = tensorAt(e, i);
    if (in == nullptr || !decided(in) || !aligned(in, mesh)) continue;
    if (std::optional<int64_t> h = states_.at(in).hints[a]; h && *h < in->rank()) fromDim(i, *h, "sharded upstream");
  }
  // Attention whose keys and values arrive split along the sequence: context parallelism
  // decides (context_parallel.h) rather than the count of collectives, which would gather them
  // (n times the bytes of Ulysses, the whole sequence on every rank).
  if (std::optional<OutputChoice> cp = contextParallel(e, rule, mesh, a)) return {*cp};
  OutputChoice rep;
  rep.why = Provenance::literal(fmt::format("Replicate(): no cheaper sharding for {} on mesh axis {}", e->name(), a));
  add(rep);
  return out;
}

// Operand i's dim d, split on a mesh axis of n devices (or upstream), carried to e's output
// where the blocks line up (carriesShard: a reshape that merges [2, 16] into [32] cannot carry
// a 4-way split of the 32 back to the 2): a Shard of the dim it becomes, or a pending sum when
// that dim is contracted. `how` says why the operand dim is split, for the provenance.
std::optional<OutputChoice> Propagator::carried(const Expr* e, const ShardingRule& rule, size_t i, int64_t d, int64_t n,
                                                const char* how) const {
  const int64_t ol = rule.operand_maps[i][d];
  if (ol < 0 || expands(e, rule, i, d) || !carriesShard(e, rule, i, d, {n}, sizes_)) return std::nullopt;
  const TensorView* o = e->output();
  OutputChoice c;
  if (o->logical()[ol]->isReduction()) {
    if (!rule.contraction_ok) return std::nullopt;
    c.state = Placement::partial();
    c.contraction_dim = ol;
    c.why = {fmt::format("Partial(): contracted dim {} is sharded in {{}} ({})", d, how), {e->inputs()[i]}};
  } else {
    c.state = Placement::shard(dimIndexOfLogical(o, ol));
    c.out_logical = ol;
    c.why = {fmt::format("{}: dim {} of {{}} ({}) through {}", c.state.toString(), d, how, e->name()),
             {e->inputs()[i]}};
  }
  return c;
}

// For a search over the decisions (choices_): every other sharding the op can give its output
// on axis `a` from operands moved to fit, each operand dim carried through its rule (a Shard,
// or a pending sum over a contracted dim) whatever the operand's own state. Ranked after
// candidates(): the greedy decision is the same with or without them. Attention that context
// parallelism places gets them only under --cp=auto (a forced choice stands; the search keeps
// what it may take of them: search_placements.h).
std::vector<OutputChoice> Propagator::searchCandidates(const Expr* e, const ShardingRule& rule, const DeviceMesh& mesh,
                                                       int64_t a, const std::vector<OutputChoice>& taken) const {
  std::vector<OutputChoice> out;
  if (choices_ == nullptr) return out;
  if (options_.context_parallel != ContextParallel::Auto && contextParallel(e, rule, mesh, a)) return out;
  for (size_t i = 0; i < e->inputs().size(); ++i) {
    if (tensorAt(e, i) == nullptr) continue;
    for (int64_t d = 0; d < static_cast<int64_t>(rule.operand_maps[i].size()); ++d) {
      std::optional<OutputChoice> c = carried(e, rule, i, d, mesh.size(a), "split for it, by the plan search");
      auto same = [&](const OutputChoice& x) { return x.state == c->state && x.contraction_dim == c->contraction_dim; };
      if (c && std::none_of(taken.begin(), taken.end(), same) && std::none_of(out.begin(), out.end(), same))
        out.push_back(std::move(*c));
    }
  }
  return out;
}

// The candidates whose Shard, nested with what the other mesh axes of `state` already give
// `tv` along the same dim (mesh-axis order, as applyPlacements splits), still cuts every
// operand dim it comes from into the blocks the op maps to the output's (carriesShard: a
// reshape that splits or merges the dim must keep torch.chunk's blocks lined up). Any size
// may be sharded, unevenly too; a pending sum over a contracted dim in any blocks (each rank
// sums its own). (Found by the placement fuzzer with even sizes only: a 2-row tensor pinned
// [Shard(0), Replicate()] whose operand was [Replicate(), Shard(0)] got [Shard(0), Shard(0)],
// which was refused then; nested uneven blocks of 1 and 0 rows are valid now.)
std::vector<OutputChoice> Propagator::alignedWithOtherAxes(const TensorView* tv, const TvState& state,
                                                           const DeviceMesh& mesh, int64_t a,
                                                           std::vector<OutputChoice> cands) const {
  const Expr* e = tv->definition();
  if (e == nullptr) return cands;
  const ShardingRule rule = shardingRuleOf(e);
  std::erase_if(cands, [&](const OutputChoice& c) {
    if (c.state.kind != Placement::Shard) return false;
    std::vector<int64_t> devices;
    for (int64_t b = 0; b < mesh.rank(); ++b) {
      const AxisState& split = b == a ? c.state : state.sharding.axes[b];
      if (split.kind == Placement::Shard && split.dim == c.state.dim) devices.push_back(mesh.size(b));
    }
    for (size_t i = 0; i < e->inputs().size(); ++i) {
      const std::vector<int64_t>& map = rule.operand_maps[i];
      for (size_t d = 0; d < map.size(); ++d)
        if (map[d] >= 0 && !tv->logical()[map[d]]->isReduction() && dimIndexOfLogical(tv, map[d]) == c.state.dim &&
            !expands(e, rule, i, static_cast<int64_t>(d)) &&  // (a broadcast operand is whole there)
            !carriesShard(e, rule, i, static_cast<int64_t>(d), devices, sizes_))
          return true;
    }
    return false;
  });
  return cands;
}

// The candidate context parallelism gives attention `e` on axis `a` (context_parallel.h): the
// output split by heads (Ulysses: q, k and v move there by all-to-all), or along the query's
// sequence with k and v whole (ring attention rotates them, or they are gathered); nullopt when
// the keys' sequence is not split on `a`, or they are gathered for a query that is not split or
// whose rows the op's output does not keep (sdpa_grad: its rule then decides).
std::optional<OutputChoice> Propagator::contextParallel(const Expr* e, const ShardingRule& rule, const DeviceMesh& mesh,
                                                        int64_t a) const {
  OperandStates operands;
  for (size_t i = 0; i < e->inputs().size(); ++i) {
    const TensorView* in = tensorAt(e, i);
    const bool known = in != nullptr && decided(in) && aligned(in, mesh);
    operands.push_back(known ? std::optional(states_.at(in).sharding.axes) : std::nullopt);
  }
  std::optional<CpChoice> cp = chooseContextParallel(f_, e, operands, mesh, a, options_.context_parallel);
  if (!cp) return std::nullopt;
  constexpr int64_t kHeads = 1, kSeq = 2;
  const bool query_split = operands[0] && (*operands[0])[a] == Placement::shard(kSeq);
  const bool query_rows = rule.operand_maps[0].size() > kSeq && rule.operand_maps[0][kSeq] == kSeq;
  if (cp->strategy != CpStrategy::Ulysses && !(query_split && query_rows)) return std::nullopt;
  OutputChoice c;
  c.out_logical = cp->strategy == CpStrategy::Ulysses ? kHeads : kSeq;
  c.state = Placement::shard(dimIndexOfLogical(e->output(), c.out_logical));
  c.why = Provenance::literal(fmt::format("{}: {}", c.state.toString(), cp->why));
  return c;
}

std::optional<int64_t> Propagator::hintFor(const Expr* e, const ShardingRule& rule, const DeviceMesh& mesh, int64_t a,
                                           const AxisState& chosen) const {
  // A dim other than the chosen one that is sharded on this axis upstream: where a later
  // pending sum can be scattered to.
  const TensorView* o = e->output();
  for (size_t i = 0; i < e->inputs().size(); ++i) {
    const TensorView* in = tensorAt(e, i);
    if (in == nullptr || !decided(in) || !aligned(in, mesh)) continue;
    const TvState& s = states_.at(in);
    std::vector<int64_t> upstream;
    if (s.sharding.axes[a].kind == Placement::Shard) upstream.push_back(s.sharding.axes[a].dim);
    if (s.hints[a]) upstream.push_back(*s.hints[a]);
    for (int64_t d : upstream) {
      if (d >= static_cast<int64_t>(rule.operand_maps[i].size())) continue;
      int64_t ol = rule.operand_maps[i][d];
      if (ol < 0 || o->logical()[ol]->isReduction() || expands(e, rule, i, d) ||
          !carriesShard(e, rule, i, d, {mesh.size(a)}, sizes_))
        continue;
      int64_t dim = dimIndexOfLogical(o, ol);
      if (chosen.kind != Placement::Shard || chosen.dim != dim) return dim;
    }
  }
  return std::nullopt;
}

}  // namespace meshfuse::sharding_propagation
