// What the gradient rules of grad_rules.cpp (pointwise, reductions, shapes, the table of every
// op's rule) and grad_rules_nn.cpp (softmax, norms, attention, embedding, cross entropy) share:
// the small builders both use, and the rules of grad_rules_nn.cpp the table names. src/autodiff
// only.
#pragma once

#include <utility>
#include <vector>

#include "autodiff/grad_context.h"
#include "meshfuse/ops.h"

namespace meshfuse::autodiff {

using Grads = std::vector<TensorView*>;
namespace o = ops;

inline TensorView* f32(TensorView* t) { return t->dtype() == DataType::Float ? t : o::cast(t, DataType::Float); }
inline TensorView* castTo(TensorView* t, DataType dt) { return t->dtype() == dt ? t : o::cast(t, dt); }
inline const TensorView* tvOf(const Val* v) { return static_cast<const TensorView*>(v); }

inline std::vector<int64_t> iota(int64_t from, int64_t to) {
  std::vector<int64_t> v;
  for (int64_t i = from; i < to; ++i) v.push_back(i);
  return v;
}

inline int64_t normalize(int64_t d, int64_t r) { return d < 0 ? d + r : d; }

// mean over `dim` of t, keeping it as a size-1 dim (f32 in, f32 out).
inline TensorView* meanKeep(TensorView* t, int64_t dim) { return o::mean(t, {dim}, /*keepdim=*/true); }
inline TensorView* sumKeep(TensorView* t, int64_t dim) { return o::sum(t, {dim}, /*keepdim=*/true); }

// Swaps the last two dims.
inline TensorView* transposeLast(TensorView* t) {
  std::vector<int64_t> p = iota(0, t->rank());
  std::swap(p[p.size() - 1], p[p.size() - 2]);
  return o::permute(t, p);
}

// t (rank r - |dims|, the result of reducing `dims` of a rank-r tensor) with size-1 dims put back.
TensorView* unsqueezeReduced(TensorView* t, const std::vector<int64_t>& dims, int64_t r);

// A rule's primal operand x and output y in the backward fusion (each rule file #undefs them).
#define PRIMAL_X TensorView* x = c.primal(e->input(size_t{0}))
#define PRIMAL_Y TensorView* y = c.primal(e->output())

// The rules of grad_rules_nn.cpp. Each returns one entry per e->inputs().
Grads softmax(GradContext& c, const Expr* e, TensorView* g);
Grads logSoftmax(GradContext& c, const Expr* e, TensorView* g);
Grads layerNorm(GradContext& c, const Expr* e, TensorView* g);
Grads rmsNorm(GradContext& c, const Expr* e, TensorView* g);
Grads sdpa(GradContext& c, const Expr* e, TensorView* g);
Grads sdpaGrad(GradContext& c, const Expr* e, TensorView* g);
Grads sdpaLse(GradContext& c, const Expr* e, TensorView* g);
Grads embedding(GradContext& c, const Expr* e, TensorView* g);
Grads embeddingBackward(GradContext& c, const Expr* e, TensorView* g);
Grads crossEntropy(GradContext& c, const Expr* e, TensorView* g);

}  // namespace meshfuse::autodiff
