// The state of propagate-shardings (contract in propagate_shardings.h), shared by the files that
// implement it: the sweeps and pins (propagate_shardings.cpp), the candidates an op's output may
// take (propagate_shardings_candidates.cpp), what a candidate costs (propagate_shardings_cost.cpp)
// and the rewrites of ops that cannot keep their operands' sharding (propagate_shardings_rewrites.cpp).
// Internal to the pass: nothing outside those files includes it.
#pragma once

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "meshfuse/ir/fusion.h"
#include "meshfuse/options.h"
#include "propagation/propagate_shardings.h"
#include "propagation/required_sharding.h"
#include "propagation/sharding.h"
#include "propagation/sharding_rule.h"

namespace meshfuse::sharding_propagation {

struct Cost;  // what a candidate costs (propagate_shardings_cost.cpp)

struct TvState {
  Sharding sharding;
  std::vector<int64_t> partial_dims;          // per axis: logical reduction index or -1
  std::vector<int64_t> partial_sources;       // per axis: the operand whose pending sum passes through, or -1
  std::vector<std::optional<int64_t>> hints;  // per axis: a dims() index sharded upstream
  std::vector<Provenance> why;                // per axis
};

class Propagator {
 public:
  // `mesh`: the mesh of tensors nothing else decides.
  // `choices`: the candidates a search asks for (null: the cheapest of each decision).
  Propagator(Fusion& f, int64_t mesh, const PropagationOptions& options, SymbolBindings sizes, PlanChoices* choices)
      : f_(f), mesh_index_(mesh), options_(options), sizes_(std::move(sizes)), choices_(choices) {}

  void run();

 private:
  // The sweeps, pins and decisions (propagate_shardings.cpp).
  TvState fresh(int64_t mesh) const;
  void pin(TensorView* tv);
  bool routePinned(Expr* e);
  TensorView* movePinToASetAfter(Expr* e);
  bool forward(bool with_open_inputs);
  bool backward();
  std::set<const TensorView*> openTensors() const;
  bool decidableWithOpen(const Expr* e, const std::set<const TensorView*>& open) const;
  bool producible(const Expr* def, const AxisState& state) const;
  bool operandsDecided(const Expr* e) const;
  OutputChoice outputChoice(const Expr* e, int64_t a) const;
  int64_t meshFor(const Expr* e, const ShardingRule& rule) const;
  bool decide(Expr* e);
  void take(const Expr* e, const ShardingRule& rule, const DeviceMesh& mesh, int64_t a, const OutputChoice& c,
            TvState& s);
  void write();
  void settlePendingSources();
  void materializeOutputs();

  // What an op's output may be on one mesh axis (propagate_shardings_candidates.cpp).
  std::vector<OutputChoice> candidates(const Expr* e, const ShardingRule& rule, const DeviceMesh& mesh,
                                       int64_t a) const;
  std::optional<OutputChoice> carried(const Expr* e, const ShardingRule& rule, size_t i, int64_t d, int64_t n,
                                      const char* how) const;
  std::vector<OutputChoice> searchCandidates(const Expr* e, const ShardingRule& rule, const DeviceMesh& mesh, int64_t a,
                                             const std::vector<OutputChoice>& taken) const;
  std::vector<OutputChoice> alignedWithOtherAxes(const TensorView* tv, const TvState& state, const DeviceMesh& mesh,
                                                 int64_t a, std::vector<OutputChoice> cands) const;
  std::optional<OutputChoice> contextParallel(const Expr* e, const ShardingRule& rule, const DeviceMesh& mesh,
                                              int64_t a) const;
  std::optional<int64_t> hintFor(const Expr* e, const ShardingRule& rule, const DeviceMesh& mesh, int64_t a,
                                 const AxisState& chosen) const;

  // Which candidate is cheapest (propagate_shardings_cost.cpp).
  // `more`: candidates ranked after every one of `cands` (a search's: searchCandidates).
  std::optional<OutputChoice> choose(const Expr* e, const ShardingRule& rule, const DeviceMesh& mesh, int64_t a,
                                     const std::vector<OutputChoice>& cands, const AxisState* pin,
                                     const std::vector<OutputChoice>& more = {}) const;
  Cost candidateCost(const Expr* e, const ShardingRule& rule, const DeviceMesh& mesh, const OutputChoice& c,
                     int64_t a) const;

  // Ops rewritten into ops that can keep their operands' sharding (propagate_shardings_rewrites.cpp).
  bool rewrite(Expr* e);
  bool wouldBePartial(const Expr* e) const;
  void splitBias(Expr* e);
  bool meanOverShardedDim(const Expr* e) const;
  void splitMean(Expr* e);
  void replaceResult(Expr* e, TensorView* replacement);

  // Whether decided `tv`'s mesh axes correspond to those of `mesh` (the same mesh, or a stage of
  // the same shape: data moves between equal coordinates). A tensor on a mesh of another shape
  // says nothing about how an op on `mesh` is sharded: decomposition moves it (a broadcast,
  // scatter, gather or reduce) to whatever sharding the op needs, at the same cost for any.
  bool aligned(const TensorView* tv, const DeviceMesh& mesh) const {
    return f_.mesh(states_.at(tv).sharding.mesh).shape() == mesh.shape();
  }
  bool decided(const TensorView* tv) const { return states_.count(tv) > 0; }
  static TensorView* tensorAt(const Expr* e, size_t i) {
    Val* v = e->inputs()[i];
    return v != nullptr && v->valKind() == ValKind::TensorView ? static_cast<TensorView*>(v) : nullptr;
  }
  static int64_t logicalIndexOfDim(const TensorView* tv, int64_t dim) {
    const IterDomain* id = tv->dims().at(dim);
    return std::find(tv->logical().begin(), tv->logical().end(), id) - tv->logical().begin();
  }
  static int64_t dimIndexOfLogical(const TensorView* tv, int64_t logical) {
    std::vector<IterDomain*> dims = tv->dims();
    return std::find(dims.begin(), dims.end(), tv->logical().at(logical)) - dims.begin();
  }
  // Whether an earlier decision already moves `tv` to `state` on axis `a`.
  bool planned(const TensorView* tv, int64_t a, const AxisState& state) const {
    return std::find(planned_.begin(), planned_.end(), Move{tv, a, state}) != planned_.end();
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
  // The search's requests and the candidate count of each decision so far (choose()).
  PlanChoices* choices_;
  mutable size_t decisions_ = 0;
  // The op the last decision was for, and its number in PlanChoices::op.
  mutable const Expr* last_decided_ = nullptr;
  mutable int64_t ops_decided_ = 0;
};

}  // namespace meshfuse::sharding_propagation
