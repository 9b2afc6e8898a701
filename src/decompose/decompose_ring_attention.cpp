// decompose-ring-attention (contract in decompose_ring_attention.h).
#include "decompose/decompose_ring_attention.h"

#include <algorithm>

#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/placement.h"
#include "meshfuse/ops.h"
#include "propagation/context_parallel.h"
#include "propagation/sharding.h"
#include "propagation/sharding_rule.h"

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

const TensorView* operandAt(const Expr* e, size_t i) {
  const Val* v = i < e->inputs().size() ? e->inputs()[i] : nullptr;
  return v != nullptr && v->valKind() == ValKind::TensorView ? static_cast<const TensorView*>(v) : nullptr;
}

// Whether `e` can be a ring: sdpa, sdpa_lse, or sdpa_grad with its lse and delta.
bool ringOp(const Expr* e) {
  return e->kind() == OpKind::Sdpa || e->kind() == OpKind::SdpaLse ||
         (e->kind() == OpKind::SdpaGrad && e->input("lse") != nullptr);
}

// The mesh axis along which the operands `e` needs whole along the sequence (its rule's
// unmapped dim 2: k and v of sdpa, the other side's blocks of sdpa_grad) can rotate, or -1:
// each is a set all-gathering the sequence along that axis, and every other operand and the
// output are split along the sequence there, in blocks of one size.
int64_t ringAxis(const Expr* e) {
  if (!ringOp(e)) return -1;
  const ShardingRule rule = shardingRuleOf(e);
  int64_t axis = -1;
  std::vector<const TensorView*> own = {e->output()};
  for (size_t i = 0; i < e->inputs().size(); ++i) {
    const TensorView* t = operandAt(e, i);
    if (t == nullptr) continue;
    if (rule.operand_maps[i].at(kSeq) == kSeq) {
      own.push_back(t);
      continue;
    }
    const int64_t a = gathersSequence(t->definition());
    if (a < 0 || (axis >= 0 && a != axis)) return -1;
    // A set another kind of op reads too (a softmax of the keys) stays one allgather for both.
    for (const Expr* u : t->uses())
      if (!ringOp(u)) return -1;
    axis = a;
  }
  if (axis < 0 || e->output()->mesh()->size(axis) == 1) return -1;
  for (const TensorView* t : own)
    if (t->mesh() == nullptr || *t->mesh() != *e->output()->mesh() || placementsOf(t)[axis] != Placement::shard(kSeq))
      return -1;
  // The ring rotates blocks of one size: a sequence its mesh axes do not divide (torch.chunk's
  // uneven blocks) stays gathered.
  const std::vector<Placement> ps = placementsOf(e->output());
  int64_t split = 1;
  for (size_t b = 0; b < ps.size(); ++b)
    if (ps[b] == Placement::shard(kSeq)) split *= e->output()->mesh()->size(static_cast<int64_t>(b));
  for (size_t i = 0; i < e->inputs().size(); ++i)
    if (const TensorView* t = operandAt(e, i); t != nullptr && !t->shape()[kSeq].divisible(split)) return -1;
  return axis;
}

// Sequence chunks of the ring: one per device, or (causal) two per device, which balances the
// work, unless the sizes are static and a device's query or key rows do not split in two.
int64_t chunksOf(const Expr* attention, int64_t devices) {
  if (!attention->attr<bool>("is_causal")) return devices;
  for (size_t operand : {size_t{0}, size_t{1}}) {  // the query, the key
    // A copy: shape() returns its extents by value.
    const Extent seq = static_cast<const TensorView*>(attention->input(operand))->shape()[kSeq];
    if (seq.isStatic() && !seq.divisible(2 * devices)) return devices;
  }
  return 2 * devices;
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

// Marks the sets `e` reads whole to rotate; a set that other ops read too is copied for `e`
// first (each ring rotates its own blocks: the set becomes its loop's send/recv steps).
void rotate(Fusion& f, Expr* e, int64_t axis) {
  const int64_t n = e->output()->mesh()->size(axis);
  const int64_t chunks = chunksOf(e, n);
  const ShardingRule rule = shardingRuleOf(e);
  for (size_t i = 0; i < e->inputs().size(); ++i) {
    auto* t = const_cast<TensorView*>(operandAt(e, i));
    if (t == nullptr || rule.operand_maps[i].at(kSeq) == kSeq) continue;
    const bool shared = std::any_of(t->uses().begin(), t->uses().end(),
                                    [&](const Expr* u) { return u != e && !keyValueGradientPair(u, e); });
    if (shared || f.isOutput(t)) {
      f.setInsertionPoint(e);
      TensorView* own = ops::set(static_cast<TensorView*>(t->definition()->input(size_t{0})));
      f.setInsertionPoint(nullptr);
      writeSharding(own, readSharding(t));
      own->setPinned(false);
      f.replaceOperand(e, t, own);
      t = own;
    }
    Expr* set = t->definition();
    f.setAttribute(set, "overlap", std::string("ring"));
    f.setAttribute(set, "chunks", chunks);
    set->output()->setProvenance(
        {fmt::format("ring attention: {{}} {} every block of {{}}, which rotates around mesh axis {} ({} "
                     "send/recv steps to the next rank)",
                     e->kind() == OpKind::SdpaGrad ? "needs" : "attends", axis, n - 1),
         {e->output(), set->input(size_t{0})}});
  }
  if (e->kind() == OpKind::Sdpa) addLse(f, e, n);
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
    if (e->kind() == OpKind::Sdpa) completeMarkedRing(f, e);  // (whatever `option` says: the input states that ring)
    if (!keysRotate(option)) continue;
    if (const int64_t axis = ringAxis(e); axis >= 0) rotate(f, e, axis);
  }
}

bool keyValueGradientPair(const Expr* a, const Expr* b) {
  if (a->kind() != OpKind::SdpaGrad || b->kind() != OpKind::SdpaGrad || a->inputs() != b->inputs()) return false;
  const std::string &wa = a->attr<std::string>("wrt"), &wb = b->attr<std::string>("wrt");
  return ((wa == "key" && wb == "value") || (wa == "value" && wb == "key")) &&
         a->attr<bool>("is_causal") == b->attr<bool>("is_causal") &&
         a->attr<double>("scale") == b->attr<double>("scale");
}

const Expr* ringAttentionOf(const Expr* set) {
  if (set->kind() != OpKind::Set || set->attr<std::string>("overlap") != "ring") return nullptr;
  for (const Expr* u : set->output()->uses())
    if (u->info().category == OpCategory::Attention) return u;
  return nullptr;
}

}  // namespace meshfuse
