// The vector-Jacobian products of softmax, log_softmax, the norms, attention (sdpa, sdpa_lse;
// sdpa_grad's expansion attentionGradients()), embedding and cross entropy: the ops that compute
// in f32 and cast back, apart from the pointwise, reduction and shape rules of grad_rules.cpp
// (whose table names these, through grad_rules_common.h).
#include <cmath>
#include <optional>

#include "autodiff/attention_gradients.h"
#include "autodiff/grad_context.h"
#include "autodiff/grad_rules_common.h"
#include "meshfuse/ops.h"

namespace meshfuse::autodiff {
namespace {

// dx = y (g - sum(g y)) along dim, in f32.
TensorView* softmaxBackward(TensorView* y, TensorView* g, int64_t dim) {
  TensorView* yf = f32(y);
  TensorView* gf = f32(g);
  return o::mul(yf, o::sub(gf, sumKeep(o::mul(gf, yf), dim)));
}

// A [D] parameter as a rank-r tensor [1, ..., 1, D] that broadcasts against x.
TensorView* lastDimParam(TensorView* p, int64_t r) {
  std::vector<int64_t> shape(r, 1);
  shape.back() = -1;
  return o::broadcastInDim(p, shape, {r - 1});
}
// Shared by layer_norm and rms_norm (centered: layer_norm).
Grads norm(GradContext& c, const Expr* e, TensorView* g, bool centered) {
  PRIMAL_X;
  int64_t r = x->rank(), last = r - 1;
  double eps = e->attr<double>("eps");
  TensorView* xf = f32(x);
  TensorView* gf = f32(g);
  TensorView* xc = centered ? o::sub(xf, meanKeep(xf, last)) : xf;
  TensorView* rstd = o::rsqrt(o::add(meanKeep(o::mul(xc, xc), last), eps));
  TensorView* xhat = o::mul(xc, rstd);
  Val* wv = e->input("weight");
  TensorView* inner = nullptr;
  if (c.wants(0)) {
    TensorView* gh = wv ? o::mul(gf, lastDimParam(f32(c.primal(wv)), r)) : gf;
    inner = o::sub(gh, o::mul(xhat, meanKeep(o::mul(gh, xhat), last)));
    if (centered) inner = o::sub(inner, meanKeep(gh, last));
  }
  Grads out{c.wants(0) ? castTo(o::mul(rstd, inner), x->dtype()) : nullptr};
  std::vector<int64_t> lead = iota(0, last);
  auto paramGrad = [&](TensorView* t) { return castTo(lead.empty() ? t : o::sum(t, lead), x->dtype()); };
  out.push_back(wv && c.wants(1) ? paramGrad(o::mul(gf, xhat)) : nullptr);
  if (centered) out.push_back(e->input("bias") && c.wants(2) ? paramGrad(gf) : nullptr);
  return out;
}

// The causal mask of scores [b, h, L, S] (true where key j > query i), without an iota op: a 0/1
// pattern P of length W = L + S (1 at positions 1..S-1) tiled into [L, W], flattened and re-read
// with row stride W - 1, so that element (i, j) reads P[(j - i) mod W] (see docs/training.md).
// It is built from q's [b, h, 0:1, 0:1] corner, so it keeps q's batch/head sharding: no
// communication. Sequence lengths must be static.
TensorView* causalMask(TensorView* q, int64_t L, int64_t S) {
  std::vector<Extent> qs = q->shape();
  auto whole = [&](int64_t d) { return qs[d].isStatic() ? qs[d].value() : -1; };
  TensorView* corner = filledLike(o::slice(q, {0, 0, 0, 0}, {whole(0), whole(1), 1, 1}), 0.0, DataType::Float);
  auto run = [&](double v, int64_t n) {
    return o::broadcastInDim(o::add(corner, v), {-1, -1, 1, n}, {0, 1, 2, 3});  // [b, h, 1, n]
  };
  std::vector<TensorView*> parts{run(0.0, 1)};
  if (S > 1) parts.push_back(run(1.0, S - 1));
  parts.push_back(run(0.0, L));
  const int64_t W = L + S;
  // [b, h] keep their sizes through the reshapes (-1: a symbolic batch; attentionScale checked
  // that one of them is static).
  int64_t b = qs[0].isStatic() ? qs[0].value() : -1, h = qs[1].isStatic() ? qs[1].value() : -1;
  TensorView* p = o::broadcastInDim(o::cat(parts, 3), {-1, -1, L, W}, {0, 1, 2, 3});
  TensorView* flat = o::reshape(p, {b, h, L * W});
  TensorView* shifted = o::reshape(o::slice(flat, {0, 0, 0}, {whole(0), whole(1), L * (W - 1)}), {b, h, L, W - 1});
  return o::gt(o::slice(shifted, {0, 0, 0, 0}, {whole(0), whole(1), L, S}), 0.5);
}
// The scale of sdpa/sdpa_lse/sdpa_grad `e`: its attribute, or 1/sqrt(head size) for the default 0.
// Unsupported where the composite gradient cannot be built (checked when the rule runs, so that
// differentiate() says so, not the compilation of the backward).
double attentionScale(const Expr* e, const TensorView* q, const TensorView* k) {
  double scale = e->attr<double>("scale");
  if (scale == 0) {
    Extent head = q->shape()[3];
    MF_USER_CHECK(head.isStatic(), ErrorKind::Unsupported,
                  "autodiff: {} with a symbolic head size ({}) needs an explicit scale", e->name(), head.toString());
    scale = 1.0 / std::sqrt(static_cast<double>(head.value()));
  }
  if (e->attr<bool>("is_causal")) {
    Extent L = q->shape()[2], S = k->shape()[2];
    MF_USER_CHECK(L.isStatic() && S.isStatic(), ErrorKind::Unsupported,
                  "autodiff: causal {} needs static sequence lengths, got {} and {}", e->name(), L.toString(),
                  S.toString());
    MF_USER_CHECK(q->shape()[0].isStatic() || q->shape()[1].isStatic(), ErrorKind::Unsupported,
                  "autodiff: causal sdpa with symbolic batch and head sizes is not supported");
  }
  return scale;
}
// The attention probabilities P = softmax(scale q k^T (+ causal mask)) in f32, recomputed from q
// and k (f32 casts of the primals).
TensorView* attentionScores(TensorView* q, TensorView* k, bool causal, double scale) {
  TensorView* scores = o::mul(o::matmul(q, transposeLast(k)), scale);
  if (causal) scores = o::where(causalMask(q, q->shape()[2].value(), k->shape()[2].value()), -1e30, scores);
  return scores;
}
TensorView* attentionProbs(TensorView* q, TensorView* k, bool causal, double scale) {
  return o::softmax(attentionScores(q, k, causal, scale), 3);
}

}  // namespace

Grads softmax(GradContext& c, const Expr* e, TensorView* g) {
  PRIMAL_Y;
  return {castTo(softmaxBackward(y, g, normalize(e->attr<int64_t>("dim"), y->rank())), g->dtype())};
}

// y = x - logsumexp(x): dx = g - exp(y) sum(g) along dim, in f32.
Grads logSoftmax(GradContext& c, const Expr* e, TensorView* g) {
  PRIMAL_Y;
  const int64_t dim = normalize(e->attr<int64_t>("dim"), y->rank());
  TensorView* gf = f32(g);
  return {castTo(o::sub(gf, o::mul(o::exp(f32(y)), sumKeep(gf, dim))), g->dtype())};
}

Grads layerNorm(GradContext& c, const Expr* e, TensorView* g) { return norm(c, e, g, true); }
Grads rmsNorm(GradContext& c, const Expr* e, TensorView* g) { return norm(c, e, g, false); }

// The gradients of sdpa are first-class ops (sdpa_grad: attention's sharding rule, so that
// sequence-sharded attention trains as Ulysses, or with its sequences split: ring attention);
// expand-attention-gradients later rewrites those whose sequences are whole with
// attentionGradients() below. Each gets the forward's log-sum-exp (recomputed: the forward does
// not keep it) and delta = rowsum(g o) from the saved output, which make its rows independent.
Grads sdpa(GradContext& c, const Expr* e, TensorView* g) {
  TensorView* q = c.primal(e->input(0));
  TensorView* k = c.primal(e->input(1));
  attentionScale(e, q, k);  // refuses now what the expansion could not build
  const double scale = e->attr<double>("scale");
  const std::optional<double> given = scale == 0 ? std::nullopt : std::optional<double>(scale);
  const bool causal = e->attr<bool>("is_causal");
  PRIMAL_Y;
  TensorView* lse = o::sdpaLse(q, k, causal, given);
  TensorView* delta = o::sum(o::mul(f32(y), f32(g)), {3});
  Grads out(3, nullptr);
  const char* names[] = {"query", "key", "value"};
  for (size_t i = 0; i < 3; ++i)
    if (c.wants(i)) out[i] = o::sdpaGrad(q, k, c.primal(e->input(2)), g, names[i], causal, given, lse, delta);
  return out;
}
Grads sdpaGrad(GradContext&, const Expr* e, TensorView*) {
  userError(ErrorKind::Unsupported, "autodiff: {} (the gradient of attention) cannot be differentiated again",
            e->name());
}
// lse_i = log sum_j exp(s_ij): d lse_i / d s_ij = P_ij, so dS = g_i P_ij (times scale for q, k).
Grads sdpaLse(GradContext& c, const Expr* e, TensorView* g) {
  TensorView* q = f32(c.primal(e->input(0)));
  TensorView* k = f32(c.primal(e->input(1)));
  const double scale = attentionScale(e, q, k);
  TensorView* p = attentionProbs(q, k, e->attr<bool>("is_causal"), scale);
  // g [b, h, L] as [b, h, L, 1]: broadcast along P's rows.
  TensorView* gs = o::mul(o::mul(p, unsqueezeReduced(f32(g), {3}, 4)), scale);
  DataType dt = e->input(0)->dtype();
  Grads out(2, nullptr);
  if (c.wants(0)) out[0] = castTo(o::matmul(gs, k), dt);
  if (c.wants(1)) out[1] = castTo(o::matmul(transposeLast(gs), q), dt);
  return out;
}

// y[i..., h] = W[idx[i...], h]: dW = the scatter-add of g into W's rows (accumulated in f32).
Grads embedding(GradContext& c, const Expr* e, TensorView* g) {
  const TensorView* w = tvOf(e->input(0));
  if (!c.wants(0)) return {nullptr, nullptr};
  const Extent rows = w->shape()[w->rank() - 2];
  MF_USER_CHECK(rows.isStatic(), ErrorKind::Unsupported,
                "autodiff: the gradient of embedding table {} needs its number of rows static, not {}",
                w->fusion()->displayName(w), rows.toString());
  return {o::embeddingBackward(g, c.primal(e->input(1)), rows.value(), w->rank() == 3), nullptr};
}
// Linear in grad: its gradient reads the rows back (an embedding of the table's gradient).
Grads embeddingBackward(GradContext& c, const Expr* e, TensorView* g) {
  if (!c.wants(0)) return {nullptr, nullptr};
  return {o::embedding(g, c.primal(e->input(1))), nullptr};
}
// loss_i = logsumexp(x_i) - x_i[t_i] (0 where t_i is ignored): dx_i = (softmax(x_i) - onehot(t_i))
// times g_i ("none"), g ("sum") or g / count ("mean"), 0 where ignored; in f32.
Grads crossEntropy(GradContext& c, const Expr* e, TensorView* g) {
  if (!c.wants(0)) return {nullptr, nullptr};
  TensorView* x = c.primal(e->input(0));
  TensorView* t = c.primal(e->input(1));
  const int64_t r = x->rank(), cd = r >= 2 ? 1 : 0, rt = t->rank();
  const Extent classes = x->shape()[cd];
  MF_USER_CHECK(classes.isStatic(), ErrorKind::Unsupported,
                "autodiff: cross_entropy over a symbolic number of classes ({}) is not supported", classes.toString());
  const std::string& reduction = e->attr<std::string>("reduction");
  TensorView* p = o::softmax(f32(x), cd);
  TensorView* onehot = o::cast(o::oneHot(t, classes.value()), DataType::Float);  // [t..., C]
  if (r >= 3) {
    // the class dim back to 1
    std::vector<int64_t> perm{0, r - 1};
    for (int64_t d = 1; d < r - 1; ++d) perm.push_back(d);
    onehot = o::permute(onehot, perm);
  }
  TensorView* w = o::cast(o::ne(t, e->attr<int64_t>("ignore_index")), DataType::Float);  // [t...]: 1 if counted
  TensorView* gf = f32(g);
  if (reduction == "none") {
    w = o::mul(w, gf);
  } else {
    if (reduction == "mean") gf = o::div(gf, rt == 0 ? w : o::sum(w, iota(0, rt)));
    w = o::mul(w, rt == 0 ? gf : o::broadcastInDim(gf, std::vector<int64_t>(rt, 1), {}));
  }
  std::vector<int64_t> shape, keep;  // w with a size-1 class dim
  for (int64_t d = 0; d < r; ++d) {
    shape.push_back(d == cd ? 1 : -1);
    if (d != cd) keep.push_back(d);
  }
  TensorView* gx = o::mul(o::sub(p, onehot), o::broadcastInDim(w, shape, keep));
  return {castTo(gx, x->dtype()), nullptr};
}

AttentionGradients attentionGradients(const Expr* sdpa_grad, TensorView* q, TensorView* k, TensorView* v, TensorView* g,
                                      TensorView* lse, TensorView* delta, bool want_q, bool want_k, bool want_v) {
  const DataType dt = q->dtype();
  const double scale = attentionScale(sdpa_grad, q, k);
  const bool causal = sdpa_grad->attr<bool>("is_causal");
  TensorView *qf = f32(q), *kf = f32(k), *gf = f32(g);
  // P = exp(scores - lse) with the forward's lse (masked scores -1e30 give 0), else a softmax.
  TensorView* p = lse != nullptr ? o::exp(o::sub(attentionScores(qf, kf, causal, scale), unsqueezeReduced(lse, {3}, 4)))
                                 : attentionProbs(qf, kf, causal, scale);
  AttentionGradients out;
  if (want_v) out.dv = castTo(o::matmul(transposeLast(p), gf), dt);
  if (want_q || want_k) {
    TensorView* gp = o::matmul(gf, transposeLast(f32(v)));
    // dS = P (dP - rowsum(dP P)) scale, the row sum being delta when given.
    TensorView* gs = delta != nullptr ? o::mul(o::mul(p, o::sub(gp, unsqueezeReduced(delta, {3}, 4))), scale)
                                      : o::mul(softmaxBackward(p, gp, 3), scale);
    if (want_q) out.dq = castTo(o::matmul(gs, kf), dt);
    if (want_k) out.dk = castTo(o::matmul(transposeLast(gs), qf), dt);
  }
  return out;
}

#undef PRIMAL_X
#undef PRIMAL_Y

}  // namespace meshfuse::autodiff
