// What a candidate sharding of an op's output costs (propagate-shardings, contract in
// propagate_shardings.h): collectives first, then the bytes they move, which only break ties.
// Kept apart from the sweeps so the cost model reads as one piece.
#include <algorithm>
#include <limits>
#include <map>
#include <optional>

#include "propagation/propagator.h"

namespace meshfuse::sharding_propagation {

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
  int64_t moves = 0;  // operands moved, a free slice included (ranked only on request: PlanChoices)
  Cost& operator+=(const Cost& o) {
    collectives = std::min(kInfinite, collectives + o.collectives);
    volume += o.volume;
    moves += o.moves;
    return *this;
  }
};

namespace {

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

// Collectives that take a value from `from` to `to` on one mesh axis: one (an allgather,
// all-to-all, reduce-scatter or allreduce), none for a local slice (Replicate -> Shard). Only a
// whole value becomes a pending sum (Replicate -> Partial: the value on the axis's first device,
// zeros on the others), locally, but it is ranked like a collective: op by op, keeping a sum
// pending through an add of a replicated value only moves its reduction later (a row-parallel
// linear's bias would be partitioned and added before the allreduce, in a kernel of its own,
// rather than after it, fused). The plan search measures what plans send and takes the
// partition where a later reduction is smaller or shared (s1-w2-c98).
int64_t conversionCost(const AxisState& from, const std::optional<AxisState>& to) {
  if (!to.has_value()) return kInfinite;
  if (from == *to) return 0;
  if (from.kind == Placement::Replicate) return to->kind == Placement::Partial ? 1 : 0;
  if (to->kind == Placement::Partial) return kInfinite;
  return 1;
}

template <typename Scored>
bool cheaper(const Scored& x, const Scored& y, const AxisState* pin, bool fewest_moves) {
  if (x.total.collectives != y.total.collectives) return x.total.collectives < y.total.collectives;
  const AxisState &xs = x.choice->state, &ys = y.choice->state;
  const bool pending = xs.kind == Placement::Partial, y_pending = ys.kind == Placement::Partial;
  if (pin == nullptr && pending != y_pending) return y_pending;
  for (auto [a, b] : {std::pair{&x.total.volume, &y.total.volume}, std::pair{&x.before, &y.before}})
    if (std::optional<int> order = compare(*a, *b); order && *order != 0) return *order < 0;
  if (fewest_moves && x.total.moves != y.total.moves) return x.total.moves < y.total.moves;
  return pin != nullptr && xs == *pin && ys != *pin;
}

}  // namespace

// The cheapest of `cands` for e's output on mesh axis `a` (nullopt when none is feasible). With
// `pin` (the user's state of that output on `a`), a candidate also pays for the set after the
// op that makes it the pin. Ties go to a settled value over a pending sum, which costs a
// reduction later (mul(%q, %r) reads the %q another consumer already reduced rather than
// staying Partial: not a concern under a pin, which the set settles), then to less data, then
// to moving less before the op (it computes on its operands as they are and the set moves its
// result: nvFuser's reduce-scatter of a sum over one row per device), then (when a search asks:
// PlanChoices::fewest_moves_on_ties) to moving fewer operands, then to the pin itself (no set),
// then to the first candidate. A search (choices_) may ask for the k-th cheapest
// instead: the feasible candidates are ranked by repeatedly taking the cheapest of the rest.
std::optional<OutputChoice> Propagator::choose(const Expr* e, const ShardingRule& rule, const DeviceMesh& mesh,
                                               int64_t a, const std::vector<OutputChoice>& cands, const AxisState* pin,
                                               const std::vector<OutputChoice>& more) const {
  struct Scored {
    const OutputChoice* choice;
    Cost total;
    Volume before;  // what the operands' moves send
  };
  // The feasible ones of `cands`, then of `more`: each group ranked apart.
  std::vector<Scored> groups[2];
  for (int g = 0; g < 2; ++g) {
    for (const OutputChoice& c : g == 0 ? cands : more) {
      Scored s{&c, candidateCost(e, rule, mesh, c, a), {}};
      s.before = s.total.volume;
      if (pin != nullptr)
        s.total += {conversionCost(c.state, *pin), moveVolume(e->output(), c.state, *pin, mesh.size(a)),
                    c.state == *pin ? 0 : 1};
      if (s.total.collectives < kInfinite) groups[g].push_back(s);
    }
  }
  const size_t feasible = groups[0].size() + groups[1].size();
  const size_t decision = decisions_++;
  size_t rank = 0;
  if (choices_ != nullptr) {
    choices_->candidates.resize(decisions_, 0);
    choices_->candidates[decision] = static_cast<int64_t>(feasible);
    if (e != last_decided_) last_decided_ = e, ++ops_decided_;
    choices_->op.resize(decisions_);
    choices_->op[decision] = ops_decided_;
    if (decision < choices_->take.size() && feasible > 0)
      rank = std::min(static_cast<size_t>(choices_->take[decision]), feasible - 1);
  }
  if (feasible == 0) return std::nullopt;
  for (std::vector<Scored>& group : groups) {
    if (rank >= group.size()) {
      rank -= group.size();
      continue;
    }
    for (size_t taken = 0;; ++taken) {
      auto best = group.begin();
      for (auto it = group.begin() + 1; it != group.end(); ++it)
        if (cheaper(*it, *best, pin, choices_ != nullptr && choices_->fewest_moves_on_ties)) best = it;
      if (taken == rank) return *best->choice;
      group.erase(best);
    }
  }
  return std::nullopt;  // (unreachable: rank < feasible)
}

// The communication that giving every operand what candidate `c` needs on axis `a` costs;
// kInfinite when some operand cannot give it (a scalar added to a pending sum, a dim that does
// not divide). A value read by several operands that need the same state is moved once, and a
// move an earlier decision already makes is free (decomposition shares it between consumers).
Cost Propagator::candidateCost(const Expr* e, const ShardingRule& rule, const DeviceMesh& mesh, const OutputChoice& c,
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
    // A pending sum asked of a split or pending value: nothing makes one (and weighting
    // kInfinite below would overflow).
    if (c1 >= kInfinite) return infeasible;
    // Moving what should stay costs kWeightFactor times more: parameters, or with
    // gather_parameters (FSDP) the activations.
    bool parameter = static_cast<int64_t>(i) == rule.weight_operand && f_.isInput(in);
    if (c1 > 0 && parameter != options_.gather_parameters) c1 *= kWeightFactor;
    cost += {c1, moveVolume(in, from, *req, mesh.size(a)), from == *req ? 0 : 1};
  }
  return cost;
}

}  // namespace meshfuse::sharding_propagation
