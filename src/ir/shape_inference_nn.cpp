// Shape inference (shape_inference.h) of the neural-network ops: softmax and the norms, attention
// (sdpa, sdpa_lse, sdpa_grad), indexing (embedding, embedding_backward, one_hot) and losses. Apart
// from the generic op categories because each checks a schema of named roles (query, table, ...).
#include <string>

#include "ir/shape_inference_rules.h"

namespace meshfuse::shape_rules {
namespace {

// sdpa_grad(q, k, v, grad, [lse, delta,] wrt): grad is shaped like sdpa(q, k, v) (typed like it:
// checked with k and v), lse and delta (f32) like sdpa_lse(q, k); the result is shaped and typed
// like the operand `wrt` names.
InferredOutput attentionGradient(const Ctx& c, TensorView* q, TensorView* k, TensorView* v) {
  TensorView* g = c.tv(3);
  c.requireRank(g, 4, "grad [b, heads, s, e_v]");
  auto qs = q->shape(), vs = v->shape(), gs = g->shape();
  c.requireSameExtent(qs[0], gs[0], "batch dim", q, g);
  c.requireSameExtent(qs[1], gs[1], "heads dim", q, g);
  c.requireSameExtent(qs[2], gs[2], "query sequence dim", q, g);
  c.requireSameExtent(vs[3], gs[3], "value embedding dim (e_v)", v, g);
  TensorView* lse = c.in.size() > 4 ? c.tv(4) : nullptr;
  TensorView* delta = c.in.size() > 5 ? c.tv(5) : nullptr;
  MF_USER_CHECK((lse == nullptr) == (delta == nullptr), ErrorKind::Value,
                "{}: lse and delta are given together or not at all, but only {} is", c.op(),
                lse != nullptr ? "lse" : "delta");
  for (TensorView* t : {lse, delta}) {
    if (t == nullptr) continue;
    MF_USER_CHECK(t->dtype() == DataType::Float, ErrorKind::Dtype, "{}: {} must be f32 but is {}", c.op(), c.name(t),
                  dtypeName(t->dtype()));
    c.requireRank(t, 3, t == lse ? "lse [b, heads, s]" : "delta [b, heads, s]");
    auto ts = t->shape();
    c.requireSameExtent(qs[0], ts[0], "batch dim", q, t);
    c.requireSameExtent(qs[1], ts[1], "heads dim", q, t);
    c.requireSameExtent(qs[2], ts[2], "query sequence dim", q, t);
  }
  const std::string& wrt = c.attr<std::string>("wrt");
  const TensorView* of = wrt == "query" ? q : wrt == "key" ? k : wrt == "value" ? v : nullptr;
  MF_USER_CHECK(of != nullptr, ErrorKind::Value, "{}: wrt must be \"query\", \"key\" or \"value\" but is \"{}\"",
                c.op(), wrt);
  return {of->dtype(), c.copyDims(of)};
}

// i64 indices (embedding, embedding_backward, one_hot, cross_entropy's target).
void requireIndices(const Ctx& c, const TensorView* t, const char* role) {
  MF_USER_CHECK(t->dtype() == DataType::Int64, ErrorKind::Dtype, "{}: {} {} must be i64 but is {}", c.op(), role,
                c.name(t), dtypeName(t->dtype()));
}

// A table [V, H], or a grouped one [G, V, H] whose indices lead with the group dim [G, ...].
void checkTable(const Ctx& c, const TensorView* table, const TensorView* indices, const char* role) {
  MF_USER_CHECK(table->rank() == 2 || table->rank() == 3, ErrorKind::Shape,
                "{}: {} {} must have rank 2 ([V, H]) or 3 ([G, V, H]) but has shape {}", c.op(), role, c.name(table),
                Ctx::shapeStr(table));
  if (table->rank() == 2) return;
  MF_USER_CHECK(indices->rank() >= 1, ErrorKind::Shape,
                "{}: grouped {} {} of shape {} needs indices with a leading group dim, but {} has shape {}", c.op(),
                role, c.name(table), Ctx::shapeStr(table), c.name(indices), Ctx::shapeStr(indices));
  c.requireSameExtent(table->shape()[0], indices->shape()[0], "group dim", table, indices);
}

}  // namespace

InferredOutput normalization(const Ctx& c) {
  TensorView* x = c.tv(0);
  c.requireFloat(x);
  if (opInfo(c.kind).category == OpCategory::Softmax) {
    normalizeDim(c.attr<int64_t>("dim"), x->rank(), fmt::format("{}: dim", c.op()));
  } else {
    MF_USER_CHECK(x->rank() >= 1, ErrorKind::Shape, "{}: {} must have rank >= 1", c.op(), c.name(x));
    for (size_t i = 1; i < c.in.size(); ++i) {
      TensorView* p = c.tv(i);
      if (p == nullptr) continue;
      const char* role = opInfo(c.kind).operands[i].name.c_str();
      c.requireRank(p, 1, role);
      c.requireSameExtent(p->shape()[0], x->shape().back(), "normalized dim", p, x);
      MF_USER_CHECK(p->dtype() == x->dtype(), ErrorKind::Dtype, "{}: {} {} is {} but input {} is {}", c.op(), role,
                    c.name(p), dtypeName(p->dtype()), c.name(x), dtypeName(x->dtype()));
    }
  }
  return {x->dtype(), c.copyDims(x)};
}

InferredOutput attention(const Ctx& c) {
  TensorView* q = c.tv(0);
  TensorView* k = c.tv(1);
  c.requireFloat(q);
  c.requireRank(q, 4, "query [b, heads, s, e]");
  c.requireRank(k, 4, "key [b, heads, s_kv, e]");
  if (c.kind == OpKind::SdpaLse) {  // [b, heads, s], f32 (the exact merge statistic)
    MF_USER_CHECK(k->dtype() == q->dtype(), ErrorKind::Dtype, "{}: {} is {} but query {} is {}", c.op(), c.name(k),
                  dtypeName(k->dtype()), c.name(q), dtypeName(q->dtype()));
    auto qs = q->shape(), ks = k->shape();
    c.requireSameExtent(qs[0], ks[0], "batch dim", q, k);
    c.requireSameExtent(qs[1], ks[1], "heads dim", q, k);
    c.requireSameExtent(qs[3], ks[3], "embedding dim (e)", q, k);
    return {DataType::Float, {c.id(qs[0]), c.id(qs[1]), c.id(qs[2])}};
  }
  TensorView* v = c.tv(2);
  c.requireRank(v, 4, "value [b, heads, s_kv, e_v]");
  std::vector<TensorView*> operands = {k, v};
  if (c.kind == OpKind::SdpaGrad) operands.push_back(c.tv(3));  // the output's gradient
  for (TensorView* t : operands)
    MF_USER_CHECK(t->dtype() == q->dtype(), ErrorKind::Dtype, "{}: {} is {} but query {} is {}", c.op(), c.name(t),
                  dtypeName(t->dtype()), c.name(q), dtypeName(q->dtype()));
  auto qs = q->shape(), ks = k->shape(), vs = v->shape();
  c.requireSameExtent(qs[0], ks[0], "batch dim", q, k);
  c.requireSameExtent(qs[0], vs[0], "batch dim", q, v);
  c.requireSameExtent(qs[1], ks[1], "heads dim", q, k);
  c.requireSameExtent(qs[1], vs[1], "heads dim", q, v);
  c.requireSameExtent(qs[3], ks[3], "embedding dim (e)", q, k);
  c.requireSameExtent(ks[2], vs[2], "key/value sequence dim", k, v);
  if (c.kind == OpKind::SdpaGrad) return attentionGradient(c, q, k, v);
  return {q->dtype(), {c.id(qs[0]), c.id(qs[1]), c.id(qs[2]), c.id(vs[3])}};
}

InferredOutput indexing(const Ctx& c) {
  if (c.kind == OpKind::OneHot) {
    TensorView* idx = c.tv(0);
    requireIndices(c, idx, "indices");
    const int64_t n = c.attr<int64_t>("num_classes");
    MF_USER_CHECK(n >= 1, ErrorKind::Value, "one_hot: num_classes must be at least 1 but is {}", n);
    std::vector<InferredDim> out = c.copyDims(idx);
    out.push_back(c.id(Extent(n)));
    return {DataType::Int64, out};
  }
  if (c.kind == OpKind::Embedding) {
    TensorView* w = c.tv(0);
    TensorView* idx = c.tv(1);
    c.requireFloat(w);
    requireIndices(c, idx, "indices");
    checkTable(c, w, idx, "weight");
    std::vector<InferredDim> out = c.copyDims(idx);
    out.push_back(c.id(w->shape().back()));
    return {w->dtype(), out};
  }
  // embedding_backward(grad [idx..., H], indices) -> [(G,) num_weights, H, r{idx dims}]
  TensorView* g = c.tv(0);
  TensorView* idx = c.tv(1);
  c.requireFloat(g);
  requireIndices(c, idx, "indices");
  const int64_t v = c.attr<int64_t>("num_weights");
  const bool grouped = c.attr<bool>("grouped");
  MF_USER_CHECK(v >= 0, ErrorKind::Value, "embedding_backward: num_weights must not be negative but is {}", v);
  MF_USER_CHECK(g->rank() == idx->rank() + 1, ErrorKind::Shape,
                "embedding_backward: grad {} must have the shape of indices {} plus a last (hidden) dim, but has "
                "shape {} for indices of shape {}",
                c.name(g), c.name(idx), Ctx::shapeStr(g), Ctx::shapeStr(idx));
  MF_USER_CHECK(!grouped || idx->rank() >= 1, ErrorKind::Shape,
                "embedding_backward: grouped indices {} need a leading group dim but have shape {}", c.name(idx),
                Ctx::shapeStr(idx));
  for (int64_t d = 0; d < idx->rank(); ++d)
    c.requireSameExtent(g->shape()[d], idx->shape()[d], fmt::format("dim {}", d), g, idx);
  std::vector<InferredDim> out;
  if (grouped) out.push_back(c.id(idx->shape()[0]));
  out.push_back(c.id(Extent(v)));
  out.push_back(c.id(g->shape().back()));
  for (int64_t d = grouped ? 1 : 0; d < idx->rank(); ++d) out.push_back({idx->shape()[d], IterType::Reduction});
  return {g->dtype(), out};
}

InferredOutput loss(const Ctx& c) {
  TensorView* x = c.tv(0);
  TensorView* t = c.tv(1);
  c.requireFloat(x);
  requireIndices(c, t, "target");
  const auto& reduction = c.attr<std::string>("reduction");
  MF_USER_CHECK(reduction == "mean" || reduction == "sum" || reduction == "none", ErrorKind::Value,
                "cross_entropy: reduction must be \"mean\", \"sum\" or \"none\" but is {}", quoteString(reduction));
  MF_USER_CHECK(x->rank() >= 1, ErrorKind::Shape, "cross_entropy: logits {} must have rank >= 1 (a class dim)",
                c.name(x));
  const int64_t class_dim = x->rank() >= 2 ? 1 : 0;
  std::vector<Extent> want;
  for (int64_t d = 0; d < x->rank(); ++d)
    if (d != class_dim) want.push_back(x->shape()[d]);
  MF_USER_CHECK(t->rank() == static_cast<int64_t>(want.size()), ErrorKind::Shape,
                "cross_entropy: target {} must have the shape of logits {} without its class dim {} ({} dims) but "
                "has shape {} for logits of shape {}",
                c.name(t), c.name(x), class_dim, want.size(), Ctx::shapeStr(t), Ctx::shapeStr(x));
  for (int64_t d = 0; d < t->rank(); ++d)
    c.requireSameExtent(want[d], t->shape()[d], fmt::format("batch dim {} (logits without the class dim)", d), x, t);
  std::vector<InferredDim> out;
  for (int64_t d = 0; d < t->rank(); ++d)
    out.push_back(reduction == "none" ? c.id(t->shape()[d], t->dims()[d]->iterType())
                                      : InferredDim{t->shape()[d], IterType::Reduction});
  return {DataType::Float, out};
}

}  // namespace meshfuse::shape_rules
