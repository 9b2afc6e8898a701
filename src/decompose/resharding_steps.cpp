// The resharding planner (see resharding_steps.h).
#include "decompose/resharding_steps.h"

#include <map>

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
  // Take away, inner axes first.
  for (size_t i = n; i-- > 0;) {
    const Placement &f = from.axes[i], &t = to.axes[i];
    bool changes = f != t;
    if (mustRemove(i) && !(changes && directAllToAll(i))) {
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

}  // namespace meshfuse
