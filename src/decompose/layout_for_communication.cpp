// layout-for-communication (contract in layout_for_communication.h).
#include "decompose/layout_for_communication.h"

#include <algorithm>

#include "meshfuse/ir/fusion.h"
#include "meshfuse/ops.h"
#include "propagation/sharding.h"

namespace meshfuse {
namespace {

// The dims() index a resharding `set` exchanges blocks along, when it is an allgather
// (Shard(d) -> Replicate), a reduce-scatter (Partial -> Shard(d)), or between meshes of
// different shapes a gather (Shard(d) on the source mesh, one device after) or a scatter (one
// device before, Shard(d) on the target mesh); else -1.
int64_t exchangedDim(const Expr* e) {
  // A ring attention's keys and values rotate as whole local blocks (decompose-ring-attention).
  if (e->kind() != OpKind::Set || e->attr<std::string>("overlap") != "none") return -1;
  const auto* in = static_cast<const TensorView*>(e->input(size_t{0}));
  Sharding from = readSharding(in), to = readSharding(e->output());
  if (!from.decided() || !to.decided()) return -1;
  if (from.mesh != to.mesh) {
    const DeviceMesh &a = *in->mesh(), &b = *e->output()->mesh();
    if (a.shape() == b.shape()) return -1;  // a send/recv of whole local blocks
    // decompose-reshardings leaves at most one Shard on the side with several devices.
    const std::vector<AxisState>& spread = a.size() == 1 ? to.axes : from.axes;
    for (const Placement& p : spread)
      if (p.kind == Placement::Shard) return p.dim;
    return -1;
  }
  for (size_t a = 0; a < to.axes.size(); ++a) {
    const Placement& f = from.axes[a];
    const Placement& t = to.axes[a];
    if (f == t) continue;
    if (f.kind == Placement::Shard && t.kind == Placement::Replicate) return f.dim;
    if (f.kind == Placement::Partial && t.kind == Placement::Shard) return t.dim;
    return -1;
  }
  return -1;
}

// Whether the blocks along dim `d` of `tv` are contiguous: every dim before it has size 1.
bool outermost(const TensorView* tv, int64_t d) {
  std::vector<Extent> shape = tv->shape();
  for (int64_t i = 0; i < d; ++i)
    if (!shape[i].isStatic() || shape[i].value() != 1) return false;
  return true;
}

// `sharding` with each Shard dim renumbered through `perm` (out dim j = in dim perm[j]).
Sharding permuted(Sharding s, const std::vector<int64_t>& perm) {
  for (Placement& p : s.axes)
    if (p.kind == Placement::Shard) p.dim = std::find(perm.begin(), perm.end(), p.dim) - perm.begin();
  return s;
}

TensorView* permuteWith(TensorView* x, const std::vector<int64_t>& perm, const Sharding& sharding,
                        const Provenance& why) {
  TensorView* y = ops::permute(x, perm);
  writeSharding(y, sharding);
  y->setPinned(false);
  y->setProvenance(why);
  return y;
}

void rewrite(Fusion& f, Expr* e, int64_t d) {
  auto* in = static_cast<TensorView*>(e->input(size_t{0}));
  TensorView* out = e->output();
  const int64_t rank = out->rank();
  std::vector<int64_t> to_front = {d}, back(rank);
  for (int64_t i = 0; i < rank; ++i)
    if (i != d) to_front.push_back(i);
  for (int64_t j = 0; j < rank; ++j) back[to_front[j]] = j;
  Sharding from = readSharding(in), to = readSharding(out);
  f.setInsertionPoint(e);
  TensorView* front = permuteWith(
      in, to_front, permuted(from, to_front),
      {fmt::format("layout-for-communication: dim {} of {{}} moved outermost so the collective's blocks are contiguous",
                   d),
       {in}});
  TensorView* moved = ops::set(front);
  writeSharding(moved, permuted(to, to_front));
  moved->setPinned(false);
  TensorView* restored = permuteWith(
      moved, back, to,
      {fmt::format("layout-for-communication: dim 0 of {{}} moved back to dim {} after the collective", d), {moved}});
  // The collective keeps the reason of the set it replaces (a pinned set's: the user's pin).
  moved->setProvenance(out->pinned() ? pinnedProvenance(out) : out->provenanceNote());
  f.setInsertionPoint(nullptr);
  std::string name = out->name();
  bool pinned = out->pinned();
  f.replaceAllUses(out, restored);
  f.removeExpr(e);
  if (!name.empty()) {
    f.rename(out, "");
    f.rename(restored, name);
  }
  if (pinned) restored->setPinned(true);
  redirectProvenance(f, out, restored);
}

}  // namespace

void layoutForCommunication(Fusion& f) {
  std::vector<Expr*> exprs = f.exprs();
  for (Expr* e : exprs) {
    int64_t d = exchangedDim(e);
    if (d > 0 && !outermost(e->output(), d)) rewrite(f, e, d);
  }
}

}  // namespace meshfuse
