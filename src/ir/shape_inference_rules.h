// What the files of shape inference share (shape_inference.cpp: pointwise, reductions, GEMMs and
// the dispatch by category; shape_inference_layout.cpp: broadcast_in_dim, reshape, permute, slice,
// cat; shape_inference_nn.cpp: norms, attention, indexing, losses): the context an op's
// inference reads, and each family's entry points. Internal to src/ir.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "ir/shape_inference.h"

namespace meshfuse::shape_rules {

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

std::vector<int64_t> normalizeDims(const Ctx& c, const std::vector<int64_t>& dims, int64_t rank, const char* attr);

// The output of one op family (shape_inference_layout.cpp).
InferredOutput broadcastInDim(const Ctx& c);
InferredOutput reshape(const Ctx& c);
InferredOutput permute(const Ctx& c);
InferredOutput slice(const Ctx& c);
InferredOutput concatenate(const Ctx& c);

// The output of one op family (shape_inference_nn.cpp).
InferredOutput normalization(const Ctx& c);
InferredOutput attention(const Ctx& c);
InferredOutput indexing(const Ctx& c);
InferredOutput loss(const Ctx& c);

}  // namespace meshfuse::shape_rules
