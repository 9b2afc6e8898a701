// Shape inference (shape_inference.h) of the ops that move data without computing on it:
// broadcast_in_dim, reshape, permute, slice and cat. Apart from the arithmetic ops because their
// rules are about extents alone (which dims split, merge or line up).
#include <string>

#include "ir/shape_inference_rules.h"

namespace meshfuse::shape_rules {

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

}  // namespace meshfuse::shape_rules
