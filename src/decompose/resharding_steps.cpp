// The resharding planner (see resharding_steps.h).
#include "decompose/resharding_steps.h"

#include <algorithm>
#include <map>
#include <optional>
#include <queue>
#include <set>
#include <tuple>

#include "meshfuse/ir/fusion.h"

namespace meshfuse {
namespace {

// The order of steps the rules above give (take away inner axes first, add outer axes first),
// whatever the mesh's sizes.
std::vector<Sharding> nestingOrder(const Sharding& from, const Sharding& to) {
  const size_t n = from.axes.size();
  auto sharded = [](const Placement& p, int64_t d) { return p.kind == Placement::Shard && p.dim == d; };
  // For each dim, the outermost axis whose split of it changes (n: none).
  std::map<int64_t, size_t> outermost_change;
  for (size_t a = n; a-- > 0;) {
    if (from.axes[a] == to.axes[a]) continue;
    if (from.axes[a].kind == Placement::Shard) outermost_change[from.axes[a].dim] = a;
    if (to.axes[a].kind == Placement::Shard) outermost_change[to.axes[a].dim] = a;
  }
  // A split of dim d on axis a must go when it changes, or when a split of d outside it (on an
  // outer axis) changes: the new outer split has to wrap it.
  auto mustRemove = [&](size_t a) {
    const Placement& f = from.axes[a];
    if (f.kind != Placement::Shard) return false;
    auto it = outermost_change.find(f.dim);
    return f != to.axes[a] || (it != outermost_change.end() && it->second < a);
  };
  // Whether axis a's Shard(x) -> Shard(y) can be one all-to-all: no other axis splits x or y.
  auto directAllToAll = [&](size_t a) {
    const Placement &f = from.axes[a], &t = to.axes[a];
    if (f.kind != Placement::Shard || t.kind != Placement::Shard || f.dim == t.dim) return false;
    for (size_t b = 0; b < n; ++b) {
      if (b == a) continue;
      for (const Sharding* s : {&from, &to})
        if (sharded(s->axes[b], f.dim) || sharded(s->axes[b], t.dim)) return false;
    }
    return true;
  };
  std::vector<Sharding> steps;
  Sharding cur = from;
  auto step = [&](size_t a, const Placement& p) {
    cur.axes[a] = p;
    steps.push_back(cur);
  };
  // Otherwise axis a's Shard(x) -> Shard(y) is still one all-to-all, made now (before the outer
  // axes change), when its blocks are the innermost split of x and of y: no inner axis splits x
  // or y at this point, and no outer axis's split of y changes later (it would have to wrap a's
  // new split, or be gathered from under it). This is the 2-D hybrid of context parallelism:
  // [Shard(s), Shard(s)] -> [Shard(s), Shard(h)] is an all-to-all over the inner axis, within the
  // outer axis's block of the sequence.
  auto innerAllToAll = [&](size_t a) {
    const Placement &f = cur.axes[a], &t = to.axes[a];
    if (f.kind != Placement::Shard || t.kind != Placement::Shard || f.dim == t.dim || directAllToAll(a)) return false;
    for (size_t b = a + 1; b < n; ++b)
      if (sharded(cur.axes[b], f.dim) || sharded(cur.axes[b], t.dim)) return false;
    for (size_t b = 0; b < a; ++b)
      if (sharded(cur.axes[b], t.dim) != sharded(to.axes[b], t.dim)) return false;
    return true;
  };
  // Take away, inner axes first.
  for (size_t i = n; i-- > 0;) {
    const Placement &f = from.axes[i], &t = to.axes[i];
    bool changes = f != t;
    if (changes && innerAllToAll(i)) {
      step(i, t);
    } else if (mustRemove(i) && !(changes && directAllToAll(i))) {
      step(i, Placement::replicate());
    } else if (f.kind == Placement::Partial && t.kind == Placement::Replicate) {
      step(i, Placement::replicate());
    }
  }
  // Add, outer axes first.
  for (size_t a = 0; a < n; ++a)
    if (cur.axes[a] != to.axes[a]) step(a, to.axes[a]);
  return steps;
}

// A way's measures: its collectives first (the documented priority), then what it sends summed
// over the ranks (stepCost's units: wireBytes' for a value of one byte).
struct WayCost {
  int64_t collectives = 0;
  int64_t bytes = 0;
};

// How ways rank: by collectives, then bytes (the default), or by bytes, then collectives.
struct WayOrder {
  bool by_bytes = false;
  bool operator()(const WayCost& x, const WayCost& y) const {
    return by_bytes ? std::tie(x.bytes, x.collectives) < std::tie(y.bytes, y.collectives)
                    : std::tie(x.collectives, x.bytes) < std::tie(y.collectives, y.bytes);
  }
};

// What the ranks hold of a value sharded `s` on a mesh of `sizes`, summed over them, in values:
// torch.chunk's blocks of a dim partition it however uneven, so that is the whole value once per
// replica (each axis that does not split it: a pending sum is held whole on each rank).
int64_t replicas(const Sharding& s, const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (size_t a = 0; a < sizes.size(); ++a)
    if (s.axes[a].kind != Placement::Shard) n *= sizes[a];
  return n;
}

// What the step on axis a from `cur` to `next` (which differ there only) sends per element a
// rank holds, times the device count N: as ring algorithms send on a team of n devices, an
// allgather (n-1) N (to each other member), an allreduce 2 (n-1) N/n, a reduce-scatter or an
// all-to-all (n-1) N/n; a slice or a local Partial nothing. The placement fuzzer's oracle counts
// the same (wireBytesTimesN).
int64_t perHeldElement(const Placement& from, const Placement& to, int64_t n, int64_t ranks) {
  if (from == to || from.kind == Placement::Replicate || n == 1) return 0;
  if (from.kind == Placement::Shard && to.kind == Placement::Replicate) return (n - 1) * ranks;
  if (from.kind == Placement::Partial && to.kind == Placement::Replicate) return 2 * (n - 1) * (ranks / n);
  return (n - 1) * (ranks / n);
}

// The step on axis a from `cur` to `next` (which differ there only): one collective, whose
// bytes are perHeldElement times what the ranks hold, in values (the value's size is the same
// for every step of a conversion, so it does not change which way is cheapest); a slice or a
// local Partial nothing.
WayCost stepCost(const Sharding& cur, const Sharding& next, size_t a, const std::vector<int64_t>& sizes) {
  int64_t ranks = 1;
  for (int64_t n : sizes) ranks *= n;
  const int64_t k = perHeldElement(cur.axes[a], next.axes[a], sizes[a], ranks);
  if (k == 0) return {};
  return {1, k * replicas(cur, sizes)};
}

// Whether the step on axis a is one collective or slice: a split it takes away or adds is the
// innermost split of its dim (blocks would interleave otherwise: resharding_steps.h), and a
// pending sum is neither made from a split nor made where the target has none.
bool oneStep(const Sharding& cur, const Sharding& next, size_t a, const Sharding& to) {
  const Placement &f = cur.axes[a], &g = next.axes[a];
  auto splitInside = [&](const Placement& p) {
    if (p.kind != Placement::Shard) return false;
    for (size_t b = a + 1; b < cur.axes.size(); ++b)
      if (cur.axes[b] == p) return true;
    return false;
  };
  if (splitInside(f) || splitInside(g)) return false;
  if (g.kind == Placement::Partial) return f.kind == Placement::Replicate && to.axes[a] == g;
  return true;
}

// The cheapest way in `order` over every order of one-axis steps through placements of the
// dims `from` and `to` shard, and `also` (Dijkstra over a few dozen shardings); nullopt when no
// such order exists.
std::optional<std::pair<WayCost, std::vector<Sharding>>> cheapestWay(const Sharding& from, const Sharding& to,
                                                                     const std::vector<int64_t>& sizes,
                                                                     WayOrder order,
                                                                     const std::vector<Placement>& also) {
  const size_t n = from.axes.size();
  std::vector<Placement> values = {Placement::replicate()};
  for (const Sharding* s : {&from, &to})
    for (const Placement& p : s->axes)
      if (p.kind == Placement::Shard && std::find(values.begin(), values.end(), p) == values.end()) values.push_back(p);
  for (const Placement& p : also)
    if (std::find(values.begin(), values.end(), p) == values.end()) values.push_back(p);
  auto key = [](const Sharding& s) {
    std::vector<std::pair<int, int64_t>> k;
    for (const Placement& p : s.axes) k.emplace_back(static_cast<int>(p.kind), p.dim);
    return k;
  };
  using Key = std::vector<std::pair<int, int64_t>>;
  std::map<Key, std::pair<WayCost, std::vector<Sharding>>> best;
  using Item = std::pair<WayCost, Key>;
  auto later = [order](const Item& x, const Item& y) { return order(y.first, x.first); };
  std::priority_queue<Item, std::vector<Item>, decltype(later)> open(later);
  best[key(from)] = {WayCost{}, {}};
  open.push({WayCost{}, key(from)});
  std::set<Key> done;
  while (!open.empty()) {
    const Key k = open.top().second;
    open.pop();
    if (!done.insert(k).second) continue;
    const auto [cost, way] = best.at(k);
    const Sharding cur = way.empty() ? from : way.back();
    if (cur.axes == to.axes) return best.at(k);
    for (size_t a = 0; a < n; ++a) {
      std::vector<Placement> options = values;
      for (const Sharding* s : {&from, &to})
        if (s->axes[a].kind == Placement::Partial) options.push_back(s->axes[a]);
      for (const Placement& p : options) {
        if (p == cur.axes[a] || (cur.axes[a].kind == Placement::Partial && p.kind == Placement::Partial)) continue;
        if (cur.axes[a].kind == Placement::Shard && p.kind == Placement::Partial) continue;
        Sharding next = cur;
        next.axes[a] = p;
        if (!oneStep(cur, next, a, to)) continue;
        const WayCost step = stepCost(cur, next, a, sizes);
        const WayCost total{cost.collectives + step.collectives, cost.bytes + step.bytes};
        const Key nk = key(next);
        auto it = best.find(nk);
        if (it != best.end() && !order(total, it->second.first)) continue;
        std::vector<Sharding> longer = way;
        longer.push_back(next);
        best[nk] = {total, std::move(longer)};
        open.push({total, nk});
      }
    }
  }
  return std::nullopt;
}

}  // namespace

std::vector<Sharding> reshardingSteps(const Sharding& from, const Sharding& to, const std::vector<int64_t>& sizes,
                                      bool by_bytes, const std::vector<int64_t>& extents) {
  std::vector<Sharding> steps = nestingOrder(from, to);
  if (sizes.size() != from.axes.size() || from.axes.size() < 2) return steps;
  // The nesting order is always possible but may send more than another order: gathering a
  // split and slicing it elsewhere where one all-to-all after the inner axes are gathered would
  // do, or an allreduce of a pending sum on values the other axes have not split yet. The
  // cheaper way is taken, the nesting order where they tie.
  WayCost nesting;
  Sharding at = from;
  for (const Sharding& next : steps) {
    size_t a = 0;
    while (next.axes[a] == at.axes[a]) ++a;
    const WayCost step = stepCost(at, next, a, sizes);
    nesting.collectives += step.collectives, nesting.bytes += step.bytes;
    at = next;
  }
  const WayOrder order{by_bytes};
  // By bytes, a pending sum may be reduce-scattered along a dim neither side splits, so that it
  // travels reduced (a dim with a block for every device of any axis).
  std::vector<Placement> also;
  if (by_bytes) {
    const int64_t widest = *std::max_element(sizes.begin(), sizes.end());
    for (size_t d = 0; d < extents.size(); ++d)
      if (extents[d] >= widest) also.push_back(Placement::shard(static_cast<int64_t>(d)));
  }
  std::optional<std::pair<WayCost, std::vector<Sharding>>> cheapest =
      cheapestWay(from, to, sizes, order, also);
  if (cheapest && order(cheapest->first, nesting)) {
    return cheapest->second;
  }
  return steps;
}

namespace {

Sharding replicated(int64_t mesh, int64_t axes) { return {mesh, std::vector<AxisState>(axes, Placement::replicate())}; }

// The axis a scatter from one device over `mesh` can give `to` along: Shard on that axis, which
// is the mesh's only axis of more than one device, and Replicate on every other.
std::optional<size_t> scatterAxis(const DeviceMesh& mesh, const Sharding& to) {
  std::optional<size_t> axis;
  for (size_t a = 0; a < to.axes.size(); ++a) {
    if (to.axes[a].kind == Placement::Replicate) continue;
    if (to.axes[a].kind != Placement::Shard || axis.has_value()) return std::nullopt;
    axis = a;
  }
  for (size_t a = 0; a < to.axes.size(); ++a)
    if (axis.has_value() && a != *axis && mesh.size(static_cast<int64_t>(a)) > 1) return std::nullopt;
  return axis;
}

// The extents of `tv` where they are all static; empty otherwise (reshardingSteps' `extents`).
std::vector<int64_t> staticExtents(const TensorView* tv) {
  std::vector<int64_t> out;
  for (const IterDomain* id : tv->dims()) {
    if (!id->extent().isStatic()) return {};
    out.push_back(id->extent().value());
  }
  return out;
}

class Planner {
 public:
  Planner(Fusion& f, const TensorView* value, const Sharding& from)
      : f_(f), extents_(value != nullptr ? staticExtents(value) : std::vector<int64_t>{}), cur_(from) {}

  // The per-axis steps to `target` on the current mesh.
  void onMesh(const Sharding& target) {
    Sharding t = target;
    t.mesh = cur_.mesh;
    for (const Sharding& next : reshardingSteps(cur_, t, f_.mesh(cur_.mesh).shape(), f_.reshardByBytes(), extents_)) {
      size_t a = 0;
      while (next.axes[a] == cur_.axes[a]) ++a;
      add(next, fmt::format("{} -> {} on mesh axis {}", cur_.axes[a].toString(), next.axes[a].toString(), a));
    }
  }
  // One step to `next`; `what` may name the current stage ({0}) and the next ({1}).
  void move(const Sharding& next, const std::string& what) {
    add(next, fmt::format(fmt::runtime(what), stage(cur_.mesh), stage(next.mesh)));
  }
  // A single-device mesh of `device` with the shape of mesh `like` (so that a same-shape stage
  // move joins it to that mesh).
  int64_t hop(int64_t device, int64_t like) { return f_.addMesh(DeviceMesh({device}, f_.mesh(like).shape())); }

  const Sharding& current() const { return cur_; }
  std::vector<ReshardingStep> take() { return std::move(steps_); }

 private:
  void add(const Sharding& next, std::string what) {
    steps_.push_back({next, std::move(what)});
    cur_ = next;
  }
  std::string stage(int64_t mesh) const { return f_.mesh(mesh).toString(); }

  Fusion& f_;
  std::vector<int64_t> extents_;  // the value's (reshardingSteps' intermediate splits by bytes)
  Sharding cur_;
  std::vector<ReshardingStep> steps_;
};

}  // namespace

std::vector<ReshardingStep> planResharding(Fusion& f, const TensorView* value, const Sharding& from, const Sharding& to,
                                           const std::string& name) {
  Planner p(f, value, from);
  const DeviceMesh& a = f.mesh(from.mesh);
  const DeviceMesh& b = f.mesh(to.mesh);
  if (from.mesh == to.mesh || a.shape() == b.shape()) {
    p.onMesh(to);
    if (from.mesh != to.mesh) p.move(to, "moved from stage {} to stage {}");
    return p.take();
  }
  const Sharding whole = replicated(to.mesh, b.rank());
  if (a.size() == 1) {
    // The value is whole on its device (axes of size 1 shard nothing: local copies).
    p.onMesh(replicated(from.mesh, a.rank()));
    if (!b.contains(a.devices()[0]))
      p.move({p.hop(b.devices()[0], from.mesh), p.current().axes}, "moved from stage {} to stage {}");
    if (scatterAxis(b, to).has_value()) {
      p.move(to, "scattered from stage {} over stage {}");
    } else {
      p.move(whole, "broadcast from stage {} to stage {}");
      p.onMesh(to);
    }
    return p.take();
  }
  MF_USER_CHECK(b.size() == 1, ErrorKind::Unsupported,
                "{}: cannot move from {} on mesh {} to {} on mesh {}: between meshes of different shapes a value "
                "moves only to or from a single device (gather or reduce to it, broadcast or scatter from it)",
                name, toString(from), a.toString(), toString(to), b.toString());
  const int64_t root = b.devices()[0];
  // Only the outermost axis that splits the value over several devices is left to the rooted
  // collective (inner splits go first, which the per-axis planner does plainly); replicas along
  // the other axes stay out of its team.
  std::optional<size_t> keep;
  for (size_t i = 0; i < from.axes.size() && !keep; ++i)
    if (from.axes[i].kind != Placement::Replicate && a.size(static_cast<int64_t>(i)) > 1) keep = i;
  Sharding rooted = replicated(from.mesh, a.rank());
  if (keep) rooted.axes[*keep] = from.axes[*keep];
  p.onMesh(rooted);
  if (!keep) {
    // One copy is enough: from the root itself, else from the first device.
    p.move(whole, a.contains(root) ? "copied from stage {} to stage {}" : "sent from stage {} to stage {}");
  } else {
    const std::string how = from.axes[*keep].kind == Placement::Partial ? "reduced" : "gathered";
    if (a.contains(root)) {
      p.move(whole, how + " from stage {} to stage {}");
    } else {
      p.move({p.hop(a.devices()[0], to.mesh), whole.axes}, how + " from stage {} to stage {}");
      p.move(whole, "moved from stage {} to stage {}");
    }
  }
  p.onMesh(to);
  return p.take();
}

std::optional<int64_t> wireBytes(const Fusion& f, const TensorView* tv, const Sharding& from, const Sharding& to) {
  if (from.mesh != to.mesh) return std::nullopt;
  for (size_t a = 0; a < to.axes.size(); ++a)
    if (to.axes[a].kind == Placement::Partial && from.axes[a] != to.axes[a] &&
        from.axes[a].kind != Placement::Replicate)
      return std::nullopt;
  const std::vector<int64_t> extents = staticExtents(tv);
  if (extents.empty() && tv->rank() > 0) return std::nullopt;
  int64_t numel = 1;
  for (int64_t e : extents) numel *= e;
  const std::vector<int64_t>& sizes = f.mesh(from.mesh).shape();
  const int64_t ranks = f.mesh(from.mesh).size();
  int64_t total = 0;
  Sharding at = from;
  for (const Sharding& next : reshardingSteps(from, to, sizes, f.reshardByBytes(), extents)) {
    for (size_t a = 0; a < at.axes.size(); ++a)
      if (const int64_t k = perHeldElement(at.axes[a], next.axes[a], sizes[a], ranks); k > 0)
        total += k * replicas(at, sizes) * numel * dtypeSize(tv->dtype());
    at = next;
  }
  return total;
}

}  // namespace meshfuse
