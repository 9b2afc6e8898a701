// Communication/compute decomposition (contract in decompose_reshardings.h).
#include "decompose/decompose_reshardings.h"

#include <algorithm>
#include <map>
#include <optional>
#include <vector>

#include "decompose/resharding_steps.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ops.h"
#include "propagation/required_sharding.h"
#include "propagation/sharding.h"

namespace meshfuse {
namespace {

TensorView* tensorAt(const Expr* e, size_t i) {
  Val* v = e->inputs()[i];
  return v != nullptr && v->valKind() == ValKind::TensorView ? static_cast<TensorView*>(v) : nullptr;
}

// The value `tv` is a copy of through the program's own sets on its mesh (a pin after an op):
// `tv` itself when it is not a set's result. Conversions of the copy may come from the value.
TensorView* setSource(TensorView* tv) {
  for (const Expr* d = tv->definition(); d != nullptr && d->kind() == OpKind::Set; d = tv->definition()) {
    TensorView* in = tensorAt(d, 0);
    if (in == nullptr || in->meshIndex() != tv->meshIndex()) break;
    tv = in;
  }
  return tv;
}

// Whether `e` converts its operand `from` to `target` from the operand itself, never from
// another copy of its value nor after a conversion made ahead for a later consumer: attention
// that needs an operand whole on some mesh axis, or that context parallelism places with the
// operand split along the sequence (dim 2 of [batch, heads, seq, head_dim]) and kept so on an
// axis. Ring attention finds the allgathers of its keys and values that this pass makes, and
// rotates them instead; a gathered copy another op slices would have to stay. An operand moved
// off its sequence split to a split of another dim on every such axis (the heads: Ulysses; the
// batch) is an all-to-all ring attention has nothing to do with, and shares conversions as any
// op: a copy gathered for another consumer is sliced instead (the placement fuzzer's
// s12-w4-u40-c31: 7 heads on 4 ranks, the sequence gathered for a sum). So does other attention
// (operands split along head_dim, say).
bool ownConversion(const Expr* e, const TensorView* from, const Sharding& target) {
  if (e->info().category != OpCategory::Attention) return false;
  constexpr int64_t kSeq = 2;
  const auto& to = target.axes;
  const auto& in = readSharding(from).axes;
  if (std::any_of(to.begin(), to.end(), [](const Placement& p) { return p.kind == Placement::Replicate; })) return true;
  if (from->rank() <= kSeq) return false;
  for (size_t a = 0; a < in.size() && a < to.size(); ++a)
    if (in[a] == Placement::shard(kSeq) && !(to[a].kind == Placement::Shard && to[a].dim != kSeq)) return true;
  return false;
}

// The output state of `e` on mesh axis `a`, with where a Partial comes from.
OutputChoice outputChoice(const Expr* e, const ShardingRule& rule, int64_t a) {
  const TensorView* out = e->output();
  OutputChoice c;
  c.state = placementsOf(out)[a];
  if (c.state.kind != Placement::Partial) return c;
  int64_t loop_axis = out->loopAxisOf(out->mesh()->parallelTypeOfAxis(a));
  int64_t logical = out->logicalAxisOf(loop_axis);
  if (rule.fromOperands(logical)) {  // a sharded contracted dim
    c.contraction_dim = logical;
    return c;
  }
  for (size_t i = 0; i < e->inputs().size(); ++i) {
    TensorView* in = tensorAt(e, i);
    // An operand on another mesh is moved to this one first, and no move between meshes makes
    // a pending sum (nor does its mesh have axis `a` necessarily).
    if (in != nullptr && i < rule.linear_in.size() && rule.linear_in[i] && in->mesh() == out->mesh() &&
        placementsOf(in)[a].kind == Placement::Partial) {
      c.source_operand = static_cast<int64_t>(i);
      return c;
    }
  }
  // A Partial pinned on the output with no pending operand: the op's contraction.
  c.contraction_dim = rule.contracted_dim;
  return c;
}

// Why `e` cannot give the pending sum `c` (only a user's pin asks for one that propagation did
// not choose), for the error message.
std::string whyNoPendingSum(const Fusion& f, const Expr* e, const ShardingRule& rule, const OutputChoice& c) {
  switch (rule.partial_mode) {
    case ShardingRule::PartialMode::None:
      return fmt::format("{} is not linear, so a pending sum must be reduced before it", e->name());
    case ShardingRule::PartialMode::All: return "a scalar would be added once per shard";
    case ShardingRule::PartialMode::AnyOne:
      if (c.source_operand < 0) return fmt::format("none of the operands {} is linear in is a pending sum", e->name());
      return fmt::format("{} reads {} in another operand too, so it is not linear in it", e->name(),
                         f.displayName(e->inputs()[c.source_operand]));
  }
  return "";
}

// Whether the mesh axes of `from` and `to` correspond (one mesh, or stages of one shape).
bool axesCorrespond(const Fusion& f, const Sharding& from, const Sharding& to) {
  return f.mesh(from.mesh).shape() == f.mesh(to.mesh).shape();
}

// `from`'s state on mesh axis `a` of `to`'s mesh, for errors: the axis's state when the meshes'
// axes correspond, else the whole sharding and its mesh.
std::string stateOn(const Fusion& f, const Sharding& from, const Sharding& to, size_t a) {
  if (axesCorrespond(f, from, to)) return from.axes[a].toString();
  return fmt::format("{} on mesh {}", toString(from), f.mesh(from.mesh).toString());
}

// Inserts one `set` before `e` per step of `steps`, starting from `from`. `why` holds one "{}"
// for `from`.
TensorView* insertSteps(Fusion& f, Expr* e, TensorView* from, const std::vector<ReshardingStep>& steps,
                        const std::string& why) {
  TensorView* cur = from;
  f.setInsertionPoint(e);
  for (const ReshardingStep& step : steps) {
    TensorView* next = ops::set(cur);
    writeSharding(next, step.to);
    next->setPinned(false);
    next->setProvenance({fmt::format("{}: {}", why, step.what), {from}});
    cur = next;
  }
  f.setInsertionPoint(nullptr);
  return cur;
}

// Inserts `set`s before `e` that take `from` to `target` one mesh axis (or one move between
// meshes) at a time, in the order planResharding plans. `why` holds one "{}" for `from`.
TensorView* reshard(Fusion& f, Expr* e, TensorView* from, const Sharding& target, const std::string& why) {
  Sharding s = readSharding(from);
  for (size_t a = 0; a < target.axes.size(); ++a)
    MF_USER_CHECK(target.axes[a].kind != Placement::Partial ||
                      (axesCorrespond(f, s, target) &&
                       (s.axes[a] == target.axes[a] || s.axes[a].kind == Placement::Replicate)),
                  ErrorKind::Unsupported, "{}: {} needs {} but a {} value cannot become a pending sum", e->name(),
                  f.displayName(from), target.axes[a].toString(), stateOn(f, s, target, a));
  std::string name = fmt::format("{} (for {})", f.displayName(from), f.displayName(e->output()));
  return insertSteps(f, e, from, planResharding(f, from, s, target, name), why);
}

// Resharded copies made so far, so that several consumers needing the same sharding of a value
// share one collective (q, k and v projections read one gathered activation), and the copies of
// each value (what sets make of it: decomposition's and the program's own), so that a consumer
// converts from whichever copy sends least: a Partial() all-reduced for one consumer and needed
// Shard(d) by another is sliced, not reduce-scattered again; a value pinned Shard(d) by a set
// after its op is read whole from the op by a consumer that needs it whole, not gathered back.
class ReshardCache {
 public:
  // `first`: values to convert to a sharding a later consumer needs before their first
  // conversion (convertFirst).
  explicit ReshardCache(std::map<TensorView*, Sharding> first) : first_(std::move(first)) {}

  TensorView* get(Fusion& f, Expr* e, TensorView* from, const Sharding& target, const std::string& why) {
    auto key = std::make_pair(from, toString(target) + fmt::format("@{}", target.mesh));
    auto it = done_.find(key);
    if (it != done_.end()) return it->second;
    const bool own = ownConversion(e, from, target);
    if (!own) convertAhead(f, e, from, target);
    TensorView* source = own ? from : cheapestCopy(f, from, target);
    TensorView* made = readSharding(source) == target ? source : reshard(f, e, source, target, why);
    noteCopies(made, source);
    return done_[key] = made;
  }

  // Before the first conversion of `from` (for `e`, to `target`): the conversion convertFirst
  // chose to make first, when it is another.
  void convertAhead(Fusion& f, Expr* e, TensorView* from, const Sharding& target) {
    from = setSource(from);
    auto early = first_.find(from);
    if (early == first_.end()) return;
    const Sharding ahead = early->second;
    first_.erase(early);
    if (ahead != target)
      made_ahead_[get(f, e, from, ahead,
          fmt::format("{{}} converted to {} first, for a later consumer: its other shardings are cheaper from there",
                      toString(ahead)))] = from;
  }
  // Whether convertAhead made `tv`.
  bool madeAhead(const TensorView* tv) const { return made_ahead_.count(tv) > 0; }

  // The copy of `tv`'s value that converts to `target` sending least: `tv` itself unless
  // another sends strictly less (when the bytes cannot be told, `tv`).
  TensorView* cheapestCopy(const Fusion& f, TensorView* tv, const Sharding& target) const {
    std::optional<int64_t> best = wireBytes(f, tv, readSharding(tv), target);
    TensorView* pick = tv;
    if (!best) return pick;
    auto it = copies_.find(rootOf(tv));
    if (it == copies_.end()) return pick;
    for (TensorView* c : it->second) {
      std::optional<int64_t> w = wireBytes(f, c, readSharding(c), target);
      if (w && *w < *best) best = w, pick = c;
    }
    return pick;
  }

  // Every set output from `made` back to `source` holds `source`'s value (so does `source`).
  void noteCopies(TensorView* made, TensorView* source) {
    TensorView* root = rootOf(source);
    std::vector<TensorView*>& copies = copies_[root];
    if (copies.empty()) copies.push_back(root);
    for (TensorView* t = made; t != source && t->definition() != nullptr && t->definition()->kind() == OpKind::Set;
         t = static_cast<TensorView*>(t->definition()->input(size_t{0}))) {
      if (root_.count(t) > 0 || t == root) continue;
      root_[t] = root;
      copies.push_back(t);
    }
  }

 private:
  TensorView* rootOf(TensorView* tv) const {
    auto it = root_.find(tv);
    return it == root_.end() ? tv : it->second;
  }
  std::map<TensorView*, Sharding> first_;
  std::map<const TensorView*, TensorView*> made_ahead_;  // a conversion made ahead -> the value
  std::map<std::pair<TensorView*, std::string>, TensorView*> done_;
  std::map<TensorView*, TensorView*> root_;                 // a copy -> the value it copies
  std::map<TensorView*, std::vector<TensorView*>> copies_;  // a value -> its copies, itself first
};

// A set that changes several axes, or moves between meshes in several steps, becomes a chain of
// sets that each make one step (planResharding's). The set itself keeps the last step.
void decomposeSet(Fusion& f, Expr* e) {
  TensorView* in = tensorAt(e, 0);
  Sharding from = readSharding(in), to = readSharding(e->output());
  MF_CHECK(from.decided() && to.decided(), "decompose-reshardings requires propagate-shardings first");
  for (size_t a = 0; a < to.axes.size(); ++a)
    MF_USER_CHECK(to.axes[a].kind != Placement::Partial ||
                      (axesCorrespond(f, from, to) && from.axes[a].kind != Placement::Shard),
                  ErrorKind::Unsupported,
                  "set: {} is pinned {} on mesh axis {} but its input {} is {}; a set makes a pending sum (Partial) "
                  "only of a whole value (Replicate)",
                  f.displayName(e->output()), to.axes[a].toString(), a, f.displayName(in), stateOn(f, from, to, a));
  std::vector<ReshardingStep> steps =
      planResharding(f, in, from, to, fmt::format("{} (for {})", f.displayName(in), f.displayName(e->output())));
  if (steps.size() > 1) {
    steps.pop_back();
    TensorView* staged = insertSteps(f, e, in, steps, fmt::format("staged for {} of {{}}", e->name()));
    f.replaceOperand(e, in, staged);
  }
}

// What e's output takes on each mesh axis, checked against what the op can compute.
std::vector<OutputChoice> outputChoices(const Fusion& f, const Expr* e, const ShardingRule& rule) {
  TensorView* out = e->output();
  const int64_t axes = out->mesh()->rank();
  std::vector<OutputChoice> choices;
  for (int64_t a = 0; a < axes; ++a) {
    choices.push_back(outputChoice(e, rule, a));
    // propagate-shardings computes an output the op cannot split that way whole (a set after it
    // makes the pin); operands sharded to fit could not give it.
    const Placement& p = choices.back().state;
    MF_CHECK(p.kind != Placement::Shard ||
                 rule.fromOperands(out->logicalAxisOf(out->loopAxisOf(out->mesh()->parallelTypeOfAxis(a)))),
             "{}: {} is {} on mesh axis {}, along a dim no operand dim becomes (propagate-shardings computes such an "
             "output whole)",
             e->name(), f.displayName(out), p.toString(), a);
  }
  return choices;
}

// The sharding operand i of `e` must have for `choices` (a user error when none can give it);
// nullopt for a scalar operand.
std::optional<Sharding> operandNeed(const Fusion& f, const Expr* e, const ShardingRule& rule,
                                    const std::vector<OutputChoice>& choices, size_t i) {
  const TensorView* out = e->output();
  const auto axes = static_cast<int64_t>(choices.size());
  // Scalars too: a pinned Partial output of add(%q, 1.0) has no operands that give it.
  for (int64_t a = 0; a < axes; ++a)
    MF_USER_CHECK(requiredOperandState(e, rule, choices[a], i).has_value(), ErrorKind::Unsupported,
                  "{}: its output {} is {} on mesh axis {}, which no sharding of operand {} can give: {}", e->name(),
                  f.displayName(out), choices[a].state.toString(), a, f.displayName(e->inputs()[i]),
                  whyNoPendingSum(f, e, rule, choices[a]));
  if (tensorAt(e, i) == nullptr) return std::nullopt;
  // Operands come to the op's pipeline stage (whose mesh may have another shape).
  Sharding need{out->meshIndex(), std::vector<AxisState>(axes, Placement::replicate())};
  for (int64_t a = 0; a < axes; ++a) need.axes[a] = *requiredOperandState(e, rule, choices[a], i);
  return need;
}

// Gives every operand of the compute op `e` the sharding its rule needs for e's output.
void decomposeCompute(Fusion& f, Expr* e, const ShardingRule& rule, ReshardCache& cache) {
  const std::vector<OutputChoice> choices = outputChoices(f, e, rule);
  for (size_t i = 0; i < e->inputs().size(); ++i) {
    if (e->inputs()[i] == nullptr) continue;
    const std::optional<Sharding> need = operandNeed(f, e, rule, choices, i);
    if (!need) continue;
    TensorView* in = tensorAt(e, i);
    Sharding actual = readSharding(in);
    MF_CHECK(actual.decided(), "{} has no mesh", f.displayName(in));
    if (*need == actual) continue;
    TensorView* fixed = cache.get(f, e, in, *need, fmt::format("{} needs {{}} as {}", e->name(), toString(*need)));
    // Only this operand slot: a value read twice may be needed in two shardings
    // (matmul(%a, %a) reads %a sharded on rows and whole).
    f.replaceOperandAt(e, i, fixed);
  }
}

// What converting a value to `needs` in that order sends, each from the cheapest copy made so
// far: {bytes, collectives}; nullopt when the bytes cannot be told.
std::optional<std::pair<int64_t, int64_t>> conversionCost(const Fusion& f, const TensorView* tv,
                                                          const std::vector<Sharding>& needs) {
  std::vector<Sharding> have = {readSharding(tv)};
  std::pair<int64_t, int64_t> cost{0, 0};
  for (const Sharding& n : needs) {
    std::optional<int64_t> step;
    for (const Sharding& h : have) {
      std::optional<int64_t> w = wireBytes(f, tv, h, n);
      if (!w) return std::nullopt;
      step = step ? std::min(*step, *w) : *w;
    }
    cost.first += *step;
    cost.second += *step > 0 ? 1 : 0;
    have.push_back(n);
  }
  return cost;
}

// For each value its consumers (ops and the program's own sets; not attention's ownConversion)
// need in several shardings: the one to convert it to first, when converting there first and
// slicing the others from it is no worse than converting in consumer order in bytes and in
// collectives, and better in one. An operand needed Shard(1) by one op and whole by a later one:
// one allgather and a free slice, not an all-to-all and then the allgather; a Partial() needed
// Shard(2) and whole: one allreduce and a slice, not a reduce-scatter and an allgather (the same
// bytes). The consumers of a set's result count as the consumers of the value it copies
// (setSource): an output pinned Shard(2) after its op and read whole by a later op is a slice of
// the op's gathered result, not an all-to-all gathered again (the placement fuzzer's s11-w4-c184).
std::map<TensorView*, Sharding> convertFirst(const Fusion& f) {
  std::map<TensorView*, std::vector<Sharding>> needs;  // in consumer order, distinct
  auto note = [&](TensorView* in, const Sharding& need) {
    if (need == readSharding(in) || need.mesh != in->meshIndex()) return;
    in = setSource(in);  // (a consumer of a pinned copy may convert from the op's own result)
    if (need == readSharding(in)) return;
    std::vector<Sharding>& n = needs[in];
    if (std::find(n.begin(), n.end(), need) == n.end()) n.push_back(need);
  };
  for (Expr* e : f.exprs()) {
    if (e->kind() == OpKind::Set) {
      if (TensorView* in = tensorAt(e, 0)) note(in, readSharding(e->output()));
      continue;
    }
    if (e->output()->mesh() == nullptr) continue;
    const ShardingRule rule = shardingRuleOf(e);
    const std::vector<OutputChoice> choices = outputChoices(f, e, rule);
    // (Every operand in order, scalars too: a user error names the same operand as
    // decomposeCompute's would.)
    for (size_t i = 0; i < e->inputs().size(); ++i)
      if (e->inputs()[i] != nullptr)
        if (std::optional<Sharding> need = operandNeed(f, e, rule, choices, i);
            need && !ownConversion(e, tensorAt(e, i), *need))
          note(tensorAt(e, i), *need);
  }
  std::map<TensorView*, Sharding> first;
  for (auto& [tv, n] : needs) {
    if (n.size() < 2) continue;
    const std::optional<std::pair<int64_t, int64_t>> in_order = conversionCost(f, tv, n);
    if (!in_order) continue;
    std::pair<int64_t, int64_t> best = *in_order;
    for (size_t k = 1; k < n.size(); ++k) {
      std::vector<Sharding> reordered = n;
      std::rotate(reordered.begin(), reordered.begin() + static_cast<std::ptrdiff_t>(k),
                  reordered.begin() + static_cast<std::ptrdiff_t>(k) + 1);
      const std::optional<std::pair<int64_t, int64_t>> c = conversionCost(f, tv, reordered);
      // (No worse in bytes or collectives, better in one: a Partial() needed Shard(2) and whole
      // is all-reduced and sliced, not reduce-scattered and gathered, the same bytes in one.)
      if (c && c->first <= best.first && c->second <= best.second && *c != best) best = *c, first.insert_or_assign(tv, n[k]);
    }
  }
  return first;
}

// The program's own set `e` would copy `made`, a conversion of its operand made ahead of it
// (convertFirst) to the same sharding: `made` becomes the set's result (its name, its pin, its
// readers), and the set goes.
void foldInto(Fusion& f, Expr* e, TensorView* made) {
  TensorView* out = e->output();
  const bool pinned = out->pinned();
  f.replaceAllUses(out, made);
  redirectProvenance(f, out, made);
  f.removeExpr(e);
  if (std::string name = out->name(); !name.empty()) {
    f.rename(out, "");
    f.rename(made, name);
  }
  if (pinned) {
    made->setPinned(true);
    made->setProvenance(pinnedProvenance(made));
  }
}

}  // namespace

void decomposeReshardings(Fusion& f) {
  std::vector<Expr*> exprs = f.exprs();
  ReshardCache cache(convertFirst(f));
  for (Expr* e : exprs) {
    if (e->kind() == OpKind::Set) {
      // The program's own set (a pin, an output made whole) converts from the cheapest copy
      // of its operand too, and its result is one more copy.
      TensorView* in = tensorAt(e, 0);
      if (in->meshIndex() == e->output()->meshIndex()) {
        cache.convertAhead(f, e, in, readSharding(e->output()));
        TensorView* source = cache.cheapestCopy(f, in, readSharding(e->output()));
        if (cache.madeAhead(source) && readSharding(source) == readSharding(e->output())) {
          foldInto(f, e, source);
          continue;
        }
        if (source != in) f.replaceOperand(e, in, source);
        decomposeSet(f, e);
        cache.noteCopies(e->output(), source);
        continue;
      }
      decomposeSet(f, e);
      continue;
    }
    MF_CHECK(e->output()->mesh() != nullptr,
             "decompose-reshardings requires propagate-shardings first ({} has no mesh)", f.displayName(e->output()));
    decomposeCompute(f, e, shardingRuleOf(e), cache);
  }
}

}  // namespace meshfuse
