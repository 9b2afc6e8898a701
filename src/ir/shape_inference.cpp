// Shape and dtype inference for every op category. Errors name the op, the tensors and both
// sides of a mismatch.
#include "ir/shape_inference.h"

#include <algorithm>
#include <numeric>
#include <set>

namespace meshfuse {
namespace {

struct Ctx {
  const Fusion& f;
  OpKind kind;
  const std::vector<Val*>& in;
  const Attributes& attrs;
  std::vector<Fusion::ExtentConstraint>* constraints;  // run-time equalities found

  std::string_view op() const { return opInfo(kind).name; }
  // The schema name of operand i (a variadic tail's entries share its name).
  const std::string& operandName(size_t i) const {
    const auto& specs = opInfo(kind).operands;
    return specs[std::min(i, specs.size() - 1)].name;
  }
  std::string name(const Val* v) const { return f.displayName(v); }
  TensorView* tv(size_t i) const {
    Val* v = in.at(i);
    if (v == nullptr) return nullptr;
    MF_USER_CHECK(v->valKind() == ValKind::TensorView, ErrorKind::Value,
                  "{}: operand '{}' must be a tensor, got scalar {}", op(), operandName(i), name(v));
    return static_cast<TensorView*>(v);
  }
  template <typename T>
  const T& attr(const char* n) const {
    return std::get<T>(attrs.at(n));
  }
  // An output dim; a size-1 iteration dim is a broadcast dim.
  InferredDim id(const Extent& e, IterType t = IterType::Iteration) const {
    if (t == IterType::Iteration && e.isStatic() && e.value() == 1) t = IterType::Broadcast;
    return {e, t};
  }
  std::vector<InferredDim> copyDims(const TensorView* t) const {
    std::vector<InferredDim> out;
    for (IterDomain* d : t->dims()) out.push_back({d->extent(), d->iterType()});
    return out;
  }
  void requireFloat(const TensorView* t) const {
    MF_USER_CHECK(isFloatingPoint(t->dtype()), ErrorKind::Dtype,
                  "{}: expected a floating-point tensor (f32, bf16, f16) but {} is {}", op(), name(t),
                  dtypeName(t->dtype()));
  }
  void requireRank(const TensorView* t, int64_t r, const char* role) const {
    MF_USER_CHECK(t->rank() == r, ErrorKind::Shape, "{}: {} {} must have rank {} but has shape {}", op(), role, name(t),
                  r, shapeStr(t));
  }
  static std::string shapeStr(const TensorView* t) {
    std::vector<std::string> s;
    for (const Extent& e : t->shape()) s.push_back(e.toString());
    return fmt::format("[{}]", fmt::join(s, ", "));
  }
  // Equal extents, or (when one is symbolic) a constraint checked once sizes are bound.
  void requireSameExtent(const Extent& a, const Extent& b, const std::string& what, const TensorView* ta,
                         const TensorView* tb) const {
    if (a == b) return;
    MF_USER_CHECK(!a.isStatic() || !b.isStatic(), ErrorKind::Shape, "{}: {} mismatch: {} has {} but {} has {}", op(),
                  what, name(ta), a.toString(), name(tb), b.toString());
    constraints->push_back({a, b, std::string(op()), what, ta, tb, nullptr});
  }
};

// Elementwise broadcasting: same rank; per dim, equal extents or broadcast (size-1) dims.
std::vector<InferredDim> broadcastDims(const Ctx& c, const std::vector<TensorView*>& tvs) {
  MF_USER_CHECK(!tvs.empty(), ErrorKind::Value, "{}: at least one operand must be a tensor", c.op());
  const TensorView* first = tvs[0];
  for (const TensorView* t : tvs)
    MF_USER_CHECK(t->rank() == first->rank(), ErrorKind::Shape,
                  "{}: rank mismatch: {} has shape {} but {} has shape {} (use broadcast_in_dim to add dims)", c.op(),
                  c.name(first), Ctx::shapeStr(first), c.name(t), Ctx::shapeStr(t));
  std::vector<InferredDim> out;
  for (int64_t d = 0; d < first->rank(); ++d) {
    const TensorView* owner = nullptr;
    for (const TensorView* t : tvs) {
      IterDomain* id = t->dims()[d];
      if (id->isBroadcast()) continue;
      if (owner == nullptr)
        owner = t;
      else
        c.requireSameExtent(owner->dims()[d]->extent(), id->extent(), fmt::format("dim {}", d), owner, t);
    }
    out.push_back(owner ? c.id(owner->dims()[d]->extent()) : c.id(Extent(1), IterType::Broadcast));
  }
  return out;
}

std::vector<TensorView*> tensorOperands(const Ctx& c, DataType* dtype, bool* has_float_scalar) {
  std::vector<TensorView*> tvs;
  *has_float_scalar = false;
  bool first = true;
  for (Val* v : c.in) {
    if (v->valKind() == ValKind::Scalar) {
      *has_float_scalar |= isFloatingPoint(v->dtype());
      continue;
    }
    auto* t = static_cast<TensorView*>(v);
    *dtype = first ? t->dtype() : promote(*dtype, t->dtype());
    first = false;
    tvs.push_back(t);
  }
  return tvs;
}

std::vector<int64_t> normalizeDims(const Ctx& c, const std::vector<int64_t>& dims, int64_t rank, const char* attr) {
  std::vector<int64_t> out;
  std::set<int64_t> seen;
  for (int64_t d : dims) {
    int64_t n = normalizeDim(d, rank, fmt::format("{}: {}", c.op(), attr));
    MF_USER_CHECK(seen.insert(n).second, ErrorKind::Value, "{}: {} lists dim {} twice", c.op(), attr, n);
    out.push_back(n);
  }
  return out;
}

InferredOutput pointwise(const Ctx& c) {
  DataType dt = DataType::Float;
  bool float_scalar = false;
  std::vector<TensorView*> tvs = tensorOperands(c, &dt, &float_scalar);
  OpCategory cat = opInfo(c.kind).category;
  if (cat == OpCategory::Ternary) {
    TensorView* cond = c.tv(0);
    MF_USER_CHECK(cond->dtype() == DataType::Bool, ErrorKind::Dtype, "where: condition {} must be bool but is {}",
                  c.name(cond), dtypeName(cond->dtype()));
    // The result dtype comes from the two value operands only.
    std::vector<Val*> values(c.in.begin() + 1, c.in.end());
    Ctx vc{c.f, c.kind, values, c.attrs, c.constraints};
    bool fs = false;
    DataType vdt = DataType::Float;
    if (!tensorOperands(vc, &vdt, &fs).empty()) {
      dt = (fs && !isFloatingPoint(vdt)) ? DataType::Float : vdt;
    } else {  // two scalars: float if either is, else int unless both are bool
      bool all_bool = std::all_of(values.begin(), values.end(), [](Val* v) { return v->dtype() == DataType::Bool; });
      dt = fs ? DataType::Float : all_bool ? DataType::Bool : DataType::Int64;
    }
    return {dt, broadcastDims(c, tvs)};
  }
  std::vector<InferredDim> dims = broadcastDims(c, tvs);
  if (float_scalar && !isFloatingPoint(dt)) dt = DataType::Float;
  switch (cat) {
    case OpCategory::Unary:
      if (c.kind != OpKind::Neg && c.kind != OpKind::Abs && c.kind != OpKind::Relu) c.requireFloat(tvs[0]);
      if (c.kind == OpKind::Gelu) {
        const auto& a = c.attr<std::string>("approximate");
        MF_USER_CHECK(a == "none" || a == "tanh", ErrorKind::Value,
                      "gelu: approximate must be \"none\" or \"tanh\" but is {}", quoteString(a));
      }
      MF_USER_CHECK(dt != DataType::Bool || c.kind == OpKind::Abs, ErrorKind::Dtype,
                    "{}: not defined for bool tensor {}", c.op(), c.name(tvs[0]));
      break;
    case OpCategory::Binary:
      if ((c.kind == OpKind::Div || c.kind == OpKind::Pow) && !isFloatingPoint(dt)) dt = DataType::Float;
      MF_USER_CHECK(dt != DataType::Bool, ErrorKind::Dtype, "{}: not defined for bool tensors", c.op());
      break;
    case OpCategory::Compare: dt = DataType::Bool; break;
    // Ternary returned above; the rest never reach here. Listed (no `default:`) so that -Wswitch
    // flags a new category.
    case OpCategory::Ternary:
    case OpCategory::Cast:
    case OpCategory::Set:
    case OpCategory::Reduction:
    case OpCategory::Gemm:
    case OpCategory::BroadcastInDim:
    case OpCategory::Reshape:
    case OpCategory::Permute:
    case OpCategory::Slice:
    case OpCategory::Cat:
    case OpCategory::Softmax:
    case OpCategory::Norm:
    case OpCategory::Attention:
    case OpCategory::Indexing:
    case OpCategory::Loss: MF_CHECK(false, "{} is not a pointwise op", c.op());
  }
  return {dt, dims};
}

InferredOutput reduction(const Ctx& c) {
  TensorView* x = c.tv(0);
  std::vector<int64_t> dims = normalizeDims(c, c.attr<std::vector<int64_t>>("dims"), x->rank(), "dims");
  MF_USER_CHECK(!dims.empty(), ErrorKind::Value, "{}: dims must not be empty", c.op());
  DataType dt = x->dtype();
  if (c.kind == OpKind::Mean) c.requireFloat(x);
  if (c.kind == OpKind::Sum && dt == DataType::Bool) dt = DataType::Int64;
  std::vector<InferredDim> out;
  std::vector<IterDomain*> xd = x->dims();
  for (int64_t d = 0; d < x->rank(); ++d) {
    bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
    out.push_back({xd[d]->extent(), reduced ? IterType::Reduction : xd[d]->iterType()});
  }
  return {dt, out};
}

InferredOutput gemm(const Ctx& c) {
  TensorView* a = c.tv(0);
  TensorView* b = c.tv(1);
  c.requireFloat(a);
  MF_USER_CHECK(a->dtype() == b->dtype(), ErrorKind::Dtype, "{}: dtype mismatch: {} is {} but {} is {}", c.op(),
                c.name(a), dtypeName(a->dtype()), c.name(b), dtypeName(b->dtype()));
  std::vector<Extent> as = a->shape(), bs = b->shape();
  std::vector<InferredDim> out;
  Extent k;
  if (c.kind == OpKind::Linear) {
    MF_USER_CHECK(a->rank() >= 1, ErrorKind::Shape, "linear: input {} must have rank >= 1", c.name(a));
    c.requireRank(b, 2, "weight");
    c.requireSameExtent(as.back(), bs[1], "contracted dim (k)", a, b);
    for (size_t i = 0; i + 1 < as.size(); ++i) out.push_back(c.id(as[i], a->dims()[i]->iterType()));
    out.push_back(c.id(bs[0]));
    k = as.back();
    if (TensorView* bias = c.tv(2)) {
      c.requireRank(bias, 1, "bias");
      c.requireSameExtent(bias->shape()[0], bs[0], "output features (n)", bias, b);
      MF_USER_CHECK(bias->dtype() == a->dtype(), ErrorKind::Dtype, "linear: bias {} is {} but input {} is {}",
                    c.name(bias), dtypeName(bias->dtype()), c.name(a), dtypeName(a->dtype()));
    }
  } else {
    MF_USER_CHECK(a->rank() >= 2 && b->rank() >= 2, ErrorKind::Shape,
                  "matmul: operands must have rank >= 2 but {} has shape {} and {} has shape {}", c.name(a),
                  Ctx::shapeStr(a), c.name(b), Ctx::shapeStr(b));
    MF_USER_CHECK(b->rank() == 2 || b->rank() == a->rank(), ErrorKind::Shape,
                  "matmul: {} has shape {} and {} has shape {}: b must be rank 2 or have a's rank", c.name(a),
                  Ctx::shapeStr(a), c.name(b), Ctx::shapeStr(b));
    c.requireSameExtent(as.back(), bs[bs.size() - 2], "contracted dim (k)", a, b);
    for (size_t i = 0; i + 2 < as.size(); ++i) {
      if (b->rank() == a->rank()) c.requireSameExtent(as[i], bs[i], fmt::format("batch dim {}", i), a, b);
      out.push_back(c.id(as[i]));
    }
    out.push_back(c.id(as[as.size() - 2]));
    out.push_back(c.id(bs.back()));
    k = as.back();
  }
  out.push_back({k, IterType::Reduction});
  return {a->dtype(), out};
}

InferredOutput broadcastInDim(const Ctx& c) {
  TensorView* x = c.tv(0);
  const auto& shape = c.attr<std::vector<int64_t>>("shape");
  const auto& bdims = c.attr<std::vector<int64_t>>("broadcast_dims");
  MF_USER_CHECK(static_cast<int64_t>(bdims.size()) == x->rank(), ErrorKind::Shape,
                "broadcast_in_dim: broadcast_dims has {} entries but {} has rank {}", bdims.size(), c.name(x),
                x->rank());
  std::vector<int64_t> target(shape.size(), -2);  // input dim that lands on each output dim
  for (size_t i = 0; i < bdims.size(); ++i) {
    int64_t o = bdims[i];
    MF_USER_CHECK(o >= 0 && o < static_cast<int64_t>(shape.size()), ErrorKind::Shape,
                  "broadcast_in_dim: broadcast_dims[{}] = {} is out of range for output rank {}", i, o, shape.size());
    MF_USER_CHECK(i == 0 || bdims[i - 1] < o, ErrorKind::Value,
                  "broadcast_in_dim: broadcast_dims must be strictly increasing, got [{}]", fmt::join(bdims, ", "));
    target[o] = static_cast<int64_t>(i);
  }
  std::vector<InferredDim> out;
  std::vector<IterDomain*> xd = x->dims();
  for (size_t o = 0; o < shape.size(); ++o) {
    if (target[o] < 0) {
      MF_USER_CHECK(shape[o] >= 1, ErrorKind::Shape,
                    "broadcast_in_dim: new output dim {} needs a positive size, got {}", o, shape[o]);
      out.push_back(c.id(Extent(shape[o])));
      continue;
    }
    IterDomain* src = xd[target[o]];
    if (shape[o] == -1 || (!src->isBroadcast() && src->extent().isStatic() && src->extent().value() == shape[o])) {
      out.push_back(c.id(src->extent(), src->iterType()));
    } else {
      MF_USER_CHECK(src->isBroadcast() && shape[o] >= 1, ErrorKind::Shape,
                    "broadcast_in_dim: dim {} of {} has size {} but output dim {} asks for {}", target[o], c.name(x),
                    src->extent().toString(), o, shape[o]);
      out.push_back(c.id(Extent(shape[o])));
    }
  }
  return {x->dtype(), out};
}

InferredOutput reshape(const Ctx& c) {
  TensorView* x = c.tv(0);
  const auto& shape = c.attr<std::vector<int64_t>>("shape");
  std::string sym;
  int64_t num = 1, den = 1, in_static = 1;
  for (const Extent& e : x->shape()) {
    if (e.isStatic()) {
      in_static *= e.value();
      continue;
    }
    MF_USER_CHECK(sym.empty(), ErrorKind::Unsupported,
                  "reshape: {} has several symbolic sizes; at most one is supported", c.name(x));
    sym = e.symbol();
    num = e.num();
    den = e.den();
  }
  int64_t infer_at = -1;
  std::vector<int64_t> given;  // the output sizes other than the -1
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      MF_USER_CHECK(infer_at < 0, ErrorKind::Value, "reshape: at most one -1 is allowed in [{}]",
                    fmt::join(shape, ", "));
      infer_at = static_cast<int64_t>(i);
      continue;
    }
    MF_USER_CHECK(shape[i] >= 0, ErrorKind::Shape, "reshape: size {} at dim {} is invalid", shape[i], i);
    given.push_back(shape[i]);
  }
  // (The input's static sizes were checked to fit when it was made; the attribute is user text.)
  std::optional<int64_t> given_numel = checkedNumel(given);
  MF_USER_CHECK(given_numel.has_value(), ErrorKind::Shape,
                "reshape: shape [{}] has more elements than an int64 can count", fmt::join(shape, ", "));
  const int64_t out_static = *given_numel;
  std::vector<Extent> out_shape(shape.begin(), shape.end());
  auto mismatch = [&] {
    std::vector<std::string> s;
    for (const Extent& e : x->shape()) s.push_back(e.toString());
    userError(ErrorKind::Shape, "reshape: cannot reshape {} of shape [{}] ({} elements) into [{}]", c.name(x),
              fmt::join(s, ", "), sym.empty() ? std::to_string(in_static) : "?" + sym + "*...", fmt::join(shape, ", "));
  };
  if (sym.empty()) {
    if (infer_at >= 0) {
      if (out_static == 0 || in_static % out_static != 0) mismatch();
      out_shape[infer_at] = Extent(in_static / out_static);
    } else if (in_static != out_static) {
      mismatch();
    }
  } else {
    MF_USER_CHECK(infer_at >= 0, ErrorKind::Value,
                  "reshape: {} has symbolic size ?{}; mark the output dim that absorbs it with -1", c.name(x), sym);
    // A size-0 dim on either side: no elements in (the -1 is 0), or a -1 that any size would fit.
    MF_USER_CHECK(out_static != 0, ErrorKind::Shape,
                  "reshape: the -1 in [{}] is ambiguous: the other sizes hold 0 elements, so any size fits it",
                  fmt::join(shape, ", "));
    int64_t n = 0, d = 0;
    if (in_static == 0) {
      out_shape[infer_at] = Extent(0);
    } else if (__builtin_mul_overflow(num, in_static, &n) || __builtin_mul_overflow(den, out_static, &d)) {
      userError(ErrorKind::Shape, "reshape: the size of the -1 in [{}], ?{} times {}/{}, does not fit in an int64",
                fmt::join(shape, ", "), sym, in_static, out_static);
    } else {
      out_shape[infer_at] = Extent::symbolic(sym, n, d);
    }
  }
  std::vector<InferredDim> out;
  for (const Extent& e : out_shape) out.push_back(c.id(e));
  return {x->dtype(), out};
}

InferredOutput permute(const Ctx& c) {
  TensorView* x = c.tv(0);
  const auto& dims = c.attr<std::vector<int64_t>>("dims");
  MF_USER_CHECK(static_cast<int64_t>(dims.size()) == x->rank(), ErrorKind::Shape,
                "permute: dims [{}] has {} entries but {} has rank {}", fmt::join(dims, ", "), dims.size(), c.name(x),
                x->rank());
  std::vector<int64_t> n = normalizeDims(c, dims, x->rank(), "dims");
  std::vector<IterDomain*> xd = x->dims();
  std::vector<InferredDim> out;
  for (int64_t d : n) out.push_back({xd[d]->extent(), xd[d]->iterType()});
  return {x->dtype(), out};
}

InferredOutput slice(const Ctx& c) {
  TensorView* x = c.tv(0);
  const auto& starts = c.attr<std::vector<int64_t>>("starts");
  const auto& ends = c.attr<std::vector<int64_t>>("ends");
  MF_USER_CHECK(static_cast<int64_t>(starts.size()) == x->rank() && starts.size() == ends.size(), ErrorKind::Shape,
                "slice: starts and ends need {} entries (the rank of {}), got {} and {}", x->rank(), c.name(x),
                starts.size(), ends.size());
  std::vector<InferredDim> out;
  std::vector<Extent> xs = x->shape();
  for (int64_t d = 0; d < x->rank(); ++d) {
    if (!xs[d].isStatic()) {
      MF_USER_CHECK(starts[d] == 0 && ends[d] == -1, ErrorKind::Unsupported,
                    "slice: dim {} of {} has symbolic size {}; only the whole dim (0 to -1) can be taken", d, c.name(x),
                    xs[d].toString());
      out.push_back(c.id(xs[d]));
      continue;
    }
    MF_USER_CHECK(0 <= starts[d] && starts[d] <= ends[d] && ends[d] <= xs[d].value(), ErrorKind::Shape,
                  "slice: dim {} of {} has size {} but the slice is [{}, {})", d, c.name(x), xs[d].value(), starts[d],
                  ends[d]);
    out.push_back(c.id(Extent(ends[d] - starts[d])));
  }
  return {x->dtype(), out};
}

InferredOutput concatenate(const Ctx& c) {
  TensorView* first = c.tv(0);
  int64_t dim = normalizeDim(c.attr<int64_t>("dim"), first->rank(), "cat: dim");
  Extent total(0);
  DataType dt = first->dtype();
  for (size_t i = 0; i < c.in.size(); ++i) {
    TensorView* t = c.tv(i);
    MF_USER_CHECK(t->rank() == first->rank(), ErrorKind::Shape, "cat: {} has shape {} but {} has shape {}",
                  c.name(first), Ctx::shapeStr(first), c.name(t), Ctx::shapeStr(t));
    MF_USER_CHECK(t->dtype() == dt, ErrorKind::Dtype, "cat: {} is {} but {} is {}", c.name(first), dtypeName(dt),
                  c.name(t), dtypeName(t->dtype()));
    for (int64_t d = 0; d < t->rank(); ++d)
      if (d != dim) c.requireSameExtent(first->shape()[d], t->shape()[d], fmt::format("dim {}", d), first, t);
    Extent e = t->shape()[dim];
    MF_USER_CHECK(e.isStatic(), ErrorKind::Unsupported, "cat: dim {} of {} is symbolic ({})", dim, c.name(t),
                  e.toString());
    total = Extent(total.value() + e.value());
  }
  std::vector<InferredDim> out;
  for (int64_t d = 0; d < first->rank(); ++d) out.push_back(c.id(d == dim ? total : first->shape()[d]));
  return {dt, out};
}

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

// sdpa_grad(q, k, v, grad, wrt): grad is shaped like sdpa(q, k, v) (typed like it: checked with
// k and v); the result is shaped and typed like the operand `wrt` names.
InferredOutput attentionGradient(const Ctx& c, TensorView* q, TensorView* k, TensorView* v) {
  TensorView* g = c.tv(3);
  c.requireRank(g, 4, "grad [b, heads, s, e_v]");
  auto qs = q->shape(), vs = v->shape(), gs = g->shape();
  c.requireSameExtent(qs[0], gs[0], "batch dim", q, g);
  c.requireSameExtent(qs[1], gs[1], "heads dim", q, g);
  c.requireSameExtent(qs[2], gs[2], "query sequence dim", q, g);
  c.requireSameExtent(vs[3], gs[3], "value embedding dim (e_v)", v, g);
  const std::string& wrt = c.attr<std::string>("wrt");
  const TensorView* of = wrt == "query" ? q : wrt == "key" ? k : wrt == "value" ? v : nullptr;
  MF_USER_CHECK(of != nullptr, ErrorKind::Value, "{}: wrt must be \"query\", \"key\" or \"value\" but is \"{}\"",
                c.op(), wrt);
  return {of->dtype(), c.copyDims(of)};
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

}  // namespace

int64_t normalizeDim(int64_t dim, int64_t rank, const std::string& what) {
  int64_t d = dim < 0 ? dim + rank : dim;
  MF_USER_CHECK(d >= 0 && d < rank, ErrorKind::Shape, "{}: dim {} is out of range for rank {}", what, dim, rank);
  return d;
}

namespace {

InferredOutput inferByCategory(const Ctx& c) {
  const OpKind kind = c.kind;
  const std::vector<Val*>& inputs = c.in;
  OpCategory cat = opInfo(kind).category;
  // Only pointwise ops take scalar operands.
  if (cat != OpCategory::Unary && cat != OpCategory::Binary && cat != OpCategory::Compare && cat != OpCategory::Ternary)
    for (size_t i = 0; i < inputs.size(); ++i) c.tv(i);
  switch (cat) {
    case OpCategory::Unary:
    case OpCategory::Binary:
    case OpCategory::Compare:
    case OpCategory::Ternary: return pointwise(c);
    case OpCategory::Cast: return {c.attr<DataType>("dtype"), c.copyDims(c.tv(0))};
    case OpCategory::Set: {
      const auto& overlap = c.attr<std::string>("overlap");
      MF_USER_CHECK(overlap == "none" || overlap == "collective" || overlap == "ring", ErrorKind::Value,
                    "set: overlap must be \"none\", \"collective\" or \"ring\" but is {}", quoteString(overlap));
      MF_USER_CHECK(c.attr<int64_t>("chunks") >= 1, ErrorKind::Value, "set: chunks must be at least 1 but is {}",
                    c.attr<int64_t>("chunks"));
      return {c.tv(0)->dtype(), c.copyDims(c.tv(0))};
    }
    case OpCategory::Reduction: return reduction(c);
    case OpCategory::Gemm: return gemm(c);
    case OpCategory::BroadcastInDim: return broadcastInDim(c);
    case OpCategory::Reshape: return reshape(c);
    case OpCategory::Permute: return permute(c);
    case OpCategory::Slice: return slice(c);
    case OpCategory::Cat: return concatenate(c);
    case OpCategory::Softmax:
    case OpCategory::Norm: return normalization(c);
    case OpCategory::Attention: return attention(c);
    case OpCategory::Indexing: return indexing(c);
    case OpCategory::Loss: return loss(c);
  }
  MF_CHECK(false, "no shape inference for {}", opInfo(kind).name);
}

}  // namespace

InferredOutput inferOutput(const Fusion& f, OpKind kind, const std::vector<Val*>& inputs, const Attributes& attrs) {
  std::vector<Fusion::ExtentConstraint> constraints;
  InferredOutput out = inferByCategory(Ctx{f, kind, inputs, attrs, &constraints});
  out.constraints = std::move(constraints);
  return out;
}

}  // namespace meshfuse
