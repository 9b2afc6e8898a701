// Sharding propagation (contract in propagate_shardings.h).
#include "propagation/propagate_shardings.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "meshfuse/ir/fusion.h"
#include "meshfuse/ops.h"
#include "propagation/context_parallel.h"
#include "propagation/required_sharding.h"
#include "propagation/sharding.h"
#include "propagation/sharding_rule.h"

namespace meshfuse {
namespace {

constexpr int64_t kInfinite = std::numeric_limits<int64_t>::max() / 4;
constexpr int64_t kWeightFactor = 1000;

// Bytes one rank sends, as a polynomial in the symbolic sizes (`?t`): each term's key lists the
// symbols it multiplies. Sizes are positive, so when every term of a difference has one sign the
// order holds whatever the sizes; otherwise it depends on them and compare() says so.
class Volume {
 public:
  // `scale` times the bytes of `tv`'s global value (its non-reduction dims).
  static Volume of(const TensorView* tv, double scale) {
    Volume v;
    if (scale == 0) return v;
    std::vector<std::string> symbols;
    double c = scale * static_cast<double>(dtypeSize(tv->dtype()));
    for (const IterDomain* id : tv->dims()) {
      const Extent& e = id->extent();
      if (e.isStatic()) {
        c *= static_cast<double>(e.value());
      } else {
        c *= static_cast<double>(e.num()) / static_cast<double>(e.den());
        symbols.push_back(e.symbol());
      }
    }
    std::sort(symbols.begin(), symbols.end());
    v.terms_[symbols] = c;
    return v;
  }
  Volume& operator+=(const Volume& o) {
    for (const auto& [k, c] : o.terms_) terms_[k] += c;
    return *this;
  }
  // -1, 0 or 1 as `a` is less, equal or more than `b` for all sizes; nullopt when that depends on them.
  friend std::optional<int> compare(const Volume& a, const Volume& b) {
    bool less = false, more = false;
    auto diff = [&](const std::vector<std::string>& k) {
      auto at = [&](const Volume& v) {
        auto it = v.terms_.find(k);
        return it == v.terms_.end() ? 0.0 : it->second;
      };
      const double d = at(a) - at(b);
      if (d < 0) less = true;
      if (d > 0) more = true;
    };
    for (const auto& t : a.terms_) diff(t.first);
    for (const auto& t : b.terms_) diff(t.first);
    if (less && more) return std::nullopt;
    return less ? -1 : more ? 1 : 0;
  }

 private:
  std::map<std::vector<std::string>, double> terms_;
};

// What a choice costs: collectives first (a parameter's move counts kWeightFactor), then the
// bytes they move, which only breaks ties.
struct Cost {
  int64_t collectives = 0;
  Volume volume;
  Cost& operator+=(const Cost& o) {
    collectives = std::min(kInfinite, collectives + o.collectives);
    volume += o.volume;
    return *this;
  }
};

// The bytes one rank sends to take `tv` from `from` to `to` on a mesh axis of `n` devices, as
// ring algorithms do (their common factor (n-1)/n left out): an allgather or a reduce-scatter
// sends the whole value once, an allreduce twice, an all-to-all an n-th of it; a slice nothing.
// "The whole value" is the global one: what other mesh axes split off is not taken out (on a
// mesh of several axes this is an estimate).
Volume moveVolume(const TensorView* tv, const AxisState& from, const AxisState& to, int64_t n) {
  if (from == to || to.kind == Placement::Partial || from.kind == Placement::Replicate) return {};
  if (from.kind == Placement::Partial) return Volume::of(tv, to.kind == Placement::Replicate ? 2.0 : 1.0);
  return Volume::of(tv, to.kind == Placement::Replicate ? 1.0 : 1.0 / static_cast<double>(n));
}

struct TvState {
  Sharding sharding;
  std::vector<int64_t> partial_dims;          // per axis: logical reduction index or -1
  std::vector<std::optional<int64_t>> hints;  // per axis: a dims() index sharded upstream
  std::vector<Provenance> why;                // per axis
};

class Propagator {
 public:
  // `mesh`: the mesh of tensors nothing else decides.
  Propagator(Fusion& f, int64_t mesh, const PropagationOptions& options, SymbolBindings sizes)
      : f_(f), mesh_index_(mesh), options_(options), sizes_(std::move(sizes)) {}

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
    for (size_t i = 0; i < f_.exprs().size(); ++i)  // routePinned may insert a set after the op
      if (unrouted_.count(f_.exprs()[i]->output()) > 0) routePinned(f_.exprs()[i]);
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
    if (tv->definition() != nullptr && tv->definition()->kind() != OpKind::Set) unrouted_.insert(tv);
  }

  // A pin on an op's output says what the value must be, not how the op computes it: the op
  // takes the cheapest choice counting the set after it that makes the pin. A reduction or
  // contraction over a sharded dim stays a local pending sum which that set reduce-scatters or
  // all-reduces (rather than its operands being moved: a weight, or all of a reduction's input);
  // an output pinned along a dim the op cannot split is computed whole and the set slices it.
  // When the choice is the pin itself nothing changes; otherwise a new set after the op takes
  // the pin and the name, and the op's output becomes the unpinned value it computes.
  bool routePinned(Expr* e) {
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
      std::vector<OutputChoice> cands = alignedWithOtherAxes(out, s, mesh, a, candidates(e, rule, mesh, a));
      OutputChoice as_pinned = outputChoice(e, a);
      bool listed = false;
      for (const OutputChoice& c : cands)
        listed |= c.state == pin_state && c.contraction_dim == as_pinned.contraction_dim;
      // A Shard along a dim no operand dim becomes is not the op's to give (softmax's dim), nor
      // one that context parallelism did not choose (a set after the op makes it).
      if (!listed && (pin_state.kind != Placement::Shard || rule.fromOperands(as_pinned.out_logical)) &&
          !contextParallel(e, rule, mesh, a))
        cands.push_back(as_pinned);
      std::optional<OutputChoice> best = choose(e, rule, mesh, a, cands, &pin_state);
      if (!best.has_value()) continue;  // a pinned pending sum the op cannot give: decomposition says why
      take(e, rule, mesh, a, *best, s);
      if (best->state != pin_state) moved.push_back(a);
    }
    if (moved.empty()) return true;
    TensorView* made = movePinToASetAfter(e);
    for (int64_t a : moved) {
      const AxisState& pin_state = pinned.sharding.axes[a];
      const bool local = pin_state.kind != Placement::Shard || rule.fromOperands(logicalIndexOfDim(out, pin_state.dim));
      s.why[a].text += local
                           ? fmt::format("; a set after {} makes it {{}}'s pinned {}, rather than its operands moving",
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
  TensorView* movePinToASetAfter(Expr* e) {
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
  bool forward(bool with_open_inputs) {
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

  // Collectives that take a value from `from` to `to` on one mesh axis: one (an allgather,
  // all-to-all, reduce-scatter or allreduce), none for a local slice (Replicate -> Shard).
  static int64_t conversionCost(const AxisState& from, const std::optional<AxisState>& to) {
    if (!to.has_value()) return kInfinite;
    if (from == *to) return 0;
    if (to->kind == Placement::Partial) return kInfinite;  // nothing turns into a pending sum
    if (from.kind == Placement::Replicate) return 0;
    return 1;
  }

  // The mesh of e's output (its pipeline stage): a GEMM's parameter's mesh, else the mesh of
  // the operand computed last (activations flow forward through the stages).
  int64_t meshFor(const Expr* e, const ShardingRule& rule) const {
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
  bool decide(Expr* e) {
    if (rewrite(e)) return true;
    ShardingRule rule = shardingRuleOf(e);
    TensorView* out = e->output();
    TvState s = fresh(meshFor(e, rule));
    const DeviceMesh& mesh = f_.mesh(s.sharding.mesh);
    for (int64_t a = 0; a < mesh.rank(); ++a) {
      std::optional<OutputChoice> best =
          choose(e, rule, mesh, a, alignedWithOtherAxes(out, s, mesh, a, candidates(e, rule, mesh, a)), nullptr);
      MF_CHECK(best.has_value(), "no feasible sharding for {} on mesh axis {}", e->name(), a);
      take(e, rule, mesh, a, *best, s);
    }
    states_[out] = s;
    return true;
  }

  // The cheapest of `cands` for e's output on mesh axis `a` (nullopt when none is feasible). With
  // `pin` (the user's state of that output on `a`), a candidate also pays for the set after the
  // op that makes it the pin. Ties go to a settled value over a pending sum, which costs a
  // reduction later (mul(%q, %r) reads the %q another consumer already reduced rather than
  // staying Partial: not a concern under a pin, which the set settles), then to less data, then
  // to moving less before the op (it computes on its operands as they are and the set moves its
  // result: nvFuser's reduce-scatter of a sum over one row per device), then to the pin itself
  // (no set), then to the first candidate.
  std::optional<OutputChoice> choose(const Expr* e, const ShardingRule& rule, const DeviceMesh& mesh, int64_t a,
                                     const std::vector<OutputChoice>& cands, const AxisState* pin) const {
    struct Scored {
      const OutputChoice* choice;
      Cost total;
      Volume before;  // what the operands' moves send
    };
    std::optional<Scored> best;
    for (const OutputChoice& c : cands) {
      Scored s{&c, candidateCost(e, rule, mesh, c, a), {}};
      s.before = s.total.volume;
      if (pin != nullptr)
        s.total += {conversionCost(c.state, *pin), moveVolume(e->output(), c.state, *pin, mesh.size(a))};
      if (s.total.collectives >= kInfinite) continue;
      if (!best || cheaper(s, *best, pin)) best = s;
    }
    if (!best) return std::nullopt;
    return *best->choice;
  }
  template <typename Scored>
  static bool cheaper(const Scored& x, const Scored& y, const AxisState* pin) {
    if (x.total.collectives != y.total.collectives) return x.total.collectives < y.total.collectives;
    const AxisState &xs = x.choice->state, &ys = y.choice->state;
    const bool pending = xs.kind == Placement::Partial, y_pending = ys.kind == Placement::Partial;
    if (pin == nullptr && pending != y_pending) return y_pending;
    for (auto [a, b] : {std::pair{&x.total.volume, &y.total.volume}, std::pair{&x.before, &y.before}})
      if (std::optional<int> order = compare(*a, *b); order && *order != 0) return *order < 0;
    return pin != nullptr && xs == *pin && ys != *pin;
  }

  // Records choice `c` for e's output on axis `a` in `s`, and the moves of operands it needs.
  void take(const Expr* e, const ShardingRule& rule, const DeviceMesh& mesh, int64_t a, const OutputChoice& c,
            TvState& s) {
    for (size_t i = 0; i < e->inputs().size(); ++i) {
      const TensorView* in = tensorAt(e, i);
      if (in == nullptr || !decided(in) || !aligned(in, mesh)) continue;
      AxisState req = *requiredOperandState(e, rule, c, i);
      if (req != states_.at(in).sharding.axes[a] && !planned(in, a, req)) planned_.push_back({in, a, req});
    }
    s.sharding.axes[a] = c.state;
    s.partial_dims[a] = c.contraction_dim;
    s.why[a] = c.why;
    s.hints[a] = hintFor(e, rule, mesh, a, c.state);
  }

  // The candidates whose Shard, nested with what the other mesh axes of `state` already give
  // `tv` along the same dim (mesh-axis order, as applyPlacements splits), still cuts every
  // operand dim it comes from into the blocks the op maps to the output's (carriesShard: a
  // reshape that splits or merges the dim must keep torch.chunk's blocks lined up). Any size
  // may be sharded, unevenly too; a pending sum over a contracted dim in any blocks (each rank
  // sums its own). (Found by the placement fuzzer with even sizes only: a 2-row tensor pinned
  // [Shard(0), Replicate()] whose operand was [Replicate(), Shard(0)] got [Shard(0), Shard(0)],
  // which was refused then; nested uneven blocks of 1 and 0 rows are valid now.)
  std::vector<OutputChoice> alignedWithOtherAxes(const TensorView* tv, const TvState& state, const DeviceMesh& mesh,
                                                 int64_t a, std::vector<OutputChoice> cands) const {
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

  // Whether an earlier decision already moves `tv` to `state` on axis `a`.
  bool planned(const TensorView* tv, int64_t a, const AxisState& state) const {
    return std::find(planned_.begin(), planned_.end(), Move{tv, a, state}) != planned_.end();
  }

  // The communication that giving every operand what candidate `c` needs on axis `a` costs;
  // kInfinite when some operand cannot give it (a scalar added to a pending sum, a dim that does
  // not divide). A value read by several operands that need the same state is moved once, and a
  // move an earlier decision already makes is free (decomposition shares it between consumers).
  Cost candidateCost(const Expr* e, const ShardingRule& rule, const DeviceMesh& mesh, const OutputChoice& c,
                     int64_t a) const {
    const Cost infeasible{kInfinite, {}};
    Cost cost;
    std::vector<std::pair<const Val*, AxisState>> moved;
    for (size_t i = 0; i < e->inputs().size(); ++i) {
      if (e->inputs()[i] == nullptr) continue;
      std::optional<AxisState> req = requiredOperandState(e, rule, c, i);
      if (!req.has_value()) return infeasible;
      TensorView* in = tensorAt(e, i);
      if (in == nullptr) continue;  // a scalar is the same value on every device
      if (req->kind == Placement::Shard && rule.operand_maps[i][req->dim] >= 0 &&
          !carriesShard(e, rule, i, req->dim, {mesh.size(a)}, sizes_))
        return infeasible;
      if (!decided(in) || !aligned(in, mesh)) {
        // An open value is placed as this op needs it, for free, and a value on a mesh of
        // another shape is moved anyway; neither becomes a pending sum (an open input's value
        // is whole on the devices that hold it; no move between meshes makes one).
        if (req->kind == Placement::Partial) return infeasible;
        continue;
      }
      std::pair<const Val*, AxisState> move(in, *req);
      if (std::find(moved.begin(), moved.end(), move) != moved.end() || planned(in, a, *req)) continue;
      moved.push_back(move);
      const AxisState& from = states_.at(in).sharding.axes[a];
      int64_t c1 = conversionCost(from, req);
      // A pending sum asked of a whole value: no collective makes one (and weighting kInfinite
      // below would overflow).
      if (c1 >= kInfinite) return infeasible;
      // Moving what should stay costs kWeightFactor times more: parameters, or with
      // gather_parameters (FSDP) the activations.
      bool parameter = static_cast<int64_t>(i) == rule.weight_operand && f_.isInput(in);
      if (c1 > 0 && parameter != options_.gather_parameters) c1 *= kWeightFactor;
      cost += {c1, moveVolume(in, from, *req, mesh.size(a))};
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
    // Operand i's dim d, sharded on this axis (or upstream), carried to the output where the
    // blocks line up (carriesShard): a reshape that merges [2, 16] into [32] cannot carry a
    // 4-way split of the 32 back to the 2.
    auto fromDim = [&](size_t i, int64_t d, const char* how) {
      int64_t ol = rule.operand_maps[i][d];
      if (ol < 0 || expands(e, rule, i, d) || !carriesShard(e, rule, i, d, {n}, sizes_)) return;
      const IterDomain* id = o->logical()[ol];
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
    // Attention whose keys and values arrive split along the sequence: context parallelism
    // decides (context_parallel.h) rather than the count of collectives, which would gather them
    // (n times the bytes of Ulysses, the whole sequence on every rank).
    if (std::optional<OutputChoice> cp = contextParallel(e, rule, mesh, a)) return {*cp};
    OutputChoice rep;
    rep.why = Provenance::literal(fmt::format("Replicate(): no cheaper sharding for {} on mesh axis {}", e->name(), a));
    add(rep);
    return out;
  }

  // The candidate context parallelism gives attention `e` on axis `a` (context_parallel.h): the
  // output split by heads (Ulysses: q, k and v move there by all-to-all), or along the query's
  // sequence with k and v whole (ring attention rotates them, or they are gathered); nullopt when
  // the keys' sequence is not split on `a`, or they are gathered for a query that is not split or
  // whose rows the op's output does not keep (sdpa_grad: its rule then decides).
  std::optional<OutputChoice> contextParallel(const Expr* e, const ShardingRule& rule, const DeviceMesh& mesh,
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
        if (ol < 0 || o->logical()[ol]->isReduction() || expands(e, rule, i, d) ||
            !carriesShard(e, rule, i, d, {mesh.size(a)}, sizes_))
          continue;
        int64_t dim = dimIndexOfLogical(o, ol);
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

  // Rewrites an op that cannot keep its operands' sharding as one op into ops that can. Returns
  // whether it did (the new ops are decided in their turn).
  bool rewrite(Expr* e) {
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
    replaceResult(e, sum);
  }

  // Whether mean `e` reduces a dim that its operand has sharded on a mesh axis of its output's
  // mesh, over dims of static sizes.
  bool meanOverShardedDim(const Expr* e) const {
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
  void splitMean(Expr* e) {
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
  void replaceResult(Expr* e, TensorView* replacement) {
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

  Fusion& f_;
  int64_t mesh_index_;
  PropagationOptions options_;
  SymbolBindings sizes_;  // symbolic sizes known at compile time (whether a reshape's blocks line up)
  std::map<const TensorView*, TvState> states_;
  // Moves that decided ops need of their operands (tensor, mesh axis, state).
  struct Move {
    const TensorView* tv;
    int64_t axis;
    AxisState state;
    bool operator==(const Move&) const = default;
  };
  std::vector<Move> planned_;
  // Pinned op outputs whose op has not yet chosen how to compute them (routePinned).
  std::set<const TensorView*> unrouted_;
};

}  // namespace

void propagateShardings(Fusion& f, const PropagationOptions& options, const SymbolBindings& sizes) {
  // Meshes may differ in shape: decomposition moves a value between them (see
  // decompose_reshardings.h for the moves it supports).
  int64_t mesh = -1;
  for (TensorView* tv : f.tensorViews())
    if (mesh < 0 && tv->meshIndex() >= 0) mesh = tv->meshIndex();
  if (mesh < 0) return;  // nothing placed: a single-device fusion
  Propagator(f, mesh, options, sizes).run();
}

}  // namespace meshfuse
