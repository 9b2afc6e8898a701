// The vector-Jacobian product of every op (include/meshfuse/ir/grad_rules.def), built only from
// existing ops. Reductions, softmax, norms and attention compute in f32 and cast back. This file
// holds the pointwise, reduction and shape rules and the table of every op's rule; the rules of
// softmax, norms, attention, embedding and cross entropy are in grad_rules_nn.cpp.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <numbers>

#include "autodiff/grad_context.h"
#include "autodiff/grad_rules_common.h"
#include "meshfuse/autodiff.h"
#include "meshfuse/ops.h"

namespace meshfuse::autodiff {

// t (rank r - |dims|, the result of reducing `dims` of a rank-r tensor) with size-1 dims put back.
TensorView* unsqueezeReduced(TensorView* t, const std::vector<int64_t>& dims, int64_t r) {
  std::vector<int64_t> shape, bdims;
  for (int64_t d = 0; d < r; ++d) {
    bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
    shape.push_back(reduced ? 1 : -1);
    if (!reduced) bdims.push_back(d);
  }
  return o::broadcastInDim(t, shape, bdims);
}

namespace {

bool isTensor(const Val* v) { return v != nullptr && v->valKind() == ValKind::TensorView; }

// A pointwise operand in the backward fusion: the primal tensor, or the scalar's value.
o::Operand operand(GradContext& c, Val* v) {
  if (isTensor(v)) return c.primal(v);
  return o::Operand(static_cast<const Scalar*>(v)->value());
}

// x's shape as reshape/broadcast_in_dim sizes: a symbolic size is -1 (reshape infers it).
std::vector<int64_t> shapeArg(const TensorView* x) {
  std::vector<int64_t> s;
  for (const Extent& e : x->shape()) s.push_back(e.isStatic() ? e.value() : -1);
  return s;
}

// t (broadcast dims where `like` has extents) expanded to like's shape. Static extents by
// broadcast_in_dim; a symbolic one (a batch ?t) through a where over `like` itself.
TensorView* expandTo(TensorView* t, const std::vector<Extent>& shape, const std::function<TensorView*()>& like) {
  std::vector<int64_t> target;
  bool needs = false, symbolic = false;
  std::vector<IterDomain*> td = t->dims();
  for (size_t d = 0; d < shape.size(); ++d) {
    bool expand = td[d]->isBroadcast() && !(shape[d].isStatic() && shape[d].value() == 1);
    needs |= expand;
    symbolic |= expand && !shape[d].isStatic();
    target.push_back(expand && shape[d].isStatic() ? shape[d].value() : -1);
  }
  if (!needs) return t;
  if (!symbolic) return o::broadcastInDim(t, target, iota(0, static_cast<int64_t>(shape.size())));
  TensorView* l = like();
  return o::where(o::eq(l, l), t, t);
}

// t of rank >= 1 as a matrix [rows, last] (rank-1: one row).
TensorView* asMatrix(TensorView* t) {
  if (t->rank() == 2) return t;
  Extent last = t->shape().back();
  MF_USER_CHECK(last.isStatic(), ErrorKind::Unsupported,
                "autodiff: the last dim of {} is symbolic ({}); a GEMM's weight gradient needs it static",
                t->fusion()->displayName(t), last.toString());
  return o::reshape(t, {-1, last.value()});
}

// -------------------------------------------------------------------------------------------
// Rules. Each returns one entry per e->inputs().

Grads none(GradContext&, const Expr* e, TensorView*) { return Grads(e->inputs().size(), nullptr); }

Grads neg(GradContext&, const Expr*, TensorView* g) { return {o::neg(g)}; }
Grads abs(GradContext& c, const Expr* e, TensorView* g) {
  PRIMAL_X;
  return {o::where(o::gt(x, 0.0), g, o::where(o::lt(x, 0.0), o::neg(g), 0.0))};
}
Grads exp(GradContext& c, const Expr* e, TensorView* g) {
  PRIMAL_Y;
  return {o::mul(g, y)};
}
Grads log(GradContext& c, const Expr* e, TensorView* g) {
  PRIMAL_X;
  return {o::div(g, x)};
}
Grads sqrt(GradContext& c, const Expr* e, TensorView* g) {
  PRIMAL_Y;
  return {o::div(o::mul(g, 0.5), y)};
}
Grads rsqrt(GradContext& c, const Expr* e, TensorView* g) {
  PRIMAL_Y;
  return {o::mul(o::mul(g, -0.5), o::mul(y, o::mul(y, y)))};
}
Grads reciprocal(GradContext& c, const Expr* e, TensorView* g) {
  PRIMAL_Y;
  return {o::neg(o::mul(g, o::mul(y, y)))};
}
Grads tanh(GradContext& c, const Expr* e, TensorView* g) {
  PRIMAL_Y;
  return {o::mul(g, o::sub(1.0, o::mul(y, y)))};
}
Grads sigmoid(GradContext& c, const Expr* e, TensorView* g) {
  PRIMAL_Y;
  return {o::mul(g, o::mul(y, o::sub(1.0, y)))};
}
Grads relu(GradContext& c, const Expr* e, TensorView* g) {
  PRIMAL_Y;
  return {o::where(o::gt(y, 0.0), g, 0.0)};
}
Grads gelu(GradContext& c, const Expr* e, TensorView* g) {
  PRIMAL_X;
  TensorView* xf = f32(x);
  TensorView* d = nullptr;
  if (e->attr<std::string>("approximate") == "tanh") {
    // y = 0.5 x (1 + t), t = tanh(u), u = k (x + a x^3)
    const double k = std::sqrt(2.0 / std::numbers::pi), a = 0.044715;
    TensorView* x2 = o::mul(xf, xf);
    TensorView* t = o::tanh(o::mul(o::add(xf, o::mul(o::mul(x2, xf), a)), k));
    TensorView* du = o::mul(o::add(o::mul(x2, 3 * a), 1.0), k);
    d = o::add(o::mul(o::add(t, 1.0), 0.5), o::mul(o::mul(o::mul(xf, 0.5), o::sub(1.0, o::mul(t, t))), du));
  } else {
    // gelu(x) = x Phi(x): Phi = y / x (0.5 at x = 0), phi(x) = exp(-x^2/2) / sqrt(2 pi)
    TensorView* y = f32(c.primal(e->output()));
    TensorView* phi_cdf = o::where(o::eq(xf, 0.0), 0.5, o::div(y, xf));
    TensorView* pdf = o::mul(o::exp(o::mul(o::mul(xf, xf), -0.5)), 1.0 / std::sqrt(2 * std::numbers::pi));
    d = o::add(phi_cdf, o::mul(xf, pdf));
  }
  return {castTo(o::mul(f32(g), d), g->dtype())};
}
Grads silu(GradContext& c, const Expr* e, TensorView* g) {
  PRIMAL_X;
  TensorView* s = o::sigmoid(x);
  return {o::mul(g, o::mul(s, o::add(1.0, o::mul(x, o::sub(1.0, s)))))};
}

// Binary: operands may be scalars (no gradient).
Grads add(GradContext& c, const Expr*, TensorView* g) { return {c.wants(0) ? g : nullptr, c.wants(1) ? g : nullptr}; }
Grads sub(GradContext& c, const Expr*, TensorView* g) {
  return {c.wants(0) ? g : nullptr, c.wants(1) ? o::neg(g) : nullptr};
}
Grads mul(GradContext& c, const Expr* e, TensorView* g) {
  Val *x = e->input(0), *y = e->input(1);
  return {c.wants(0) ? o::mul(g, operand(c, y)) : nullptr, c.wants(1) ? o::mul(g, operand(c, x)) : nullptr};
}
Grads div(GradContext& c, const Expr* e, TensorView* g) {
  Val* y = e->input(1);
  TensorView* gx = c.wants(0) ? o::div(g, operand(c, y)) : nullptr;
  TensorView* gy = nullptr;
  if (c.wants(1)) gy = o::neg(o::div(o::mul(g, c.primal(e->output())), operand(c, y)));
  return {gx, gy};
}
Grads pow(GradContext& c, const Expr* e, TensorView* g) {
  Val *x = e->input(0), *y = e->input(1);
  TensorView* gx = nullptr;
  TensorView* gy = nullptr;
  if (c.wants(0)) gx = o::mul(g, o::mul(operand(c, y), o::pow(operand(c, x), o::sub(operand(c, y), 1.0))));
  if (c.wants(1)) {
    // torch: 0 where x == 0 (the limit of z log x for a positive exponent)
    TensorView* xt = isTensor(x) ? c.primal(x) : nullptr;
    TensorView* zlog = xt ? o::mul(c.primal(e->output()), o::log(xt))
                          : o::mul(c.primal(e->output()), std::log(static_cast<const Scalar*>(x)->value()));
    gy = o::mul(g, xt ? o::where(o::eq(xt, 0.0), 0.0, zlog) : zlog);
  }
  return {gx, gy};
}
// g goes to the operand that wins (`first_wins` compares x against y), half each on ties.
Grads minmax(GradContext& c, const Expr* e, TensorView* g, bool is_max) {
  o::Operand x = operand(c, e->input(0)), y = operand(c, e->input(1));
  TensorView* win = is_max ? o::gt(x, y) : o::lt(x, y);
  TensorView* tie = o::eq(x, y);
  TensorView* half = o::mul(g, 0.5);
  TensorView* gx = c.wants(0) ? o::where(win, g, o::where(tie, half, 0.0)) : nullptr;
  TensorView* gy = c.wants(1) ? o::where(win, 0.0, o::where(tie, half, g)) : nullptr;
  return {gx, gy};
}
Grads maximum(GradContext& c, const Expr* e, TensorView* g) { return minmax(c, e, g, true); }
Grads minimum(GradContext& c, const Expr* e, TensorView* g) { return minmax(c, e, g, false); }

Grads where(GradContext& c, const Expr* e, TensorView* g) {
  TensorView* cond = c.primal(e->input(0));
  return {nullptr, c.wants(1) ? o::where(cond, g, 0.0) : nullptr, c.wants(2) ? o::where(cond, 0.0, g) : nullptr};
}
Grads cast(GradContext&, const Expr* e, TensorView* g) {
  DataType xt = e->input(0)->dtype();
  return {isFloatingPoint(xt) ? castTo(g, xt) : nullptr};
}
Grads set(GradContext&, const Expr*, TensorView* g) { return {g}; }

// Reductions: g has x's shape without `dims`.
std::vector<int64_t> reducedDims(const Expr* e) {
  int64_t r = tvOf(e->input(0))->rank();
  std::vector<int64_t> dims;
  for (int64_t d : e->attr<std::vector<int64_t>>("dims")) dims.push_back(normalize(d, r));
  return dims;
}
TensorView* expandReduced(GradContext& c, const Expr* e, TensorView* g) {
  const TensorView* x = tvOf(e->input(0));
  return expandTo(unsqueezeReduced(g, reducedDims(e), x->rank()), x->shape(),
                  [&] { return c.primal(e->input(0)); });
}
Grads sum(GradContext& c, const Expr* e, TensorView* g) {
  if (!isFloatingPoint(e->input(0)->dtype())) return {nullptr};
  return {expandReduced(c, e, g)};
}
Grads mean(GradContext& c, const Expr* e, TensorView* g) {
  const TensorView* x = tvOf(e->input(0));
  int64_t n = 1;
  bool symbolic = false;
  for (int64_t d : reducedDims(e)) {
    const Extent ext = x->shape()[d];
    if (ext.isStatic()) n *= ext.value();
    symbolic |= !ext.isStatic();
  }
  TensorView* gf = f32(g);
  if (symbolic) {  // the count is known at run time only: sum a tensor of ones over the dims
    TensorView* ones = filledLike(c.primal(e->input(0)), 1.0, DataType::Float);
    gf = o::div(gf, o::sum(ones, reducedDims(e)));
  } else {
    gf = o::mul(gf, 1.0 / static_cast<double>(n));
  }
  return {castTo(expandReduced(c, e, gf), g->dtype())};
}
Grads max(GradContext& c, const Expr* e, TensorView* g) {
  if (!isFloatingPoint(e->input(0)->dtype())) return {nullptr};
  PRIMAL_X;
  PRIMAL_Y;
  std::vector<int64_t> dims = reducedDims(e);
  TensorView* mask = o::cast(o::eq(x, unsqueezeReduced(y, dims, x->rank())), DataType::Float);
  TensorView* share = o::div(f32(g), o::sum(mask, dims));
  return {castTo(o::mul(mask, unsqueezeReduced(share, dims, x->rank())), g->dtype())};
}

// y[..., n] = x[..., k] W[n, k]^T + b[n]
Grads linear(GradContext& c, const Expr* e, TensorView* g) {
  const TensorView* xf = tvOf(e->input(0));
  TensorView* gx = c.wants(0) ? o::linear(g, o::permute(c.primal(e->input(1)), {1, 0})) : nullptr;
  TensorView* gw = c.wants(1) ? o::matmul(o::permute(asMatrix(g), {1, 0}), asMatrix(c.primal(e->input(0)))) : nullptr;
  TensorView* gb = nullptr;
  if (e->input("bias") != nullptr && c.wants(2))
    gb = xf->rank() == 1 ? g : castTo(o::sum(f32(g), iota(0, g->rank() - 1)), g->dtype());
  return {gx, gw, gb};
}
// y[..., m, n] = a[..., m, k] @ b[..., k, n]   (b rank 2, or a's rank)
Grads matmul(GradContext& c, const Expr* e, TensorView* g) {
  TensorView* ga = c.wants(0) ? o::matmul(g, transposeLast(c.primal(e->input(1)))) : nullptr;
  TensorView* gb = nullptr;
  if (c.wants(1)) {
    TensorView* a = c.primal(e->input(0));
    if (tvOf(e->input(1))->rank() == a->rank())
      gb = o::matmul(transposeLast(a), g);
    else  // b is shared by every batch entry: merge a's batch dims into the rows
      gb = o::matmul(o::permute(asMatrix(a), {1, 0}), asMatrix(g));
  }
  return {ga, gb};
}

Grads broadcastInDim(GradContext&, const Expr* e, TensorView* g) {
  const TensorView* x = tvOf(e->input(0));
  const auto& bdims = e->attr<std::vector<int64_t>>("broadcast_dims");
  std::vector<IterDomain*> xd = x->dims(), od = e->output()->dims();
  std::vector<int64_t> reduce;
  std::vector<bool> expanded(xd.size(), false);
  for (int64_t d = 0; d < static_cast<int64_t>(od.size()); ++d) {
    auto it = std::find(bdims.begin(), bdims.end(), d);
    if (it == bdims.end()) {
      reduce.push_back(d);
      continue;
    }
    size_t i = static_cast<size_t>(it - bdims.begin());
    if (xd[i]->isBroadcast() && !od[d]->isBroadcast()) {
      expanded[i] = true;
      reduce.push_back(d);
    }
  }
  if (reduce.empty()) return {g};
  TensorView* s = castTo(o::sum(f32(g), reduce), g->dtype());
  std::vector<int64_t> shape, keep;
  for (size_t i = 0; i < xd.size(); ++i) {
    shape.push_back(expanded[i] ? 1 : -1);
    if (!expanded[i]) keep.push_back(static_cast<int64_t>(i));
  }
  return {o::broadcastInDim(s, shape, keep)};
}
Grads reshape(GradContext&, const Expr* e, TensorView* g) { return {o::reshape(g, shapeArg(tvOf(e->input(0))))}; }
Grads permute(GradContext&, const Expr* e, TensorView* g) {
  const auto& dims = e->attr<std::vector<int64_t>>("dims");
  int64_t r = static_cast<int64_t>(dims.size());
  std::vector<int64_t> inv(dims.size());
  for (int64_t i = 0; i < r; ++i) inv[normalize(dims[i], r)] = i;
  return {o::permute(g, inv)};
}

// Zeros shaped like t except `size` along `dim` (t's extent there must be static and >= 1).
TensorView* zerosAlong(TensorView* t, int64_t dim, int64_t size) {
  std::vector<int64_t> starts, ends, shape;
  std::vector<Extent> s = t->shape();
  for (int64_t d = 0; d < t->rank(); ++d) {
    starts.push_back(0);
    ends.push_back(d == dim ? 1 : (s[d].isStatic() ? s[d].value() : -1));
    shape.push_back(d == dim ? size : -1);
  }
  TensorView* one = o::slice(t, starts, ends);
  return o::broadcastInDim(filledLike(one, 0.0, t->dtype()), shape, iota(0, t->rank()));
}
Grads slice(GradContext&, const Expr* e, TensorView* g) {
  const TensorView* x = tvOf(e->input(0));
  const auto& starts = e->attr<std::vector<int64_t>>("starts");
  const auto& ends = e->attr<std::vector<int64_t>>("ends");
  std::vector<Extent> xs = x->shape();
  TensorView* cur = g;
  for (int64_t d = 0; d < x->rank(); ++d) {
    if (!xs[d].isStatic()) continue;  // symbolic dims are taken whole
    int64_t before = starts[d], after = xs[d].value() - ends[d];
    if (before == 0 && after == 0) continue;
    MF_USER_CHECK(starts[d] < ends[d], ErrorKind::Unsupported,
                  "autodiff: slice of {} is empty along dim {}; its gradient (all zeros) is not supported",
                  x->fusion()->displayName(x), d);
    std::vector<TensorView*> parts;
    if (before > 0) parts.push_back(zerosAlong(cur, d, before));
    parts.push_back(cur);
    if (after > 0) parts.push_back(zerosAlong(cur, d, after));
    cur = o::cat(parts, d);
  }
  return {cur};
}
Grads cat(GradContext& c, const Expr* e, TensorView* g) {
  int64_t r = g->rank();
  int64_t dim = normalize(e->attr<int64_t>("dim"), r);
  Grads out;
  int64_t offset = 0;
  std::vector<Extent> gs = g->shape();
  for (Val* v : e->inputs()) {
    int64_t n = tvOf(v)->shape()[dim].value();
    std::vector<int64_t> starts, ends;
    for (int64_t d = 0; d < r; ++d) {
      starts.push_back(d == dim ? offset : 0);
      ends.push_back(d == dim ? offset + n : (gs[d].isStatic() ? gs[d].value() : -1));
    }
    out.push_back(c.wants(out.size()) ? o::slice(g, starts, ends) : nullptr);
    offset += n;
  }
  return out;
}
#undef PRIMAL_X
#undef PRIMAL_Y

// ---- the table, checked against ops.def at compile time ------------------------------------
constexpr OpKind kOpOrder[] = {
#define MESHFUSE_OP(e, name, cat, operands, attrs) OpKind::e,
#include "meshfuse/ir/ops.def"
#undef MESHFUSE_OP
};
constexpr OpKind kRuleOrder[] = {
#define MESHFUSE_GRAD(e, rule, formula) OpKind::e,
#include "meshfuse/ir/grad_rules.def"
#undef MESHFUSE_GRAD
};
constexpr bool sameOps() {
  for (size_t i = 0; i < std::size(kOpOrder); ++i)
    if (kOpOrder[i] != kRuleOrder[i]) return false;
  return true;
}
static_assert(std::size(kOpOrder) == std::size(kRuleOrder),
              "an op of ops.def has no gradient rule: add its MESHFUSE_GRAD line to grad_rules.def");
static_assert(sameOps(), "grad_rules.def must list the ops of ops.def in the same order, one rule each");

constexpr GradRule kRules[] = {
#define MESHFUSE_GRAD(e, rule, formula) &rule,
#include "meshfuse/ir/grad_rules.def"
#undef MESHFUSE_GRAD
};

}  // namespace

GradRule gradRuleOf(OpKind kind) { return kRules[static_cast<size_t>(kind)]; }

TensorView* filledLike(TensorView* like, double value, DataType dtype) {
  return castTo(o::where(o::eq(like, like), value, value), dtype);
}

TensorView* fitGradient(TensorView* g, const TensorView* x) {
  std::vector<IterDomain*> xd = x->dims(), gd = g->dims();
  MF_CHECK(xd.size() == gd.size(), "gradient of rank {} for {} of rank {}", gd.size(), x->fusion()->displayName(x),
           xd.size());
  std::vector<int64_t> dims;
  for (size_t d = 0; d < xd.size(); ++d)
    if (xd[d]->isBroadcast() && !gd[d]->isBroadcast()) dims.push_back(static_cast<int64_t>(d));
  if (!dims.empty()) g = o::sum(f32(g), dims, /*keepdim=*/true);
  return castTo(g, x->dtype());
}

}  // namespace meshfuse::autodiff

namespace meshfuse {

const std::vector<GradientRuleInfo>& gradientRules() {
  static const std::vector<GradientRuleInfo> rules = {
#define MESHFUSE_GRAD(e, rule, formula) {opInfo(OpKind::e).name, #rule, formula},
#include "meshfuse/ir/grad_rules.def"
#undef MESHFUSE_GRAD
  };
  return rules;
}

}  // namespace meshfuse
