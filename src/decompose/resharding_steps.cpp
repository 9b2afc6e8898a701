// The resharding planner (see resharding_steps.h).
#include "decompose/resharding_steps.h"

#include <map>
#include <optional>

#include "meshfuse/ir/fusion.h"

namespace meshfuse {

std::vector<Sharding> reshardingSteps(const Sharding& from, const Sharding& to) {
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

class Planner {
 public:
  Planner(Fusion& f, const Sharding& from) : f_(f), cur_(from) {}

  // The per-axis steps to `target` on the current mesh.
  void onMesh(const Sharding& target) {
    Sharding t = target;
    t.mesh = cur_.mesh;
    for (const Sharding& next : reshardingSteps(cur_, t)) {
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
  Sharding cur_;
  std::vector<ReshardingStep> steps_;
};

}  // namespace

std::vector<ReshardingStep> planResharding(Fusion& f, const Sharding& from, const Sharding& to,
                                           const std::string& name) {
  Planner p(f, from);
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
  int64_t global = dtypeSize(tv->dtype());
  for (const IterDomain* id : tv->dims()) {
    if (!id->extent().isStatic()) return std::nullopt;
    global *= id->extent().value();
  }
  const DeviceMesh& mesh = f.mesh(from.mesh);
  const int64_t ranks = mesh.size();
  int64_t total = 0;
  Sharding at = from;
  for (const Sharding& next : reshardingSteps(from, to)) {
    for (size_t a = 0; a < at.axes.size(); ++a) {
      const Placement &x = at.axes[a], &y = next.axes[a];
      const int64_t n = mesh.size(static_cast<int64_t>(a));
      if (x == y || x.kind == Placement::Replicate || n == 1) continue;  // (a slice, or nothing)
      int64_t held = global;  // what each rank holds: the value split by every axis sharding it
      for (size_t b = 0; b < at.axes.size(); ++b)
        if (at.axes[b].kind == Placement::Shard) held /= mesh.size(static_cast<int64_t>(b));
      // Per rank, times `ranks` (which n divides).
      const int64_t factor = x.kind == Placement::Shard && y.kind == Placement::Replicate ? (n - 1) * ranks
                             : x.kind == Placement::Partial && y.kind == Placement::Replicate
                                 ? 2 * (n - 1) * (ranks / n)
                                 : (n - 1) * (ranks / n);
      total += ranks * factor * held;
    }
    at = next;
  }
  return total;
}

}  // namespace meshfuse
