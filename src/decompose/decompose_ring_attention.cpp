// decompose-ring-attention (contract in decompose_ring_attention.h).
#include "decompose/decompose_ring_attention.h"

#include <algorithm>

#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/placement.h"
#include "meshfuse/ops.h"
#include "propagation/context_parallel.h"
#include "propagation/sharding.h"

namespace meshfuse {
namespace {

constexpr int64_t kSeq = 2;  // attention's operands: [batch, heads, seq, e]

// The one mesh axis along which `set` all-gathers the sequence (Shard(2) -> Replicate, and
// nothing else changes), or -1.
int64_t gathersSequence(const Expr* set, const std::string& overlap = "none") {
  if (set == nullptr || set->kind() != OpKind::Set || set->attr<std::string>("overlap") != overlap) return -1;
  const Sharding from = readSharding(static_cast<const TensorView*>(set->input(size_t{0})));
  const Sharding to = readSharding(set->output());
  if (!from.decided() || !to.decided() || from.mesh != to.mesh) return -1;
  int64_t axis = -1;
  for (size_t a = 0; a < to.axes.size(); ++a) {
    if (from.axes[a] == to.axes[a]) continue;
    if (axis >= 0 || from.axes[a] != Placement::shard(kSeq) || to.axes[a].kind != Placement::Replicate) return -1;
    axis = static_cast<int64_t>(a);
  }
  return axis;
}

// Whether `tv` is read by `sdpa` alone (as key, value or both).
bool onlyReadBy(const Fusion& f, const TensorView* tv, const Expr* sdpa) {
  const auto& uses = tv->uses();
  return !f.isOutput(tv) && std::all_of(uses.begin(), uses.end(), [&](const Expr* u) { return u == sdpa; });
}

// The mesh axis whose ring `sdpa`'s keys and values can rotate around, or -1.
int64_t ringAxis(const Fusion& f, const Expr* sdpa) {
  const auto* key = static_cast<const TensorView*>(sdpa->input(size_t{1}));
  const auto* value = static_cast<const TensorView*>(sdpa->input(size_t{2}));
  const int64_t a = gathersSequence(key->definition());
  if (a < 0 || gathersSequence(value->definition()) != a || sdpa->output()->mesh()->size(a) == 1) return -1;
  if (!onlyReadBy(f, key, sdpa) || !onlyReadBy(f, value, sdpa)) return -1;
  const auto* query = static_cast<const TensorView*>(sdpa->input(size_t{0}));
  for (const TensorView* t : {query, static_cast<const TensorView*>(sdpa->output())})
    if (t->mesh() == nullptr || *t->mesh() != *sdpa->output()->mesh() || placementsOf(t)[a] != Placement::shard(kSeq))
      return -1;
  // The ring rotates blocks of one size: a sequence its mesh axes do not divide (torch.chunk's
  // uneven blocks) stays gathered.
  int64_t split = 1;
  const std::vector<Placement> ps = placementsOf(query);
  for (size_t b = 0; b < ps.size(); ++b)
    if (ps[b] == Placement::shard(kSeq)) split *= query->mesh()->size(static_cast<int64_t>(b));
  if (!query->shape()[kSeq].divisible(split)) return -1;
  return a;
}

// Sequence chunks of the ring: one per device, or (causal) two per device, which balances the
// work, unless the sizes are static and a device's rows do not split in two.
int64_t chunksOf(const Expr* sdpa, int64_t devices) {
  if (!sdpa->attr<bool>("is_causal")) return devices;
  // A copy: shape() returns its extents by value.
  const Extent seq = static_cast<const TensorView*>(sdpa->input(size_t{0}))->shape()[kSeq];
  return seq.isStatic() && !seq.divisible(2 * devices) ? devices : 2 * devices;
}

// Adds the sdpa_lse of `sdpa`'s query and key right after it, sharded like its output: the
// f32 log-sum-exp its `n` ring steps merge their partial outputs by.
void addLse(Fusion& f, Expr* sdpa, int64_t n) {
  auto* query = static_cast<TensorView*>(sdpa->input(size_t{0}));
  auto* key = static_cast<TensorView*>(sdpa->input(size_t{1}));
  const double scale = sdpa->attr<double>("scale");
  auto next = std::find(f.exprs().begin(), f.exprs().end(), sdpa) + 1;
  f.setInsertionPoint(next == f.exprs().end() ? nullptr : *next);
  TensorView* lse = ops::sdpaLse(query, key, sdpa->attr<bool>("is_causal"),
                                 scale == 0 ? std::nullopt : std::optional<double>(scale));
  f.setInsertionPoint(nullptr);
  writeSharding(lse, readSharding(sdpa->output()));
  lse->setPinned(false);
  lse->setProvenance({fmt::format("ring attention: the log-sum-exp {{}}'s {} steps merge their partial outputs by", n),
                      {sdpa->output()}});
}

void rotate(Fusion& f, Expr* sdpa, int64_t axis) {
  const int64_t n = sdpa->output()->mesh()->size(axis), chunks = chunksOf(sdpa, n);
  for (size_t i : {size_t{1}, size_t{2}}) {
    Expr* set = sdpa->input(i)->definition();
    f.setAttribute(set, "overlap", std::string("ring"));
    f.setAttribute(set, "chunks", chunks);
    set->output()->setProvenance(
        {fmt::format("ring attention: {{}} attends every block of {{}}, which rotates around mesh axis {} ({} "
                     "send/recv steps to the next rank)",
                     axis, n - 1),
         {sdpa->output(), set->input(size_t{0})}});
  }
  addLse(f, sdpa, n);
}

// Whether an sdpa_lse of `sdpa`'s query and key exists (the statistic its steps merge by).
bool hasLse(const Expr* sdpa) {
  for (const Expr* u : sdpa->input(size_t{0})->uses())
    if (u->kind() == OpKind::SdpaLse && u->input(size_t{1}) == sdpa->input(size_t{1})) return true;
  return false;
}

// A ring written in the input (sets marked overlap="ring" by hand, as this pass writes them):
// dead-code-elimination dropped its sdpa_lse, which no output reads; it is made again.
void completeMarkedRing(Fusion& f, Expr* sdpa) {
  const int64_t axis = gathersSequence(sdpa->input(size_t{1})->definition(), "ring");
  if (axis < 0 || ringAttentionOf(sdpa->input(size_t{1})->definition()) != sdpa || hasLse(sdpa)) return;
  addLse(f, sdpa, sdpa->output()->mesh()->size(axis));
}

}  // namespace

void decomposeRingAttention(Fusion& f, ContextParallel option) {
  const std::vector<Expr*> exprs = f.exprs();  // (rotate inserts ops)
  for (Expr* e : exprs) {
    if (e->kind() != OpKind::Sdpa) continue;
    completeMarkedRing(f, e);  // (whatever `option` says: the input states that ring)
    if (!keysRotate(option)) continue;
    if (const int64_t axis = ringAxis(f, e); axis >= 0) rotate(f, e, axis);
  }
}

const Expr* ringAttentionOf(const Expr* set) {
  if (set->kind() != OpKind::Set || set->attr<std::string>("overlap") != "ring") return nullptr;
  for (const Expr* u : set->output()->uses())
    if (u->kind() == OpKind::Sdpa) return u;
  return nullptr;
}

}  // namespace meshfuse
