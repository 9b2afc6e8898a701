// Sharding propagation (contract in propagate_shardings.h): the sweeps to a fixed point, the
// user's pins and each op's decision on every mesh axis. The candidates, their costs and the
// rewrites an op may need are in the propagate_shardings_*.cpp files beside this one.
#include "propagation/propagate_shardings.h"

#include <algorithm>
#include <optional>
#include <set>

#include "meshfuse/ir/fusion.h"
#include "meshfuse/ops.h"
#include "propagation/propagator.h"

namespace meshfuse::sharding_propagation {

void Propagator::run() {
  for (TensorView* tv : f_.tensorViews())
    if (tv->pinned()) pin(tv);
  // Forward and backward sweeps to a fixed point. When they stall on an op that waits for an
  // input the user left open (add(%a Shard(0), %b) with %b unplaced), or for a value computed
  // only from such inputs, the first such op decides from its placed operands (an open value
  // costs nothing to place) and the backward sweep then gives the open value, and the open
  // inputs it is computed from, what that op needs: they follow their consumers instead of
  // staying Replicate and being resharded.
  for (bool changed = true; changed;) {
    changed = forward(/*with_open_inputs=*/false);
    changed |= backward();
    if (!changed) changed = forward(/*with_open_inputs=*/true);
  }
  for (TensorView* tv : f_.tensorViews()) {
    if (decided(tv)) continue;
    TvState s = fresh(mesh_index_);
    for (int64_t a = 0; a < f_.mesh(mesh_index_).rank(); ++a)
      s.why[a] = Provenance::literal("Replicate(): nothing decides it");
    states_[tv] = s;
  }
  for (size_t i = 0; i < f_.exprs().size(); ++i)  // routePinned may insert a set after the op
    if (unrouted_.count(f_.exprs()[i]->output()) > 0) routePinned(f_.exprs()[i]);
  write();
  settlePendingSources();
  materializeOutputs();
}

TvState Propagator::fresh(int64_t mesh) const {
  const int64_t axes = f_.mesh(mesh).rank();
  TvState s;
  s.sharding = {mesh, std::vector<AxisState>(axes, Placement::replicate())};
  s.partial_dims.assign(axes, -1);
  s.partial_sources.assign(axes, -1);
  s.hints.assign(axes, std::nullopt);
  s.why.assign(axes, Provenance{});
  return s;
}

void Propagator::pin(TensorView* tv) {
  TvState s = fresh(tv->meshIndex());
  s.sharding = readSharding(tv);
  // Not printed with the IR (a pin is the user's own text), but reported as the reason for a
  // collective that produces it (a redistributing set).
  tv->setProvenance(pinnedProvenance(tv));
  for (int64_t a = 0; a < tv->mesh()->rank(); ++a) {
    // A pinned op output that is Partial keeps its contraction dim; one pinned on a dim of its
    // own (applyPlacements) means the op's contraction.
    if (s.sharding.axes[a].kind == Placement::Partial && tv->definition() != nullptr) {
      int64_t logical = tv->logicalAxisOf(tv->loopAxisOf(tv->mesh()->parallelTypeOfAxis(a)));
      ShardingRule rule = shardingRuleOf(tv->definition());
      s.partial_dims[a] = rule.fromOperands(logical) ? logical : rule.contracted_dim;
    }
  }
  states_[tv] = s;
  if (tv->definition() != nullptr && tv->definition()->kind() != OpKind::Set) unrouted_.insert(tv);
}

// A pin on an op's output says what the value must be, not how the op computes it: the op
// takes the cheapest choice counting the set after it that makes the pin. A reduction or
// contraction over a sharded dim stays a local pending sum which that set reduce-scatters or
// all-reduces (rather than its operands being moved: a weight, or all of a reduction's input);
// an output pinned along a dim the op cannot split is computed whole and the set slices it.
// When the choice is the pin itself nothing changes; otherwise a new set after the op takes
// the pin and the name, and the op's output becomes the unpinned value it computes.
bool Propagator::routePinned(Expr* e) {
  TensorView* out = e->output();
  unrouted_.erase(out);
  if (rewrite(e)) return true;  // the op that takes the pin is routed in its turn
  const ShardingRule rule = shardingRuleOf(e);
  const TvState pinned = states_.at(out);
  const DeviceMesh& mesh = f_.mesh(pinned.sharding.mesh);
  TvState s = pinned;
  std::vector<int64_t> moved;  // the mesh axes computed otherwise than pinned
  for (int64_t a = 0; a < mesh.rank(); ++a) {
    const AxisState& pin_state = pinned.sharding.axes[a];
    // Candidates nest with the axes decided so far; the later ones are still open (as in
    // decide()), not their pins: a reshape's output pinned [Shard(0), Shard(0)] may compute
    // [Shard(0), Replicate] and slice axis 1 after it (the placement fuzzer's s9-w4-u40-c186,
    // whose Shard(0) on axis 0 was dropped as if axis 1 kept its pin).
    TvState so_far = s;
    for (int64_t b = a + 1; b < mesh.rank(); ++b) so_far.sharding.axes[b] = Placement::replicate();
    auto aligned = [&](std::vector<OutputChoice> c) { return alignedWithOtherAxes(out, so_far, mesh, a, std::move(c)); };
    std::vector<OutputChoice> cands = aligned(candidates(e, rule, mesh, a));
    OutputChoice as_pinned = outputChoice(e, a);
    bool listed = false;
    for (const OutputChoice& c : cands)
      listed |= c.state == pin_state && c.contraction_dim == as_pinned.contraction_dim;
    // A Shard along a dim no operand dim becomes is not the op's to give (softmax's dim), nor
    // one that context parallelism did not choose (a set after the op makes it).
    // (Nested with the other axes' shards like any candidate: a reshape of [2, 4] rows split
    // [Shard(0), Shard(0)] on a 2x2 mesh holds 4, 0, 4, 0 elements, not the 2 each of its [8]
    // output's pin; the op then computes it whole and the set slices it. Found by the placement
    // fuzzer, s9-w4-u40-c186: the ranks read blocks that were not theirs.)
    if (!listed && (pin_state.kind != Placement::Shard || rule.fromOperands(as_pinned.out_logical)) &&
        !contextParallel(e, rule, mesh, a))
      for (OutputChoice& c : aligned({as_pinned})) cands.push_back(std::move(c));
    std::optional<OutputChoice> best =
        choose(e, rule, mesh, a, cands, &pin_state, aligned(searchCandidates(e, rule, mesh, a, cands)));
    if (!best.has_value()) continue;  // a pinned pending sum the op cannot give: decomposition says why
    take(e, rule, mesh, a, *best, s);
    if (best->state != pin_state) moved.push_back(a);
  }
  if (moved.empty()) return true;
  TensorView* made = movePinToASetAfter(e);
  for (int64_t a : moved) {
    const AxisState& pin_state = pinned.sharding.axes[a];
    const bool local = pin_state.kind != Placement::Shard || rule.fromOperands(logicalIndexOfDim(out, pin_state.dim));
    s.why[a].text += local ? fmt::format("; a set after {} makes it {{}}'s pinned {}, rather than its operands moving",
                                         e->name(), pin_state.toString())
                           : fmt::format("; {} cannot give {{}}'s pinned {} locally: a set after it slices it",
                                         e->name(), pin_state.toString());
    s.why[a].refs.push_back(made);
  }
  states_[out] = s;
  return true;
}

// Moves the user's pin on e's output, and its name, to a new set after e that reads it; e's
// output becomes an unpinned value (whose state the caller decides). Returns the set's output.
TensorView* Propagator::movePinToASetAfter(Expr* e) {
  TensorView* out = e->output();
  auto next = std::find(f_.exprs().begin(), f_.exprs().end(), e) + 1;
  f_.setInsertionPoint(next == f_.exprs().end() ? nullptr : *next);
  TensorView* made = ops::set(out);
  f_.setInsertionPoint(nullptr);
  f_.replaceAllUses(out, made);
  if (std::string name = out->name(); !name.empty()) {
    f_.rename(out, "");
    f_.rename(made, name);
  }
  TvState pinned = states_.at(out);
  writeSharding(made, pinned.sharding);                        // pins it
  pinned.partial_dims.assign(pinned.partial_dims.size(), -1);  // a set's pending sums are dims of their own
  pinned.partial_sources.assign(pinned.partial_sources.size(), -1);
  states_[made] = pinned;
  made->setProvenance(out->provenanceNote());
  out->setPinned(false);
  // What was said of, or planned for, the user's value is about the set's output now.
  redirectProvenance(f_, out, made);
  for (auto& [tv, st] : states_)
    for (Provenance& p : st.why)
      std::replace(p.refs.begin(), p.refs.end(), static_cast<const Val*>(out), static_cast<const Val*>(made));
  for (Move& m : planned_)
    if (m.tv == out) m.tv = made;
  return made;
}

// Decides the outputs of ops whose tensor operands are decided; with `with_open_inputs`, only
// the first op whose undecided operands are all open (and that has a decided one).
bool Propagator::forward(bool with_open_inputs) {
  bool changed = false;
  const std::set<const TensorView*> open = with_open_inputs ? openTensors() : std::set<const TensorView*>{};
  // decide() may rewrite the program (splitBias), so index instead of iterating.
  for (size_t i = 0; i < f_.exprs().size(); ++i) {
    Expr* e = f_.exprs()[i];
    if (unrouted_.count(e->output()) > 0 && !with_open_inputs) {
      if (operandsDecided(e)) changed |= routePinned(e);
      continue;
    }
    if (decided(e->output())) continue;
    if (with_open_inputs) {
      if (!decidableWithOpen(e, open)) continue;
      return decide(e);
    }
    if (operandsDecided(e)) changed |= decide(e);
  }
  return changed;
}

// Open values take what their (last, in program order) decided consumer needs; the values and
// inputs they are computed from follow in the same sweep (it runs consumers first).
bool Propagator::backward() {
  bool changed = false;
  const std::set<const TensorView*> open = openTensors();
  for (auto it = f_.exprs().rbegin(); it != f_.exprs().rend(); ++it) {
    Expr* e = *it;
    if (!decided(e->output())) continue;
    ShardingRule rule = shardingRuleOf(e);
    for (size_t i = 0; i < e->inputs().size(); ++i) {
      TensorView* in = tensorAt(e, i);
      if (in == nullptr || decided(in) || open.count(in) == 0) continue;
      TvState s = fresh(states_.at(e->output()).sharding.mesh);
      for (int64_t a = 0; a < f_.mesh(s.sharding.mesh).rank(); ++a) {
        AxisState req = requiredOperandState(e, rule, outputChoice(e, a), i).value_or(Placement::replicate());
        // A computed value is placed only as its own op can give it locally (no pending sum, no
        // dim its operands do not have).
        if (const Expr* def = in->definition(); def != nullptr && !producible(def, req)) req = Placement::replicate();
        s.sharding.axes[a] = req;
        s.why[a] =
            Provenance::literal(fmt::format("{}: {}, placed as {} needs it", req.toString(),
                                            f_.isInput(in) ? "an open input" : "computed from open inputs", e->name()));
      }
      states_[in] = s;
      changed = true;
    }
  }
  return changed;
}

// Undecided inputs the user left open, and the undecided values computed only from them: they
// can take whatever their consumers need.
std::set<const TensorView*> Propagator::openTensors() const {
  std::set<const TensorView*> open;
  for (const TensorView* in : f_.inputs())
    if (!decided(in) && !in->pinned()) open.insert(in);
  for (const Expr* e : f_.exprs()) {
    if (decided(e->output())) continue;
    bool any = false, all = true;
    for (size_t i = 0; i < e->inputs().size(); ++i)
      if (const TensorView* t = tensorAt(e, i)) any = true, all &= open.count(t) > 0;
    if (any && all) open.insert(e->output());
  }
  return open;
}

bool Propagator::decidableWithOpen(const Expr* e, const std::set<const TensorView*>& open) const {
  bool any_decided = false;
  for (size_t i = 0; i < e->inputs().size(); ++i) {
    const TensorView* t = tensorAt(e, i);
    if (t == nullptr) continue;
    if (decided(t))
      any_decided = true;
    else if (open.count(t) == 0)
      return false;
  }
  return any_decided;
}

// Whether `def` can give its output `state` on one mesh axis from operands that are placed to
// fit: Replicate always; Shard only along a dim some operand dim becomes.
bool Propagator::producible(const Expr* def, const AxisState& state) const {
  if (state.kind == Placement::Replicate) return true;
  if (state.kind == Placement::Partial) return false;
  return shardingRuleOf(def).fromOperands(logicalIndexOfDim(def->output(), state.dim));
}

bool Propagator::operandsDecided(const Expr* e) const {
  for (size_t i = 0; i < e->inputs().size(); ++i)
    if (TensorView* t = tensorAt(e, i); t != nullptr && !decided(t)) return false;
  return true;
}

// The decided output state of `e` on axis `a`, as a candidate (for backward requirements).
OutputChoice Propagator::outputChoice(const Expr* e, int64_t a) const {
  const TvState& s = states_.at(e->output());
  OutputChoice c;
  c.state = s.sharding.axes[a];
  c.contraction_dim = s.partial_dims[a];
  c.source_operand = s.partial_sources[a];
  if (c.state.kind == Placement::Shard) c.out_logical = logicalIndexOfDim(e->output(), c.state.dim);
  return c;
}

// The mesh of e's output (its pipeline stage): a GEMM's parameter's mesh, else the mesh of
// the operand computed last (activations flow forward through the stages).
int64_t Propagator::meshFor(const Expr* e, const ShardingRule& rule) const {
  if (rule.weight_operand >= 0)  // (a parameter left open has no mesh yet: it follows the op)
    if (TensorView* w = tensorAt(e, rule.weight_operand); w != nullptr && f_.isInput(w) && decided(w))
      return states_.at(w).sharding.mesh;
  int64_t mesh = -1, latest = -2;
  for (size_t i = 0; i < e->inputs().size(); ++i) {
    TensorView* in = tensorAt(e, i);
    if (in == nullptr || !decided(in)) continue;
    const Expr* def = in->definition();
    int64_t pos = def == nullptr ? -1 : std::find(f_.exprs().begin(), f_.exprs().end(), def) - f_.exprs().begin();
    if (pos > latest) latest = pos, mesh = states_.at(in).sharding.mesh;
  }
  return mesh >= 0 ? mesh : mesh_index_;
}

// Decides e's output on every mesh axis. Returns true when it changed the IR or a state.
bool Propagator::decide(Expr* e) {
  if (rewrite(e)) return true;
  ShardingRule rule = shardingRuleOf(e);
  TensorView* out = e->output();
  TvState s = fresh(meshFor(e, rule));
  const DeviceMesh& mesh = f_.mesh(s.sharding.mesh);
  for (int64_t a = 0; a < mesh.rank(); ++a) {
    const std::vector<OutputChoice> cands = alignedWithOtherAxes(out, s, mesh, a, candidates(e, rule, mesh, a));
    std::optional<OutputChoice> best =
        choose(e, rule, mesh, a, cands, nullptr,
               alignedWithOtherAxes(out, s, mesh, a, searchCandidates(e, rule, mesh, a, cands)));
    MF_CHECK(best.has_value(), "no feasible sharding for {} on mesh axis {}", e->name(), a);
    take(e, rule, mesh, a, *best, s);
  }
  states_[out] = s;
  return true;
}

// Records choice `c` for e's output on axis `a` in `s`, and the moves of operands it needs.
void Propagator::take(const Expr* e, const ShardingRule& rule, const DeviceMesh& mesh, int64_t a, const OutputChoice& c,
                      TvState& s) {
  for (size_t i = 0; i < e->inputs().size(); ++i) {
    const TensorView* in = tensorAt(e, i);
    if (in == nullptr || !decided(in) || !aligned(in, mesh)) continue;
    AxisState req = *requiredOperandState(e, rule, c, i);
    if (req != states_.at(in).sharding.axes[a] && !planned(in, a, req)) planned_.push_back({in, a, req});
  }
  s.sharding.axes[a] = c.state;
  s.partial_dims[a] = c.contraction_dim;
  s.partial_sources[a] = c.source_operand;
  s.why[a] = c.why;
  s.hints[a] = hintFor(e, rule, mesh, a, c.state);
}

void Propagator::write() {
  for (TensorView* tv : f_.tensorViews()) {
    if (tv->pinned()) continue;
    const TvState& s = states_.at(tv);
    writeSharding(tv, s.sharding, s.partial_dims);
    tv->setPinned(false);
    tv->setProvenance(Provenance::join(s.why));
  }
}

// The IR records a pending sum passing through an op (linear(%x Partial, %w Partial) keeping
// %w's) only as the output's Partial; decomposition takes the first pending operand the op is
// linear in as its source. Where the decision kept another operand's, a set before the op makes
// each pending operand ahead of that one what the op needs of it (whole), so the IR says which
// (and so does a dump of this stage). Found by the placement fuzzer (s1-w2-c225): %w, a
// parameter, was all-reduced for the op where propagation had chosen to reduce %x.
void Propagator::settlePendingSources() {
  const std::vector<Expr*> exprs = f_.exprs();
  for (Expr* e : exprs) {
    if (e->kind() == OpKind::Set) continue;
    TensorView* out = e->output();
    auto it = states_.find(out);
    if (it == states_.end()) continue;
    const TvState& s = it->second;
    const ShardingRule rule = shardingRuleOf(e);
    for (size_t a = 0; a < s.partial_sources.size(); ++a) {
      const int64_t src = s.partial_sources[a];
      if (src <= 0 || s.sharding.axes[a].kind != Placement::Partial) continue;
      OutputChoice c;
      c.state = Placement::partial();
      c.source_operand = src;
      for (int64_t i = 0; i < src; ++i) {
        TensorView* in = tensorAt(e, static_cast<size_t>(i));
        if (in == nullptr || static_cast<size_t>(i) >= rule.linear_in.size() || !rule.linear_in[i] ||
            in->mesh() != out->mesh() || placementsOf(in)[a].kind != Placement::Partial)
          continue;
        const std::optional<AxisState> need = requiredOperandState(e, rule, c, static_cast<size_t>(i));
        if (!need || need->kind == Placement::Partial) continue;
        Sharding target = readSharding(in);
        target.axes[a] = *need;
        // What the op needs of it on the other axes goes into the same set, so that one
        // resharding orders every axis's step: slicing axis 1 before all-reducing axis 0 halves
        // what the allreduce sends (the placement fuzzer's s11-w4-c477, on a 2x2 mesh).
        for (size_t b = 0; b < target.axes.size(); ++b) {
          if (b == a || target.axes[b] == Placement::partial()) continue;
          const std::optional<AxisState> other =
              requiredOperandState(e, rule, outputChoice(e, static_cast<int64_t>(b)), static_cast<size_t>(i));
          if (other && other->kind != Placement::Partial) target.axes[b] = *other;
        }
        f_.setInsertionPoint(e);
        TensorView* made = ops::set(in);
        f_.setInsertionPoint(nullptr);
        writeSharding(made, target);
        made->setPinned(false);
        made->setProvenance({fmt::format("{} keeps the pending sum of {} on mesh axis {}: {{}} is made {} for it",
                                         e->name(), f_.displayName(e->inputs()[src]), a, need->toString()),
                             {in}});
        f_.replaceOperandAt(e, static_cast<size_t>(i), made);
      }
    }
  }
}

// Unpinned Partial outputs become Shard(hint) (reduce-scatter) or Replicate (allreduce).
void Propagator::materializeOutputs() {
  std::vector<TensorView*> outs = f_.outputs();
  for (TensorView* o : outs) {
    if (o->pinned()) continue;
    const TvState& s = states_.at(o);
    Sharding target = s.sharding;
    const DeviceMesh& mesh = f_.mesh(target.mesh);
    std::vector<Provenance> why;
    bool partial = false;
    for (int64_t a = 0; a < mesh.rank(); ++a) {
      if (target.axes[a].kind != Placement::Partial) continue;
      partial = true;
      std::optional<int64_t> h = s.hints[a];
      bool taken = false;
      for (int64_t b = 0; b < mesh.rank(); ++b) taken |= b != a && h && target.axes[b] == Placement::shard(*h);
      if (h && !taken) {  // (unevenly too: torch.chunk's blocks, a reduce-scatter of unequal counts)
        target.axes[a] = Placement::shard(*h);
        why.push_back(Provenance::literal(
            fmt::format("output materialized: Partial() reduce-scattered to Shard({}) on mesh axis {}, as dim {} is "
                        "sharded there in the inputs it derives from",
                        *h, a, *h)));
      } else {
        target.axes[a] = Placement::replicate();
        why.push_back(Provenance::literal(
            fmt::format("output materialized: Partial() all-reduced to Replicate() on mesh axis {}", a)));
      }
    }
    if (!partial) continue;
    TensorView* m = ops::set(o);
    writeSharding(m, target);
    m->setPinned(false);
    m->setProvenance(Provenance::join(why));
    f_.replaceOutput(o, m);
    if (!o->name().empty()) {
      std::string name = o->name();
      f_.rename(o, "");
      f_.rename(m, name);
    }
  }
}

}  // namespace meshfuse::sharding_propagation

namespace meshfuse {

void propagateShardings(Fusion& f, const PropagationOptions& options, const SymbolBindings& sizes,
                        PlanChoices* choices) {
  // Meshes may differ in shape: decomposition moves a value between them (see
  // decompose_reshardings.h for the moves it supports).
  int64_t mesh = -1;
  for (TensorView* tv : f.tensorViews())
    if (mesh < 0 && tv->meshIndex() >= 0) mesh = tv->meshIndex();
  if (mesh < 0) return;  // nothing placed: a single-device fusion
  sharding_propagation::Propagator(f, mesh, options, sizes, choices).run();
}

}  // namespace meshfuse
