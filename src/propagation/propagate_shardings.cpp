// Sharding propagation (contract in propagate_shardings.h).
#include "propagation/propagate_shardings.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "meshfuse/ir/fusion.h"
#include "meshfuse/ops.h"
#include "propagation/required_sharding.h"
#include "propagation/sharding.h"
#include "propagation/sharding_rule.h"

namespace meshfuse {
namespace {

constexpr int64_t kInfinite = std::numeric_limits<int64_t>::max() / 4;
constexpr int64_t kWeightFactor = 1000;

struct TvState {
  Sharding sharding;
  std::vector<int64_t> partial_dims;          // per axis: logical reduction index or -1
  std::vector<std::optional<int64_t>> hints;  // per axis: a dims() index sharded upstream
  std::vector<Provenance> why;                // per axis
};

class Propagator {
 public:
  // `mesh`: the mesh of tensors nothing else decides.
  Propagator(Fusion& f, int64_t mesh, const PropagationOptions& options)
      : f_(f), mesh_index_(mesh), options_(options) {}

  void run() {
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
    write();
    materializeOutputs();
  }

 private:
  TvState fresh(int64_t mesh) const {
    const int64_t axes = f_.mesh(mesh).rank();
    TvState s;
    s.sharding = {mesh, std::vector<AxisState>(axes, Placement::replicate())};
    s.partial_dims.assign(axes, -1);
    s.hints.assign(axes, std::nullopt);
    s.why.assign(axes, Provenance{});
    return s;
  }

  // Whether decided `tv`'s mesh axes correspond to those of `mesh` (the same mesh, or a stage of
  // the same shape: data moves between equal coordinates). A tensor on a mesh of another shape
  // says nothing about how an op on `mesh` is sharded: decomposition moves it (a broadcast,
  // scatter, gather or reduce) to whatever sharding the op needs, at the same cost for any.
  bool aligned(const TensorView* tv, const DeviceMesh& mesh) const {
    return f_.mesh(states_.at(tv).sharding.mesh).shape() == mesh.shape();
  }

  void pin(TensorView* tv) {
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
  }

  // Decides the outputs of ops whose tensor operands are decided; with `with_open_inputs`, only
  // the first op whose undecided operands are all open (and that has a decided one).
  bool forward(bool with_open_inputs) {
    bool changed = false;
    const std::set<const TensorView*> open = with_open_inputs ? openTensors() : std::set<const TensorView*>{};
    // decide() may rewrite the program (splitBias), so index instead of iterating.
    for (size_t i = 0; i < f_.exprs().size(); ++i) {
      Expr* e = f_.exprs()[i];
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
  bool backward() {
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
          s.why[a] = Provenance::literal(fmt::format("{}: {}, placed as {} needs it", req.toString(),
                                                     f_.isInput(in) ? "an open input" : "computed from open inputs",
                                                     e->name()));
        }
        states_[in] = s;
        changed = true;
      }
    }
    return changed;
  }

  bool decided(const TensorView* tv) const { return states_.count(tv) > 0; }
  // Undecided inputs the user left open, and the undecided values computed only from them: they
  // can take whatever their consumers need.
  std::set<const TensorView*> openTensors() const {
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
  bool decidableWithOpen(const Expr* e, const std::set<const TensorView*>& open) const {
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
  bool producible(const Expr* def, const AxisState& state) const {
    if (state.kind == Placement::Replicate) return true;
    if (state.kind == Placement::Partial) return false;
    return shardingRuleOf(def).fromOperands(logicalIndexOfDim(def->output(), state.dim));
  }
  static TensorView* tensorAt(const Expr* e, size_t i) {
    Val* v = e->inputs()[i];
    return v != nullptr && v->valKind() == ValKind::TensorView ? static_cast<TensorView*>(v) : nullptr;
  }
  bool operandsDecided(const Expr* e) const {
    for (size_t i = 0; i < e->inputs().size(); ++i)
      if (TensorView* t = tensorAt(e, i); t != nullptr && !decided(t)) return false;
    return true;
  }

  // The decided output state of `e` on axis `a`, as a candidate (for backward requirements).
  OutputChoice outputChoice(const Expr* e, int64_t a) const {
    const TvState& s = states_.at(e->output());
    OutputChoice c;
    c.state = s.sharding.axes[a];
    c.contraction_dim = s.partial_dims[a];
    if (c.state.kind == Placement::Shard) c.out_logical = logicalIndexOfDim(e->output(), c.state.dim);
    return c;
  }

  static int64_t logicalIndexOfDim(const TensorView* tv, int64_t dim) {
    const IterDomain* id = tv->dims().at(dim);
    return std::find(tv->logical().begin(), tv->logical().end(), id) - tv->logical().begin();
  }
  static int64_t dimIndexOfLogical(const TensorView* tv, int64_t logical) {
    std::vector<IterDomain*> dims = tv->dims();
    return std::find(dims.begin(), dims.end(), tv->logical().at(logical)) - dims.begin();
  }

  int64_t conversionCost(const AxisState& from, const std::optional<AxisState>& to) const {
    if (!to.has_value()) return kInfinite;
    if (from == *to) return 0;
    if (to->kind == Placement::Partial) return kInfinite;  // nothing turns into a pending sum
    if (from.kind == Placement::Partial) return 2;
    if (from.kind == Placement::Shard) return 1;
    return 0;  // Replicate -> Shard: a local slice
  }

  // The mesh of e's output (its pipeline stage): a GEMM's parameter's mesh, else the mesh of
  // the operand computed last (activations flow forward through the stages).
  int64_t meshFor(const Expr* e, const ShardingRule& rule) const {
    if (rule.weight_operand >= 0)
      if (TensorView* w = tensorAt(e, rule.weight_operand); w != nullptr && f_.isInput(w))
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
  bool decide(Expr* e) {
    ShardingRule rule = shardingRuleOf(e);
    TensorView* out = e->output();
    if (e->kind() == OpKind::Linear && e->input("bias") != nullptr && wouldBePartial(e)) {
      splitBias(e);
      return true;
    }
    TvState s = fresh(meshFor(e, rule));
    const DeviceMesh& mesh = f_.mesh(s.sharding.mesh);
    for (int64_t a = 0; a < mesh.rank(); ++a) {
      std::vector<OutputChoice> cands = candidates(e, rule, mesh, a);
      int64_t best_cost = kInfinite;
      const OutputChoice* best = nullptr;
      for (const OutputChoice& c : cands) {
        int64_t cost = candidateCost(e, rule, mesh, c, a);
        // On a tie, a settled value beats a pending sum, which costs a reduction later (mul(%q,
        // %r) reads the %q another consumer already reduced rather than staying Partial).
        bool settles = best != nullptr && best->state.kind == Placement::Partial && c.state.kind != Placement::Partial;
        if (cost < best_cost || (cost == best_cost && settles)) best_cost = cost, best = &c;
      }
      MF_CHECK(best != nullptr, "no feasible sharding for {} on mesh axis {}", e->name(), a);
      for (size_t i = 0; i < e->inputs().size(); ++i) {
        const TensorView* in = tensorAt(e, i);
        if (in == nullptr || !decided(in) || !aligned(in, mesh)) continue;
        AxisState req = *requiredOperandState(e, rule, *best, i);
        if (req != states_.at(in).sharding.axes[a] && !planned(in, a, req)) planned_.push_back({in, a, req});
      }
      s.sharding.axes[a] = best->state;
      s.partial_dims[a] = best->contraction_dim;
      s.why[a] = best->why;
      s.hints[a] = hintFor(e, rule, mesh, a, best->state);
    }
    states_[out] = s;
    return true;
  }

  // Whether dim `dim` (a dims() index) of `tv` splits evenly over `n` devices.
  bool shardable(const TensorView* tv, int64_t dim, int64_t n) const {
    const IterDomain* id = tv->dims().at(dim);
    return !id->isBroadcast() && id->extent().divisible(n);
  }

  // Whether an earlier decision already moves `tv` to `state` on axis `a`.
  bool planned(const TensorView* tv, int64_t a, const AxisState& state) const {
    return std::find(planned_.begin(), planned_.end(), Move{tv, a, state}) != planned_.end();
  }

  // The communication that giving every operand what candidate `c` needs on axis `a` costs;
  // kInfinite when some operand cannot give it (a scalar added to a pending sum, a dim that does
  // not divide). A value read by several operands that need the same state is moved once, and a
  // move an earlier decision already makes is free (decomposition shares it between consumers).
  int64_t candidateCost(const Expr* e, const ShardingRule& rule, const DeviceMesh& mesh, const OutputChoice& c,
                        int64_t a) const {
    int64_t cost = 0;
    std::vector<std::pair<const Val*, AxisState>> moved;
    for (size_t i = 0; i < e->inputs().size(); ++i) {
      if (e->inputs()[i] == nullptr) continue;
      std::optional<AxisState> req = requiredOperandState(e, rule, c, i);
      if (!req.has_value()) return kInfinite;
      TensorView* in = tensorAt(e, i);
      if (in == nullptr) continue;  // a scalar is the same value on every device
      if (req->kind == Placement::Shard && !shardable(in, req->dim, mesh.size(a))) return kInfinite;
      if (!decided(in) || !aligned(in, mesh)) {
        // An open value is placed as this op needs it, for free, and a value on a mesh of
        // another shape is moved anyway; neither becomes a pending sum (an open input's value
        // is whole on the devices that hold it; no move between meshes makes one).
        if (req->kind == Placement::Partial) return kInfinite;
        continue;
      }
      std::pair<const Val*, AxisState> move(in, *req);
      if (std::find(moved.begin(), moved.end(), move) != moved.end() || planned(in, a, *req)) continue;
      moved.push_back(move);
      int64_t c1 = conversionCost(states_.at(in).sharding.axes[a], req);
      // Moving what should stay costs kWeightFactor times more: parameters, or with
      // gather_parameters (FSDP) the activations.
      bool parameter = static_cast<int64_t>(i) == rule.weight_operand && f_.isInput(in);
      if (c1 > 0 && parameter != options_.gather_parameters) c1 *= kWeightFactor;
      cost = std::min(kInfinite, cost + c1);
    }
    return cost;
  }

  std::vector<OutputChoice> candidates(const Expr* e, const ShardingRule& rule, const DeviceMesh& mesh,
                                       int64_t a) const {
    std::vector<OutputChoice> out;
    const TensorView* o = e->output();
    const int64_t n = mesh.size(a);
    auto add = [&](OutputChoice c) {
      for (const OutputChoice& x : out)
        if (x.state == c.state && x.contraction_dim == c.contraction_dim) return;
      out.push_back(std::move(c));
    };
    // Operand i's dim d, sharded on this axis (or upstream), carried to the output. Both the
    // operand's dim and the output dim it becomes must split evenly: a reshape that merges
    // [2, 16] into [32] cannot carry a 4-way split of the 32 back to the 2.
    auto fromDim = [&](size_t i, int64_t d, const char* how) {
      int64_t ol = rule.operand_maps[i][d];
      if (ol < 0 || !shardable(tensorAt(e, i), d, n)) return;
      const IterDomain* id = o->logical()[ol];
      if (!id->extent().divisible(n) || id->isBroadcast()) return;
      OutputChoice c;
      if (id->isReduction()) {
        if (!rule.contraction_ok) return;
        c.state = Placement::partial();
        c.contraction_dim = ol;
        c.why = {fmt::format("Partial(): contracted dim {} is sharded in {{}} ({})", d, how), {e->inputs()[i]}};
      } else {
        c.state = Placement::shard(dimIndexOfLogical(o, ol));
        c.out_logical = ol;
        c.why = {fmt::format("{}: dim {} of {{}} ({}) through {}", c.state.toString(), d, how, e->name()),
                 {e->inputs()[i]}};
      }
      add(c);
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
    OutputChoice rep;
    rep.why = Provenance::literal(fmt::format("Replicate(): no cheaper sharding for {} on mesh axis {}", e->name(), a));
    add(rep);
    return out;
  }

  std::optional<int64_t> hintFor(const Expr* e, const ShardingRule& rule, const DeviceMesh& mesh, int64_t a,
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
        if (ol < 0 || o->logical()[ol]->isReduction() || !shardable(in, d, mesh.size(a))) continue;
        int64_t dim = dimIndexOfLogical(o, ol);
        // Only a dim that can be sharded is worth remembering (a head count the mesh does not
        // divide is not).
        if (!shardable(o, dim, mesh.size(a))) continue;
        if (chosen.kind != Placement::Shard || chosen.dim != dim) return dim;
      }
    }
    return std::nullopt;
  }

  // Whether x or weight is a pending sum or sharded along the contracted dim on some axis.
  bool wouldBePartial(const Expr* e) const {
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
  void splitBias(Expr* e) {
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
    std::string name = old->name();
    f_.replaceAllUses(old, sum);
    f_.removeExpr(e);
    if (!name.empty()) {
      f_.rename(old, "");
      f_.rename(sum, name);
    }
    if (old->pinned()) {
      sum->setDeviceMesh(*old->mesh());
      for (const ScheduleStep& st : old->schedule()) sum->applyStep(st);
      pin(sum);
    }
  }

  void write() {
    for (TensorView* tv : f_.tensorViews()) {
      if (tv->pinned()) continue;
      const TvState& s = states_.at(tv);
      writeSharding(tv, s.sharding, s.partial_dims);
      tv->setPinned(false);
      tv->setProvenance(Provenance::join(s.why));
    }
  }

  // Unpinned Partial outputs become Shard(hint) (reduce-scatter) or Replicate (allreduce).
  void materializeOutputs() {
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
        if (h && !taken && o->shape()[*h].divisible(mesh.size(a))) {
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

  Fusion& f_;
  int64_t mesh_index_;
  PropagationOptions options_;
  std::map<const TensorView*, TvState> states_;
  // Moves that decided ops need of their operands (tensor, mesh axis, state).
  struct Move {
    const TensorView* tv;
    int64_t axis;
    AxisState state;
    bool operator==(const Move&) const = default;
  };
  std::vector<Move> planned_;
};

}  // namespace

void propagateShardings(Fusion& f, const PropagationOptions& options) {
  // Meshes may differ in shape: decomposition moves a value between them (see
  // decompose_reshardings.h for the moves it supports).
  int64_t mesh = -1;
  for (TensorView* tv : f.tensorViews())
    if (mesh < 0 && tv->meshIndex() >= 0) mesh = tv->meshIndex();
  if (mesh < 0) return;  // nothing placed: a single-device fusion
  Propagator(f, mesh, options).run();
}

}  // namespace meshfuse
