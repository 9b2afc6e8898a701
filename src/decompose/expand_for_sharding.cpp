// expand-for-sharding (contract in expand_for_sharding.h).
#include "decompose/expand_for_sharding.h"

#include "meshfuse/ir/device_mesh.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/placement.h"
#include "meshfuse/ops.h"

namespace meshfuse {
namespace {

std::vector<int64_t> iota(int64_t from, int64_t to) {
  std::vector<int64_t> v;
  for (int64_t i = from; i < to; ++i) v.push_back(i);
  return v;
}

// Makes every reader of `old` (the output list too) read `now`, which takes over old's name and
// the placement the user pinned on it, then removes old's op.
void replaceWith(Fusion& f, TensorView* old, TensorView* now) {
  f.replaceAllUses(old, now);
  if (old->pinned() && old->mesh() != nullptr) applyPlacements(now, *old->mesh(), placementsOf(old));
  std::string name = old->name();
  f.rename(old, "");
  f.rename(now, name);
  f.removeExpr(old->definition());
}

void expandMeanCrossEntropy(Fusion& f, Expr* e) {
  auto* x = static_cast<TensorView*>(e->input(size_t{0}));
  auto* t = static_cast<TensorView*>(e->input(size_t{1}));
  const int64_t ignore = e->attr<int64_t>("ignore_index");
  f.setInsertionPoint(e);
  TensorView* total = ops::crossEntropy(x, t, ignore, "sum");
  TensorView* counted = ops::cast(ops::ne(t, ignore), DataType::Float);
  TensorView* count = t->rank() == 0 ? counted : ops::sum(counted, iota(0, t->rank()));
  TensorView* mean = ops::div(total, count);
  f.setInsertionPoint(nullptr);
  replaceWith(f, e->output(), mean);
}

// The mesh axis a fusion-input table is row-sharded on (Shard(0) on exactly one axis), or -1.
int64_t rowShardedAxis(const Fusion& f, const TensorView* w) {
  if (!f.isInput(w) || w->mesh() == nullptr || w->rank() != 2 || !w->shape()[0].isStatic()) return -1;
  const std::vector<Placement> ps = placementsOf(w);
  int64_t axis = -1;
  for (size_t a = 0; a < ps.size(); ++a) {
    if (ps[a].kind != Placement::Shard || ps[a].dim != 0) continue;
    if (axis >= 0) return -1;  // split over several axes: left to the plain op (gathered)
    axis = static_cast<int64_t>(a);
  }
  if (axis < 0 || w->mesh()->size(axis) == 1) return -1;
  return w->shape()[0].value() % w->mesh()->size(axis) == 0 ? axis : -1;
}

void expandVocabParallelEmbedding(Fusion& f, Expr* e, int64_t axis) {
  auto* w = static_cast<TensorView*>(e->input(size_t{0}));
  auto* idx = static_cast<TensorView*>(e->input(size_t{1}));
  const int64_t n = w->mesh()->size(axis), v = w->shape()[0].value(), block = v / n;
  const Extent h = w->shape()[1];
  const int64_t r = idx->rank();
  f.setInsertionPoint(e);
  TensorView* blocks = ops::reshape(w, {n, block, h.isStatic() ? h.value() : -1});
  std::vector<int64_t> one_more(r + 1, -1);  // the indices with a leading size-1 dim
  one_more[0] = 1;
  std::vector<TensorView*> shifted;
  for (int64_t k = 0; k < n; ++k) {
    TensorView* s = k == 0 ? idx : ops::sub(idx, k * block);
    shifted.push_back(ops::broadcastInDim(s, one_more, iota(1, r + 1)));
  }
  TensorView* grouped = ops::embedding(blocks, ops::cat(shifted, 0));
  TensorView* y = ops::sum(grouped, {0});
  f.setInsertionPoint(nullptr);
  replaceWith(f, e->output(), y);
}

}  // namespace

void expandForSharding(Fusion& f) {
  std::vector<Expr*> exprs = f.exprs();
  for (Expr* e : exprs) {
    if (e->kind() == OpKind::CrossEntropy && e->attr<std::string>("reduction") == "mean") {
      expandMeanCrossEntropy(f, e);
    } else if (e->kind() == OpKind::Embedding) {
      const int64_t axis = rowShardedAxis(f, static_cast<const TensorView*>(e->input(size_t{0})));
      if (axis >= 0) expandVocabParallelEmbedding(f, e, axis);
    }
  }
}

}  // namespace meshfuse
