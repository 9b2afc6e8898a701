// Shape and dtype inference for every op category. Errors name the op, the tensors and both
// sides of a mismatch. This file holds pointwise ops, reductions and GEMMs and the dispatch by
// category; the layout ops and the neural-network ops are in shape_inference_layout.cpp and
// shape_inference_nn.cpp.
#include "ir/shape_inference.h"

#include <algorithm>
#include <set>

#include "ir/shape_inference_rules.h"

namespace meshfuse::shape_rules {

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

namespace {

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

}  // namespace

}  // namespace meshfuse::shape_rules

namespace meshfuse {

int64_t normalizeDim(int64_t dim, int64_t rank, const std::string& what) {
  int64_t d = dim < 0 ? dim + rank : dim;
  MF_USER_CHECK(d >= 0 && d < rank, ErrorKind::Shape, "{}: dim {} is out of range for rank {}", what, dim, rank);
  return d;
}

namespace shape_rules {
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
}  // namespace shape_rules

InferredOutput inferOutput(const Fusion& f, OpKind kind, const std::vector<Val*>& inputs, const Attributes& attrs) {
  std::vector<Fusion::ExtentConstraint> constraints;
  InferredOutput out = shape_rules::inferByCategory(shape_rules::Ctx{f, kind, inputs, attrs, &constraints});
  out.constraints = std::move(constraints);
  return out;
}

}  // namespace meshfuse
