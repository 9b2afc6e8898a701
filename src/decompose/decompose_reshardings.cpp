// Communication/compute decomposition (contract in decompose_reshardings.h).
#include "decompose/decompose_reshardings.h"

#include <algorithm>
#include <map>

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
    if (in != nullptr && i < rule.linear_in.size() && rule.linear_in[i] &&
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

// Inserts `set`s before `e` that take `from` to `target` one mesh axis at a time, in the order
// reshardingSteps plans. `why` holds one "{}" for `from`.
TensorView* reshard(Fusion& f, Expr* e, TensorView* from, const Sharding& target, const std::string& why) {
  TensorView* cur = from;
  Sharding s = readSharding(from);
  for (size_t a = 0; a < target.axes.size(); ++a)
    MF_USER_CHECK(target.axes[a].kind != Placement::Partial || s.axes[a] == target.axes[a], ErrorKind::Unsupported,
                  "{}: {} needs {} but a {} value cannot become a pending sum", e->name(), f.displayName(from),
                  target.axes[a].toString(), s.axes[a].toString());
  f.setInsertionPoint(e);
  Sharding axes_target = target;
  axes_target.mesh = s.mesh;  // the stage move comes last, below
  for (const Sharding& next_state : reshardingSteps(s, axes_target)) {
    size_t a = 0;
    while (next_state.axes[a] == s.axes[a]) ++a;
    std::string step = fmt::format("{} -> {} on mesh axis {}", s.axes[a].toString(), next_state.axes[a].toString(), a);
    s = next_state;
    TensorView* next = ops::set(cur);
    writeSharding(next, s);
    next->setPinned(false);
    next->setProvenance({fmt::format("{}: {}", why, step), {from}});
    cur = next;
  }
  // Last, the move to the consumer's pipeline stage (the same sharding on another mesh).
  if (s.mesh != target.mesh) {
    const Fusion& cf = f;
    std::string step =
        fmt::format("moved from stage {} to stage {}", cf.mesh(s.mesh).toString(), cf.mesh(target.mesh).toString());
    s.mesh = target.mesh;
    TensorView* next = ops::set(cur);
    writeSharding(next, s);
    next->setPinned(false);
    next->setProvenance({fmt::format("{}: {}", why, step), {from}});
    cur = next;
  }
  f.setInsertionPoint(nullptr);
  return cur;
}

// Resharded copies made so far, so that several consumers needing the same sharding of a value
// share one collective (q, k and v projections read one gathered activation).
class ReshardCache {
 public:
  TensorView* get(Fusion& f, Expr* e, TensorView* from, const Sharding& target, const std::string& why) {
    auto key = std::make_pair(from, toString(target) + fmt::format("@{}", target.mesh));
    auto it = done_.find(key);
    if (it != done_.end()) return it->second;
    return done_[key] = reshard(f, e, from, target, why);
  }

 private:
  std::map<std::pair<TensorView*, std::string>, TensorView*> done_;
};

// A set that changes several axes (or axes and the stage) becomes a chain of sets that change one
// each (in reshardingSteps' order): the axes first, on the source stage; the move to the stage
// last. The set itself keeps the last step.
void decomposeSet(Fusion& f, Expr* e) {
  TensorView* in = tensorAt(e, 0);
  Sharding from = readSharding(in), to = readSharding(e->output());
  MF_CHECK(from.decided() && to.decided(), "decompose-reshardings requires propagate-shardings first");
  for (size_t a = 0; a < to.axes.size(); ++a)
    MF_USER_CHECK(to.axes[a].kind != Placement::Partial || from.axes[a].kind == Placement::Partial,
                  ErrorKind::Unsupported,
                  "set: {} is pinned {} on mesh axis {} but its input {} is {}; a set cannot make a pending sum "
                  "(Partial) of a value that has none",
                  f.displayName(e->output()), to.axes[a].toString(), a, f.displayName(in), from.axes[a].toString());
  Sharding axes_to = to;
  axes_to.mesh = from.mesh;
  std::vector<Sharding> steps = reshardingSteps(from, axes_to);
  int64_t count = static_cast<int64_t>(steps.size()) + (from.mesh != to.mesh ? 1 : 0);
  if (count > 1) {
    Sharding mid = from.mesh != to.mesh ? axes_to : steps[steps.size() - 2];
    TensorView* staged = reshard(f, e, in, mid, fmt::format("staged for {} of {{}}", e->name()));
    f.replaceOperand(e, in, staged);
  }
}

// An output sharded along a dim that no operand dim becomes (a user pinned softmax(%x, dim=1)
// Shard(1), its normalized dim) cannot be computed locally: the op computes that mesh axis whole
// and a set after it slices to the pin (no communication). Returns that set, or nullptr.
Expr* computeWholeThenSlice(Fusion& f, Expr* e, const ShardingRule& rule) {
  TensorView* out = e->output();
  const Sharding pinned = readSharding(out);
  Sharding computed = pinned;
  std::vector<int64_t> partial_dims(pinned.axes.size(), -1);
  std::vector<int64_t> whole;  // the mesh axes computed whole
  for (size_t a = 0; a < pinned.axes.size(); ++a) {
    const Placement& p = pinned.axes[a];
    if (p.kind == Placement::Partial) {
      // A contraction's reduction dim stays the Partial dim; an added one is added again.
      int64_t logical = out->logicalAxisOf(out->loopAxisOf(out->mesh()->parallelTypeOfAxis(a)));
      if (logical < static_cast<int64_t>(out->logical().size()) - out->numPartialDims()) partial_dims[a] = logical;
    }
    if (p.kind != Placement::Shard) continue;
    const IterDomain* id = out->dims()[p.dim];
    if (rule.fromOperands(std::find(out->logical().begin(), out->logical().end(), id) - out->logical().begin()))
      continue;
    computed.axes[a] = Placement::replicate();
    whole.push_back(static_cast<int64_t>(a));
  }
  if (whole.empty()) return nullptr;
  const Provenance why = out->pinned() ? pinnedProvenance(out) : out->provenanceNote();
  auto next = std::find(f.exprs().begin(), f.exprs().end(), e) + 1;
  f.setInsertionPoint(next == f.exprs().end() ? nullptr : *next);
  TensorView* sliced = ops::set(out);
  f.setInsertionPoint(nullptr);
  writeSharding(sliced, pinned);
  f.replaceAllUses(out, sliced);
  if (!out->name().empty()) {
    std::string name = out->name();
    f.rename(out, "");
    f.rename(sliced, name);
  }
  bool was_pinned = out->pinned();
  writeSharding(out, computed, partial_dims);
  out->setPinned(false);
  out->setProvenance({fmt::format("computed whole on mesh axis {}: {} cannot give {{}}'s {} locally; a slice follows",
                                  fmt::join(whole, ", "), e->name(), toString(pinned)),
                      {sliced}});
  sliced->setPinned(was_pinned);
  sliced->setProvenance(why);
  redirectProvenance(f, out, sliced);
  return sliced->definition();
}

// Gives every operand of the compute op `e` the sharding its rule needs for e's output.
void decomposeCompute(Fusion& f, Expr* e, const ShardingRule& rule, ReshardCache& cache) {
  TensorView* out = e->output();
  const int64_t axes = out->mesh()->rank();
  std::vector<OutputChoice> choices;
  for (int64_t a = 0; a < axes; ++a) choices.push_back(outputChoice(e, rule, a));
  for (size_t i = 0; i < e->inputs().size(); ++i) {
    if (e->inputs()[i] == nullptr) continue;
    // Scalars too: a pinned Partial output of add(%q, 1.0) has no operands that give it.
    for (int64_t a = 0; a < axes; ++a)
      MF_USER_CHECK(requiredOperandState(e, rule, choices[a], i).has_value(), ErrorKind::Unsupported,
                    "{}: its output {} is {} on mesh axis {}, which no sharding of operand {} can give: {}", e->name(),
                    f.displayName(out), choices[a].state.toString(), a, f.displayName(e->inputs()[i]),
                    whyNoPendingSum(f, e, rule, choices[a]));
    TensorView* in = tensorAt(e, i);
    if (in == nullptr) continue;
    Sharding actual = readSharding(in);
    MF_CHECK(actual.decided(), "{} has no mesh", f.displayName(in));
    Sharding need = actual;
    need.mesh = out->meshIndex();  // operands come to the op's pipeline stage
    for (int64_t a = 0; a < axes; ++a) need.axes[a] = *requiredOperandState(e, rule, choices[a], i);
    if (need == actual) continue;
    TensorView* fixed = cache.get(f, e, in, need, fmt::format("{} needs {{}} as {}", e->name(), toString(need)));
    // Only this operand slot: a value read twice may be needed in two shardings
    // (matmul(%a, %a) reads %a sharded on rows and whole).
    f.replaceOperandAt(e, i, fixed);
  }
}

}  // namespace

void decomposeReshardings(Fusion& f) {
  std::vector<Expr*> exprs = f.exprs();
  ReshardCache cache;
  for (Expr* e : exprs) {
    if (e->kind() == OpKind::Set) {
      decomposeSet(f, e);
      continue;
    }
    MF_CHECK(e->output()->mesh() != nullptr,
             "decompose-reshardings requires propagate-shardings first ({} has no mesh)", f.displayName(e->output()));
    ShardingRule rule = shardingRuleOf(e);
    if (Expr* slice = computeWholeThenSlice(f, e, rule)) decomposeSet(f, slice);
    decomposeCompute(f, e, rule, cache);
  }
}

}  // namespace meshfuse
