// search-placements (contract in search_placements.h): the greedy plan, then a local search
// over propagate-shardings' decisions, each plan measured after decompose-reshardings.
#include "decompose/search_placements.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "decompose/decompose_reshardings.h"
#include "decompose/decompose_ring_attention.h"
#include "decompose/resharding_steps.h"
#include "meshfuse/error.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ops.h"
#include "meshfuse/options.h"
#include "propagation/propagate_shardings.h"
#include "propagation/sharding.h"
#include "propagation/sharding_rule.h"

namespace meshfuse {

namespace {

// What a plan costs, in the order plans are ranked.
struct PlanCost {
  int64_t parameter_moves = 0;  // collectives whose input is a parameter
  int64_t wire = 0;             // bytes on the wire over all ranks (times the device count: wireBytes)
  int64_t collectives = 0;
  // Not ranked but bounded: the elements each rank's ops read and write, summed over the ops
  // (a plan may not exceed the greedy plan's: compute is not replicated to save bytes).
  int64_t work = 0;
  auto key() const { return std::tie(parameter_moves, wire, collectives); }
  bool operator<(const PlanCost& o) const { return key() < o.key(); }
};

// The fusion input `tv` is, or is a copy of (through sets); null when it is computed.
const TensorView* copiedInput(const Fusion& f, const TensorView* tv) {
  while (!f.isInput(tv)) {
    const Expr* def = tv->definition();
    if (def == nullptr || def->kind() != OpKind::Set) return nullptr;
    tv = static_cast<const TensorView*>(def->input(size_t{0}));
  }
  return tv;
}

// The position of fusion input `tv` among `f`'s inputs (clones keep the order).
size_t inputPosition(const Fusion& f, const TensorView* tv) {
  const std::vector<TensorView*>& inputs = f.inputs();
  return static_cast<size_t>(std::find(inputs.begin(), inputs.end(), tv) - inputs.begin());
}

// The parameters of the placed definition, as positions among its inputs: those an op reads
// (directly, or through the user's sets) as its weight (a GEMM's, an embedding's table). A plan
// that moves one ranks below any that does not. (Found on the placed definition, as propagation
// sees them: on a decomposed plan a matmul's weight is read through a set, and the rule no
// longer calls it one; the placement fuzzer's s11-w2-c134.)
std::set<size_t> parameters(const Fusion& placed) {
  std::set<size_t> out;
  for (const Expr* e : placed.exprs()) {
    const int64_t w = shardingRuleOf(e).weight_operand;
    if (w < 0 || static_cast<size_t>(w) >= e->inputs().size()) continue;
    const Val* v = e->inputs()[w];
    if (v == nullptr || v->valKind() != ValKind::TensorView) continue;
    if (const TensorView* p = copiedInput(placed, static_cast<const TensorView*>(v)))
      out.insert(inputPosition(placed, p));
  }
  return out;
}

// The elements of `tv` one rank holds (the largest of torch.chunk's blocks: a pending sum holds
// the whole value).
int64_t localElements(const Fusion& f, const TensorView* tv) {
  const Sharding s = readSharding(tv);
  const DeviceMesh& mesh = f.mesh(s.mesh);
  int64_t n = 1;
  const std::vector<IterDomain*> dims = tv->dims();
  for (size_t d = 0; d < dims.size(); ++d) {
    int64_t extent = dims[d]->extent().value(), parts = 1;
    for (size_t a = 0; a < s.axes.size(); ++a)
      if (s.axes[a] == Placement::shard(static_cast<int64_t>(d))) parts *= mesh.size(static_cast<int64_t>(a));
    n *= (extent + parts - 1) / parts;
  }
  return n;
}

// The collectives a set of decomposed `f` makes: one, or, where ring attention rotates its
// blocks instead of gathering them, a send/recv per step (n - 1 on the axis of n devices it
// changes), as the executed program counts them.
int64_t ringSteps(const Fusion& f, const Expr* set) {
  if (ringAttentionOf(set) == nullptr) return 1;
  const Sharding from = readSharding(static_cast<const TensorView*>(set->input(size_t{0})));
  const Sharding to = readSharding(set->output());
  for (size_t a = 0; a < to.axes.size(); ++a)
    if (from.axes[a] != to.axes[a]) return f.mesh(to.mesh).size(static_cast<int64_t>(a)) - 1;
  return 1;
}

// What the collectives of decomposed `f` (one mesh) send: each set changes one mesh axis
// (decompose-reshardings' guarantee), a collective or a local slice (which sends nothing).
// `params`: parameters() of the definition `f` was placed from.
PlanCost measure(const Fusion& f, const std::set<size_t>& params) {
  PlanCost cost;
  cost.work = workPerRank(f);
  for (const Expr* e : f.exprs()) {
    if (e->kind() != OpKind::Set) continue;
    const auto* in = static_cast<const TensorView*>(e->input(size_t{0}));
    const std::optional<int64_t> wire = wireBytes(f, in, readSharding(in), readSharding(e->output()));
    MF_CHECK(wire.has_value(), "the plan search measures programs of static sizes on one mesh only");
    if (*wire == 0) continue;
    cost.wire += *wire;
    cost.collectives += ringSteps(f, e);
    if (const TensorView* source = copiedInput(f, in)) cost.parameter_moves += params.count(inputPosition(f, source));
  }
  return cost;
}

// Whether routing by bytes can differ from routing by collectives on `f`'s mesh: it has two
// axes of more than one device (one axis has one route).
bool routesDiffer(const Fusion& f) {
  const std::vector<int64_t>& shape = f.mesh(0).shape();
  return std::count_if(shape.begin(), shape.end(), [](int64_t n) { return n > 1; }) >= 2;
}

bool applies(const Fusion& f, const PipelineOptions& options) {
  if (!options.propagation.search || options.propagation.gather_parameters) return false;
  if (f.numMeshes() != 1 || f.mesh(0).size() < 2) return false;
  if (static_cast<int64_t>(f.exprs().size()) > search_placements::kMaxExprs) return false;
  for (const TensorView* tv : f.tensorViews())
    for (const IterDomain* id : tv->logical())
      if (!id->extent().isStatic()) return false;
  return true;
}

// The outputs' shardings after propagation (what the search may not change).
std::vector<Sharding> outputShardings(const Fusion& f) {
  std::vector<Sharding> out;
  for (const TensorView* o : f.outputs()) out.push_back(readSharding(o));
  return out;
}

// Every output of `f` that a plan computes otherwise than `kept` (the greedy plan's outputs) is
// moved there by a set after it, which takes its name: what the user sees stays as it was.
void keepOutputs(Fusion& f, const std::vector<Sharding>& kept) {
  const std::vector<TensorView*> outs = f.outputs();
  for (size_t i = 0; i < outs.size(); ++i) {
    TensorView* o = outs[i];
    const Sharding now = readSharding(o);
    if (now == kept[i]) continue;
    TensorView* m = ops::set(o);
    writeSharding(m, kept[i]);
    m->setPinned(false);
    m->setProvenance(Provenance::literal(
        fmt::format("output kept {} as op-by-op propagation places it: the plan search computes it as {}, "
                    "which sends fewer bytes in all",
                    toString(kept[i]), toString(now))));
    f.replaceOutput(o, m);
    if (std::string name = o->name(); !name.empty()) {
      f.rename(o, "");
      f.rename(m, name);
    }
  }
}

// The keys and values (operands 1 and 2) of every attention op of `f`, in program order.
std::vector<const TensorView*> keysAndValues(const Fusion& f) {
  std::vector<const TensorView*> out;
  for (const Expr* e : f.exprs()) {
    if (e->info().category != OpCategory::Attention) continue;
    for (size_t i : {size_t{1}, size_t{2}}) {
      const Val* v = i < e->inputs().size() ? e->inputs()[i] : nullptr;
      if (v != nullptr && v->valKind() == ValKind::TensorView) out.push_back(static_cast<const TensorView*>(v));
    }
  }
  return out;
}

// The mesh axes on which propagated `f` has attention whose keys or values (operands 1 and 2 of
// sdpa and sdpa_grad, 1 of sdpa_lse) arrive split along the sequence (dim 2 of [batch, heads,
// seq, head_dim]): there context parallelism placed it (Ulysses, ring or a gather, as --cp and
// the heads decide; propagation asks the same). Empty when there is none.
std::vector<int64_t> contextParallelAxes(const Fusion& f) {
  constexpr int64_t kSeq = 2;
  std::set<int64_t> axes;
  for (const TensorView* kv : keysAndValues(f)) {
    if (kv->rank() <= kSeq) continue;
    const Sharding s = readSharding(kv);
    for (size_t a = 0; a < s.axes.size(); ++a)
      if (s.axes[a] == Placement::shard(kSeq)) axes.insert(static_cast<int64_t>(a));
  }
  return {axes.begin(), axes.end()};
}

// Whether every attention op of decomposed `f` reads each operand split evenly on each of `axes`
// (no operand whole there, and no rank with less of it than another): each rank holds as little
// as ring attention leaves it, and attends as much (an uneven split of the batch would leave
// ranks idle while others attend whole sequences).
bool attentionSplitOn(const Fusion& f, const std::vector<int64_t>& axes) {
  for (const Expr* e : f.exprs()) {
    if (e->info().category != OpCategory::Attention) continue;
    for (const Val* v : e->inputs()) {
      if (v == nullptr || v->valKind() != ValKind::TensorView) continue;
      const auto* tv = static_cast<const TensorView*>(v);
      const Sharding s = readSharding(tv);
      const DeviceMesh& mesh = f.mesh(s.mesh);
      for (int64_t a : axes) {
        const Placement& p = s.axes[static_cast<size_t>(a)];
        if (p.kind != Placement::Shard) return false;
        int64_t parts = 1;
        for (size_t b = 0; b < s.axes.size(); ++b)
          if (s.axes[b] == p) parts *= mesh.size(static_cast<int64_t>(b));
        if (tv->dims()[static_cast<size_t>(p.dim)]->extent().value() % parts != 0) return false;
      }
    }
  }
  return true;
}

// Whether every attention op of decomposed `f` reads its keys and values whole (not split, not
// pending) on each of `axes`, gathered, not rotated by ring attention.
bool keysGathered(const Fusion& f, const std::vector<int64_t>& axes) {
  for (const TensorView* kv : keysAndValues(f)) {
    if (kv->definition() != nullptr && kv->definition()->kind() == OpKind::Set &&
        ringAttentionOf(kv->definition()) != nullptr)
      return false;
    const Sharding s = readSharding(kv);
    for (int64_t a : axes)
      if (s.axes[static_cast<size_t>(a)].kind != Placement::Replicate) return false;
  }
  return true;
}

// The shardings every attention op of decomposed `f` reads its operands in and gives its result,
// in program order: what a plan keeps from the greedy one where context parallelism placed
// attention. Where its operands come from, and how the rest of the program is placed, is
// searched as any other (a softmax before a Ulysses sdpa may run on the heads' split its operand
// is moved to anyway: the placement fuzzer's s11-w4-c170). Attention that context parallelism
// did not place (no sequence split) is searched like any op: on the heads' split, say, where
// its operands arrive split along head_dim (s11-w3-c276).
std::vector<Sharding> attentionShardings(const Fusion& f) {
  std::vector<Sharding> out;
  for (const Expr* e : f.exprs()) {
    if (e->info().category != OpCategory::Attention) continue;
    for (const Val* v : e->inputs())
      if (v != nullptr && v->valKind() == ValKind::TensorView)
        out.push_back(readSharding(static_cast<const TensorView*>(v)));
    out.push_back(readSharding(e->output()));
  }
  return out;
}

// What every plan the search tries keeps from the greedy plan.
struct Kept {
  std::set<size_t> parameters;    // parameters() of the placed definition
  bool made = false;              // set by the greedy plan
  std::vector<Sharding> outputs;  // outputShardings of the greedy plan
  // attentionShardings of the greedy plan, where context parallelism placed its attention on
  // `context_parallel` (the mesh axes)
  std::optional<std::vector<Sharding>> attention;
  std::vector<int64_t> context_parallel;
  // Whether the greedy plan's attention reads its keys and values whole on those axes (context
  // parallelism gathered them: neither ring attention nor Ulysses applied).
  bool gathered = false;
};

struct Trial {
  PlanCost cost;
  PlanChoices choices;
  bool by_bytes = false;  // Fusion::reshardByBytes: conversions routed by fewest bytes
  std::string steps;      // each set's shardings, in program order (routeSteps)
};

// The shardings each set of decomposed `f` goes from and to, in program order: where two plans'
// differ, their conversions took other routes.
std::string routeSteps(const Fusion& f) {
  std::string out;
  for (const Expr* e : f.exprs())
    if (e->kind() == OpKind::Set)
      out += fmt::format("{}->{};", toString(readSharding(static_cast<const TensorView*>(e->input(size_t{0})))),
                         toString(readSharding(e->output())));
  return out;
}

// The plans a search has measured, by what makes them (tryPlan is a function of its `take`,
// `fewest_moves_on_ties` and `by_bytes`): the climbs meet plans they or another climb tried
// before (the neighbours of the plan a climb stopped at, a second climb through the first one's
// plans): each is measured once. A climb counts every plan it tries against its budget, as
// if it measured it (where a climb ends, and so where the next starts, does not depend on what
// another climb tried before: s2-w4-u40-c332 is found only so); a resumed climb counts only the
// plans new to the search, so that it goes on from where its budget stopped it.
class TriedPlans {
 public:
  using Key = std::tuple<std::vector<int64_t>, bool, bool>;
  static Key key(std::vector<int64_t> take, bool fewest_moves_on_ties, bool by_bytes) {
    while (!take.empty() && take.back() == 0) take.pop_back();  // (decisions past the end take 0)
    return {std::move(take), fewest_moves_on_ties, by_bytes};
  }
  bool contains(const Key& k) const { return plans_.contains(k); }
  // The plan `k` names: measured by `measure()` the first time it is asked for, then remembered.
  template <typename Measure>
  const std::optional<Trial>& get(Key k, Measure&& measure) {
    auto it = plans_.find(k);
    if (it == plans_.end()) it = plans_.emplace(std::move(k), measure()).first;
    return it->second;
  }

 private:
  std::map<Key, std::optional<Trial>> plans_;
};

// Propagates a copy of `placed` taking `take`, keeps the outputs as `kept` (the greedy plan's:
// the first plan tried, which sets them), decomposes it (routing conversions by bytes where
// `by_bytes`) and measures it. nullopt when attention that context parallelism placed in the
// greedy plan reads or gives another sharding (but, under --cp=auto, for one that reads no
// operand whole where it was split: below), or when propagation or decomposition refuses the
// plan (a candidate a later pass cannot make; operands a forced --cp cannot use).
std::optional<Trial> tryPlan(const Fusion& placed, const PipelineOptions& options, std::vector<int64_t> take,
                             bool fewest_moves_on_ties, bool by_bytes, Kept& kept) {
  std::unique_ptr<Fusion> f = placed.clone();
  f->setReshardByBytes(by_bytes);
  Trial t;
  t.choices.take = std::move(take);
  t.choices.fewest_moves_on_ties = fewest_moves_on_ties;
  t.by_bytes = by_bytes;
  const bool greedy = !kept.made;
  try {
    propagateShardings(*f, options.propagation, options.sizes, &t.choices);
    if (greedy) {
      kept.made = true;
      kept.outputs = outputShardings(*f);
      kept.context_parallel = contextParallelAxes(*f);
    }
    keepOutputs(*f, kept.outputs);
    decomposeReshardings(*f);
    decomposeRingAttention(*f, options.propagation.context_parallel);
  } catch (const UserError&) {
    return std::nullopt;
  }
  if (greedy && !kept.context_parallel.empty()) {
    kept.attention = attentionShardings(*f);
    kept.gathered = keysGathered(*f, kept.context_parallel);
  }
  if (!greedy && kept.attention && attentionShardings(*f) != *kept.attention) {
    // A forced --cp stands. Under auto, a plan may place attention otherwise when it reads no
    // operand whole on the axes context parallelism split it on, so that each rank holds as
    // little as ring attention's: on a split of the batch, its operands moved there upstream,
    // before the ops that make them (attention data-parallel over the batch: s2-w2-u40-c144 and
    // s1-w3-c333, which send half and three quarters of the ring's bytes). Ring attention stays
    // where the batch does not split (one sequence, or fewer than the devices). Where context
    // parallelism gathered the keys and values (the sequence does not divide for ring attention,
    // nor the heads for Ulysses), every rank holds and attends everything: any placement within
    // the search's bounds holds and attends no more (7 heads split 2, 2, 2, 1 on 4 ranks, the
    // pending values reduce-scattered to them: the placement fuzzer's s12-w4-u40-c31).
    const bool otherwise = options.propagation.context_parallel == ContextParallel::Auto &&
                           (kept.gathered || attentionSplitOn(*f, kept.context_parallel));
    if (!otherwise) return std::nullopt;
  }
  t.cost = measure(*f, kept.parameters);
  t.steps = routeSteps(*f);
  return t;
}

// One step of the local search from `best`: the first plan that changes one decision, or else
// two, and so on, and ranks better without more collectives or `work` than the greedy plan;
// nullopt when none does within the budget. Why more than one at once: a value gathered for one
// consumer serves a second only when that consumer, too, stops computing on its shards, and a
// pending sum reduce-scattered for one op pays off only when a later op computes on the gathered
// whole (each change alone costs more than the plan it leaves).
std::optional<Trial> betterNeighbour(const Fusion& f, const PipelineOptions& options, const Trial& best,
                                     const PlanCost& bound, Kept& kept, TriedPlans& tried, bool resumed,
                                     int64_t& plans) {
  const std::vector<int64_t>& counts = best.choices.candidates;
  std::vector<int64_t> take = best.choices.take;
  take.resize(counts.size(), 0);
  const std::vector<int64_t> base = take;
  std::optional<Trial> found;
  // Changes `left` more decisions, each after decision `from`, to a candidate other than the
  // base's; stops at the first better plan or when the budget is spent.
  auto changes = [&](auto&& self, size_t from, size_t left) -> bool {
    if (left == 0) {
      TriedPlans::Key k = TriedPlans::key(take, best.choices.fewest_moves_on_ties, best.by_bytes);
      if (!resumed || !tried.contains(k)) {
        if (plans >= search_placements::kMaxPlans) return true;
        ++plans;
      }
      const std::optional<Trial>& t = tried.get(std::move(k), [&] {
        return tryPlan(f, options, take, best.choices.fewest_moves_on_ties, best.by_bytes, kept);
      });
      if (t && t->cost < best.cost && t->cost.work <= bound.work && t->cost.collectives <= bound.collectives) {
        found = *t;
        return true;
      }
      return false;
    }
    for (size_t d = from; d < counts.size(); ++d) {
      for (int64_t k = 0; k < counts[d]; ++k) {
        if (k == base[d]) continue;
        take[d] = k;
        if (self(self, d + 1, left - 1)) return true;
      }
      take[d] = base[d];
    }
    return false;
  };
  // Every decision of one op that has another candidate, changed at once (its output's placement
  // on each mesh axis; `group`: those decisions, the k-th onwards still to change): on a mesh of
  // several axes, moving a value from [Replicate, Shard(0)] to [Shard(0), Replicate] is one
  // move, tried before other pairs (the placement fuzzer's s1-w4-c381, whose pairs outnumber the
  // budget).
  auto together = [&](auto&& self, const std::vector<size_t>& group, size_t k) -> bool {
    if (k == group.size()) return changes(changes, counts.size(), 0);
    const size_t d = group[k];
    for (int64_t c = 0; c < counts[d]; ++c) {
      if (c == base[d]) continue;
      take[d] = c;
      if (self(self, group, k + 1)) return true;
    }
    take[d] = base[d];
    return false;
  };
  const std::vector<int64_t>& op = best.choices.op;
  for (size_t n = 1; n <= counts.size() && !found && plans < search_placements::kMaxPlans; ++n) {
    changes(changes, 0, n);
    for (size_t d = 0; n == 1 && d < counts.size() && !found && plans < search_placements::kMaxPlans;) {
      std::vector<size_t> group;
      size_t e = d;
      for (; e < counts.size() && op[e] == op[d]; ++e)
        if (counts[e] > 1 || (counts[e] == 1 && base[e] != 0)) group.push_back(e);  // (it has another)
      if (group.size() > 1) together(together, group, 0);
      d = e;
    }
  }
  return found;
}

}  // namespace

int64_t workPerRank(const Fusion& f) {
  int64_t work = 0;
  for (const Expr* e : f.exprs()) {
    if (e->kind() == OpKind::Set) continue;
    work += localElements(f, e->output());
    for (const Val* v : e->inputs())
      if (v != nullptr && v->valKind() == ValKind::TensorView)
        work += localElements(f, static_cast<const TensorView*>(v));
  }
  return work;
}

void searchPlacements(Fusion& f, const PipelineOptions& options) {
  if (!applies(f, options)) {
    propagateShardings(f, options.propagation, options.sizes);
    return;
  }
  Kept kept;
  kept.parameters = parameters(f);
  // (A definition that asks for routes by bytes itself, `reshard by bytes`, keeps them.)
  const bool asked = f.reshardByBytes();
  TriedPlans tried;
  // A plan each climb starts from, measured once (it counts against no climb's budget).
  auto start = [&](std::vector<int64_t> take, bool fewest_moves_on_ties, bool by_bytes) {
    return tried.get(TriedPlans::key(take, fewest_moves_on_ties, by_bytes),
                     [&] { return tryPlan(f, options, std::move(take), fewest_moves_on_ties, by_bytes, kept); });
  };
  std::optional<Trial> best = start({}, false, asked);
  // (When the greedy plan does not propagate or decompose, the pass below makes it and reports
  // why, or decomposition then does, as it would without the search.)
  if (best) {
    const PlanCost greedy = best->cost;
    // Climbs from `from` to the first better neighbour until none is or the budget is spent;
    // `plans`: the plans counted so far against its budget (a climb that spends it all stops
    // short of a plan with no better neighbour).
    auto climb = [&](Trial from, int64_t& plans, bool resumed = false) {
      for (;;) {
        std::optional<Trial> t = betterNeighbour(f, options, from, greedy, kept, tried, resumed, plans);
        if (!t) return from;
        from = std::move(*t);
      }
    };
    std::vector<Trial> stopped;  // where climbs that spent their budget stopped
    int64_t plans = 1;           // (the greedy plan's)
    best = climb(*best, plans);
    if (plans >= search_placements::kMaxPlans) stopped.push_back(*best);
    // Again, with the decisions re-made around each change keeping values as they arrive where
    // candidates tie (PlanChoices::fewest_moves_on_ties): a split that the greedy order takes
    // for free at each op of a chain costs a gather at its pinned end, and taking it back needs
    // a change at every op of the chain (the placement fuzzer's s1-w4-c22 and s1-w4-c381, on a
    // 2x2 mesh). Budgeted apart; the better of the two plans is taken.
    // (Its first plan may do more work than the greedy one: the climb still starts there, and
    // where it ends is taken only within the greedy plan's bounds.)
    auto within = [&](const Trial& t) {
      return t.cost < best->cost && t.cost.work <= greedy.work && t.cost.collectives <= greedy.collectives;
    };
    if (std::optional<Trial> from = start({}, true, asked)) {
      int64_t plans = 1;
      Trial other = climb(*from, plans);
      if (plans >= search_placements::kMaxPlans) stopped.push_back(other);
      if (within(other)) best = std::move(other);
    }
    // Again, from the best plan so far, with every conversion routed by fewest bytes
    // (Fusion::reshardByBytes) where a mesh has two axes to route over and that plan's
    // conversions route otherwise so: a conversion may then take a collective more than its
    // route of fewest collectives, and a plan pays for it where it saves one elsewhere (a pending
    // sum reduce-scattered along another dim before it travels, so that its consumers read it
    // reduced: the placement fuzzer's s2-w4-u40-c332). Budgeted apart; taken only within the
    // greedy plan's bounds. (Where the best plan's routes are the same by bytes, its neighbours
    // are not climbed again: the climb's budget is mostly spent proving a plan has no better
    // neighbour, and the fuzzer's CI budgets would take a third longer.)
    if (!asked && routesDiffer(f)) {
      std::optional<Trial> from = start(best->choices.take, best->choices.fewest_moves_on_ties, true);
      if (from && from->steps != best->steps) {
        int64_t plans = 2;
        Trial other = climb(*from, plans);
        if (plans >= search_placements::kMaxPlans) stopped.push_back(other);
        if (within(other)) best = std::move(other);
      }
    }
    // Last, each climb that spent its budget resumed where it stopped, with a budget as large
    // again: a program of many decisions can be several better plans away from where a climb
    // stopped (the placement fuzzer's s12-w4-u40-c72, where the second climb's resumption finds
    // the plan). Resumed last, not budgeted larger at first, so that the climbs above start
    // where they did (a first climb that goes further can end where the climb by bytes no
    // longer finds its plan: s2-w4-u40-c332). The neighbours measured before cost it nothing
    // (TriedPlans).
    for (Trial& from : stopped) {
      int64_t more = 0;
      Trial resumed = climb(std::move(from), more, /*resumed=*/true);
      if (within(resumed)) best = std::move(resumed);
    }
  }
  PlanChoices chosen;
  if (best) chosen.take = best->choices.take, chosen.fewest_moves_on_ties = best->choices.fewest_moves_on_ties;
  propagateShardings(f, options.propagation, options.sizes, &chosen);
  if (kept.made) keepOutputs(f, kept.outputs);
  if (best) f.setReshardByBytes(best->by_bytes);
}

}  // namespace meshfuse
