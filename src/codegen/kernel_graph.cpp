// The element graph of a kernel segment (contract in kernel_graph.h). Scalar semantics follow
// the reference executor (src/driver/reference_executor.cpp) op by op.
#include "codegen/kernel_graph.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "meshfuse/ir/fusion.h"
#include "lower/segment.h"

namespace meshfuse::kir {

Type computeType(DataType dt) {
  switch (dt) {
    case DataType::Float:
    case DataType::BFloat16:
    case DataType::Half: return Type::F32;
    case DataType::Int64: return Type::F64;
    case DataType::Bool: return Type::Bool;
  }
  MF_CHECK(false, "unknown dtype");
}

Expr linearize(const std::vector<Expr>& idx, const std::vector<int64_t>& shape) {
  MF_CHECK(idx.size() == shape.size(), "index of rank {} into a shape of rank {}", idx.size(), shape.size());
  Expr flat = index(0);
  int64_t stride = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    flat = add(mul(idx[d], index(stride)), flat);
    stride *= shape[d];
  }
  return flat;
}

namespace {

// What the reference's roundToDtype does to a value of computeType(dt).
Expr roundTo(Expr v, DataType dt) {
  switch (dt) {
    case DataType::BFloat16:
    case DataType::Half: return round(std::move(v), dt);
    case DataType::Int64: return unary(Op::Trunc, std::move(v));
    case DataType::Float:
    case DataType::Bool: return v;
  }
  return v;
}

Expr unaryFormula(OpKind k, bool gelu_tanh, Expr x) {
  static_assert(opCountOf(OpCategory::Unary) == 12, "a new unary op in ops.def: give it a formula here");
  const Type t = x->type;
  auto c = [t](double v) { return constant(v, t); };
  switch (k) {
    case OpKind::Neg: return unary(Op::Neg, x);
    case OpKind::Abs: return t == Type::Bool ? x : unary(Op::Abs, x);
    case OpKind::Exp: return unary(Op::Exp, x);
    case OpKind::Log: return unary(Op::Log, x);
    case OpKind::Sqrt: return unary(Op::Sqrt, x);
    case OpKind::Rsqrt: return unary(Op::Rsqrt, x);
    case OpKind::Reciprocal: return unary(Op::Recip, x);
    case OpKind::Tanh: return unary(Op::Tanh, x);
    case OpKind::Sigmoid: return unary(Op::Recip, add(c(1), unary(Op::Exp, unary(Op::Neg, x))));
    case OpKind::Relu: return select(binary(Op::Gt, x, c(0)), x, c(0));
    case OpKind::Gelu: {
      Expr half_x = mul(c(0.5), x);
      if (gelu_tanh) {
        Expr inner = mul(c(std::sqrt(2 / M_PI)), add(x, mul(c(0.044715), mul(x, mul(x, x)))));
        return mul(half_x, add(c(1), unary(Op::Tanh, inner)));
      }
      return mul(half_x, add(c(1), unary(Op::Erf, mul(x, c(M_SQRT1_2)))));
    }
    case OpKind::Silu: return binary(Op::Div, x, add(c(1), unary(Op::Exp, unary(Op::Neg, x))));
    default: MF_CHECK(false, "{} is not unary", opInfo(k).name);
  }
}

// x ** y, with the exponents models use written as multiplications (exact and vectorizable).
Expr power(Expr x, Expr y) {
  if (y->op == Op::Const) {
    const double v = y->value;
    const Type t = x->type;
    if (v == 0) return constant(1, t);
    if (v == 1) return x;
    if (v == 2) return mul(x, x);
    if (v == 3) return mul(x, mul(x, x));
    if (v == 0.5) return unary(Op::Sqrt, x);
    if (v == -0.5) return unary(Op::Rsqrt, x);
    if (v == -1) return unary(Op::Recip, x);
  }
  return binary(Op::Pow, std::move(x), std::move(y));
}

Expr binaryFormula(OpKind k, Expr a, Expr b) {
  static_assert(opCountOf(OpCategory::Binary) + opCountOf(OpCategory::Compare) == 13,
                "a new binary or comparison op in ops.def: give it a formula here");
  switch (k) {
    case OpKind::Add: return add(a, b);
    case OpKind::Sub: return binary(Op::Sub, a, b);
    case OpKind::Mul: return mul(a, b);
    case OpKind::Div: return binary(Op::Div, a, b);
    case OpKind::Pow: return power(a, b);
    case OpKind::Maximum: return binary(Op::Max, a, b);
    case OpKind::Minimum: return binary(Op::Min, a, b);
    case OpKind::Eq: return binary(Op::Eq, a, b);
    case OpKind::Ne: return binary(Op::Ne, a, b);
    case OpKind::Lt: return binary(Op::Lt, a, b);
    case OpKind::Le: return binary(Op::Le, a, b);
    case OpKind::Gt: return binary(Op::Gt, a, b);
    case OpKind::Ge: return binary(Op::Ge, a, b);
    default: MF_CHECK(false, "{} is not binary", opInfo(k).name);
  }
}

class GraphBuilder {
 public:
  GraphBuilder(const LocalShapeFn& shape_of, ElementGraph& g) : shape_of_(shape_of), g_(g) {}

  ENode* addNode(ENode n) {
    for (ENode* o : n.operands) ++o->uses;
    g_.nodes.push_back(std::make_unique<ENode>(std::move(n)));
    return g_.nodes.back().get();
  }

  ENode* input(const TensorView* tv, int64_t buffer) {
    ENode n{ENode::Input, shape_of_(tv), computeType(tv->dtype()), tv->dtype()};
    n.tv = tv;
    n.buffer = buffer;
    return values_[tv] = addNode(std::move(n));
  }

  // A rank-0 constant node for a scalar operand.
  ENode* scalar(const meshfuse::Scalar* s) {
    ENode n{ENode::Map, {}, Type::F64, DataType::Float};
    const double v = s->value();
    n.formula = [v](const std::vector<Expr>&) { return constant(v, Type::F64); };
    return addNode(std::move(n));
  }

  ENode* operand(const Val* v) {
    if (v->valKind() == ValKind::Scalar) return scalar(static_cast<const meshfuse::Scalar*>(v));
    auto it = values_.find(v);
    MF_CHECK(it != values_.end(), "a kernel operand that is neither a segment input nor computed before");
    return it->second;
  }

  ENode* map(std::vector<int64_t> shape, Type t, DataType dt, std::vector<ENode*> ops,
             std::function<Expr(const std::vector<Expr>&)> f, const TensorView* tv = nullptr) {
    ENode n{ENode::Map, std::move(shape), t, dt, std::move(ops)};
    n.formula = std::move(f);
    n.tv = tv;
    return addNode(std::move(n));
  }

  ENode* indexNode(ENode* x, std::vector<int64_t> shape, std::function<std::vector<Expr>(const std::vector<Expr>&)> f,
                   const TensorView* tv = nullptr) {
    ENode n{ENode::Index, std::move(shape), x->type, x->dtype, {x}};
    n.index_map = std::move(f);
    n.tv = tv;
    return addNode(std::move(n));
  }

  // x reduced over `dims` (raw accumulation: f32 for floating x, f64 otherwise).
  ENode* reduce(ENode* x, std::vector<int64_t> dims, bool is_max) {
    std::sort(dims.begin(), dims.end());
    std::vector<int64_t> shape;
    for (int64_t d = 0; d < static_cast<int64_t>(x->shape.size()); ++d)
      if (!std::binary_search(dims.begin(), dims.end(), d)) shape.push_back(x->shape[d]);
    const bool fp = x->type == Type::F32;
    ENode n{ENode::Reduce, shape, fp ? Type::F32 : Type::F64, fp ? DataType::Float : DataType::Int64, {x}};
    n.dims = std::move(dims);
    n.is_max = is_max;
    return addNode(std::move(n));
  }

  // A reduction result (shape without `dims`) seen at every index of `full` (the reduced dims
  // broadcast back).
  ENode* unreduce(ENode* r, const std::vector<int64_t>& full, std::vector<int64_t> dims) {
    return indexNode(r, full, [dims](const std::vector<Expr>& idx) {
      std::vector<Expr> out;
      for (int64_t d = 0; d < static_cast<int64_t>(idx.size()); ++d)
        if (std::find(dims.begin(), dims.end(), d) == dims.end()) out.push_back(idx[d]);
      return out;
    });
  }

  // A rank-1 parameter of the last dim (norm weight/bias) seen at every index of `full`.
  ENode* lastDimParam(ENode* p, const std::vector<int64_t>& full) {
    return indexNode(p, full, [](const std::vector<Expr>& idx) { return std::vector<Expr>{idx.back()}; });
  }

  void build(const meshfuse::Expr* e) {
    const TensorView* out = e->output();
    std::vector<int64_t> shape = shape_of_(out);
    ENode* result = nullptr;
    switch (e->info().category) {
      case OpCategory::Unary:
      case OpCategory::Binary:
      case OpCategory::Compare:
      case OpCategory::Ternary:
      case OpCategory::Cast:
      case OpCategory::Set: result = elementwise(e, shape); break;
      case OpCategory::Reduction: result = reduction(e, shape); break;
      case OpCategory::BroadcastInDim: result = broadcastInDim(e, shape); break;
      case OpCategory::Reshape: result = reshape(e, shape); break;
      case OpCategory::Permute: result = permute(e, shape); break;
      case OpCategory::Slice: result = slice(e, shape); break;
      case OpCategory::Cat: result = cat(e, shape); break;
      case OpCategory::Softmax: result = softmax(e, shape); break;
      case OpCategory::Norm: result = norm(e, shape); break;
      case OpCategory::Indexing: result = indexing(e, shape); break;
      case OpCategory::Loss: result = crossEntropy(e, shape); break;
      case OpCategory::Gemm:
      case OpCategory::Attention: MF_CHECK(false, "{} in a kernel segment: it is a library call", e->name());
    }
    MF_CHECK(result->shape == shape, "{}: element graph shape differs from the local shape", e->name());
    result->tv = out;
    values_[out] = result;
  }

  ENode* valueOf(const TensorView* tv) const { return values_.at(tv); }

 private:
  // One Map node: the op's formula at each index, computed in the output's compute type and
  // rounded to its dtype (compares in f64: exact for every dtype and for any scalar operand).
  ENode* elementwise(const meshfuse::Expr* e, const std::vector<int64_t>& shape) {
    const TensorView* out = e->output();
    const DataType odt = out->dtype();
    const Type ot = computeType(odt);
    const OpKind k = e->kind();
    const OpCategory c = e->info().category;
    const size_t arity = c == OpCategory::Ternary ? 3 : c == OpCategory::Binary || c == OpCategory::Compare ? 2 : 1;
    std::vector<ENode*> operands;
    for (size_t i = 0; i < arity; ++i) operands.push_back(operand(e->input(i)));
    switch (c) {
      case OpCategory::Unary: {
        const bool tanh_approx = k == OpKind::Gelu && e->attr<std::string>("approximate") == "tanh";
        return map(
            shape, ot, odt, operands,
            [k, tanh_approx, ot, odt](const auto& a) {
              return roundTo(unaryFormula(k, tanh_approx, cast(a[0], ot)), odt);
            },
            out);
      }
      case OpCategory::Binary:
        return map(
            shape, ot, odt, operands,
            [k, ot, odt](const auto& a) { return roundTo(binaryFormula(k, cast(a[0], ot), cast(a[1], ot)), odt); },
            out);
      case OpCategory::Compare:
        return map(
            shape, ot, odt, operands,
            [k](const auto& a) { return binaryFormula(k, cast(a[0], Type::F64), cast(a[1], Type::F64)); }, out);
      case OpCategory::Ternary:
        return map(
            shape, ot, odt, operands,
            [ot, odt](const auto& a) {
              return roundTo(select(cast(a[0], Type::Bool), cast(a[1], ot), cast(a[2], ot)), odt);
            },
            out);
      default:  // Cast, Set
        return map(
            shape, ot, odt, operands, [ot, odt](const auto& a) { return roundTo(cast(a[0], ot), odt); }, out);
    }
  }

  ENode* permute(const meshfuse::Expr* e, const std::vector<int64_t>& shape) {
    ENode* x = operand(e->input(size_t{0}));
    std::vector<int64_t> perm = e->attr<std::vector<int64_t>>("dims");
    for (int64_t& p : perm) p = p < 0 ? p + static_cast<int64_t>(perm.size()) : p;
    return indexNode(
        x, shape,
        [perm](const std::vector<Expr>& idx) {
          std::vector<Expr> in(idx.size());
          for (size_t d = 0; d < perm.size(); ++d) in[perm[d]] = idx[d];
          return in;
        },
        e->output());
  }

  ENode* cat(const meshfuse::Expr* e, const std::vector<int64_t>& shape) {
    const DataType odt = e->output()->dtype();
    ENode n{ENode::Cat, shape, computeType(odt), odt};
    for (const Val* v : e->inputs()) n.operands.push_back(operand(v));
    int64_t dim = e->attr<int64_t>("dim");
    n.dim = dim < 0 ? dim + static_cast<int64_t>(shape.size()) : dim;
    n.tv = e->output();
    return addNode(std::move(n));
  }

  ENode* reduction(const meshfuse::Expr* e, const std::vector<int64_t>& shape) {
    ENode* x = operand(e->input(size_t{0}));
    const int64_t rank = static_cast<int64_t>(x->shape.size());
    std::vector<int64_t> dims = e->attr<std::vector<int64_t>>("dims");
    int64_t count = 1;
    for (int64_t& d : dims) {
      d = d < 0 ? d + rank : d;
      count *= x->shape.at(d);
    }
    ENode* r = reduce(x, dims, e->kind() == OpKind::Max);
    const bool mean = e->kind() == OpKind::Mean;
    const DataType odt = e->output()->dtype();
    const Type ot = computeType(odt);
    return map(shape, ot, odt, {r}, [mean, count, ot, odt](const auto& a) {
      Expr v = a[0];
      if (mean) v = binary(Op::Div, v, constant(static_cast<double>(count), v->type));
      return roundTo(cast(v, ot), odt);
    });
  }

  ENode* broadcastInDim(const meshfuse::Expr* e, const std::vector<int64_t>& shape) {
    ENode* x = operand(e->input(size_t{0}));
    std::vector<int64_t> bd = e->attr<std::vector<int64_t>>("broadcast_dims");
    std::vector<int64_t> in_shape = x->shape;
    return indexNode(x, shape, [bd, in_shape](const std::vector<Expr>& idx) {
      std::vector<Expr> in;
      for (size_t i = 0; i < bd.size(); ++i) in.push_back(in_shape[i] == 1 ? index(0) : idx[bd[i]]);
      return in;
    });
  }

  // Dims equal at both ends map one to one; the middle is flattened and unflattened.
  ENode* reshape(const meshfuse::Expr* e, const std::vector<int64_t>& shape) {
    ENode* x = operand(e->input(size_t{0}));
    const std::vector<int64_t> in = x->shape, out = shape;
    const size_t ri = in.size(), ro = out.size();
    size_t p = 0, q = 0;
    while (p < ri && p < ro && in[p] == out[p]) ++p;
    while (q + p < ri && q + p < ro && in[ri - 1 - q] == out[ro - 1 - q]) ++q;
    return indexNode(x, shape, [in, out, p, q](const std::vector<Expr>& idx) {
      const size_t ri = in.size(), ro = out.size();
      std::vector<Expr> r(ri);
      for (size_t d = 0; d < p; ++d) r[d] = idx[d];
      for (size_t j = 0; j < q; ++j) r[ri - 1 - j] = idx[ro - 1 - j];
      std::vector<Expr> mid_idx(idx.begin() + static_cast<int64_t>(p), idx.begin() + static_cast<int64_t>(ro - q));
      std::vector<int64_t> mid_shape(out.begin() + static_cast<int64_t>(p), out.begin() + static_cast<int64_t>(ro - q));
      Expr flat = linearize(mid_idx, mid_shape);
      for (size_t d = ri - q; d-- > p;) {
        if (d == p) {
          r[d] = flat;
        } else {
          r[d] = binary(Op::Rem, flat, index(in[d]));
          flat = binary(Op::Div, flat, index(in[d]));
        }
      }
      return r;
    });
  }

  ENode* slice(const meshfuse::Expr* e, const std::vector<int64_t>& shape) {
    ENode* x = operand(e->input(size_t{0}));
    const auto& starts = e->attr<std::vector<int64_t>>("starts");
    std::vector<int64_t> offset(shape.size(), 0);
    for (size_t d = 0; d < shape.size(); ++d) {
      if (x->shape[d] == shape[d]) continue;  // not sliced here (or the local block is whole)
      offset[d] = starts.at(d);
      MF_USER_CHECK(offset[d] + shape[d] <= x->shape[d], ErrorKind::Unsupported,
                    "slice: dim {} is sliced [{}, {}) but the local block of the operand has only {} elements "
                    "(slicing a sharded dim is not supported)",
                    d, starts[d], starts[d] + shape[d], x->shape[d]);
    }
    return indexNode(x, shape, [offset](const std::vector<Expr>& idx) {
      std::vector<Expr> in;
      for (size_t d = 0; d < idx.size(); ++d) in.push_back(add(idx[d], index(offset[d])));
      return in;
    });
  }

  ENode* asF32(ENode* x) {
    if (x->type == Type::F32) return x;
    return map(x->shape, Type::F32, DataType::Float, {x}, [](const auto& a) { return cast(a[0], Type::F32); });
  }

  ENode* softmax(const meshfuse::Expr* e, const std::vector<int64_t>& shape) {
    ENode* x = asF32(operand(e->input(size_t{0})));
    int64_t dim = e->attr<int64_t>("dim");
    dim = dim < 0 ? dim + static_cast<int64_t>(shape.size()) : dim;
    ENode* mx = unreduce(reduce(x, {dim}, true), shape, {dim});
    ENode* ex = map(shape, Type::F32, DataType::Float, {x, mx},
                    [](const auto& a) { return unary(Op::Exp, binary(Op::Sub, a[0], a[1])); });
    ENode* sum = unreduce(reduce(ex, {dim}, false), shape, {dim});
    const DataType odt = e->output()->dtype();
    if (e->kind() == OpKind::LogSoftmax)
      return map(shape, Type::F32, odt, {x, mx, sum}, [odt](const auto& a) {
        return roundTo(binary(Op::Sub, binary(Op::Sub, a[0], a[1]), unary(Op::Log, a[2])), odt);
      });
    return map(shape, Type::F32, odt, {ex, sum},
               [odt](const auto& a) { return roundTo(binary(Op::Div, a[0], a[1]), odt); });
  }

  // A Map of `operands` (all of `shape`, or rank 0) whose formula also reads the element's index.
  ENode* indexedMap(std::vector<int64_t> shape, Type t, DataType dt, std::vector<ENode*> ops,
                    std::function<Expr(const std::vector<Expr>&, const std::vector<Expr>&)> f) {
    ENode n{ENode::Map, std::move(shape), t, dt, std::move(ops)};
    n.indexed_formula = std::move(f);
    return addNode(std::move(n));
  }

  ENode* indexing(const meshfuse::Expr* e, const std::vector<int64_t>& shape) {
    const DataType odt = e->output()->dtype();
    if (e->kind() == OpKind::OneHot) {  // y[i..., c] = (indices[i...] == c)
      ENode* idx = operand(e->input(size_t{0}));
      const size_t r = idx->shape.size();
      ENode* wide = indexNode(idx, shape, [r](const std::vector<Expr>& i) {
        return std::vector<Expr>(i.begin(), i.begin() + static_cast<int64_t>(r));
      });
      return indexedMap(shape, Type::F64, odt, {wide}, [](const auto& a, const auto& i) {
        return select(binary(Op::Eq, cast(a[0], Type::F64), cast(i.back(), Type::F64)), constant(1, Type::F64),
                      constant(0, Type::F64));
      });
    }
    if (e->kind() == OpKind::Embedding) {  // a table element, exactly: no rounding
      ENode* table = operand(e->input(size_t{0}));
      ENode n{ENode::Gather, shape, computeType(odt), odt, {table, operand(e->input(size_t{1}))}};
      n.grouped = table->shape.size() == 3;
      n.rows = table->shape[table->shape.size() - 2];
      return addNode(std::move(n));
    }
    // embedding_backward: the scatter-add in f32, rounded once to the output dtype
    ENode n{ENode::Scatter,
            shape,
            Type::F32,
            DataType::Float,
            {asF32(operand(e->input(size_t{0}))), operand(e->input(size_t{1}))}};
    n.grouped = e->attr<bool>("grouped");
    n.rows = shape.at(n.grouped ? 1 : 0);
    ENode* sc = addNode(std::move(n));
    if (odt == DataType::Float) return sc;
    return map(shape, Type::F32, odt, {sc}, [odt](const auto& a) { return roundTo(a[0], odt); });
  }

  // Per element: log(sum(exp(x - max))) + max - x[target] (0 where target == ignore_index), the
  // target's logit as a sum over the classes of x where the class is the target (0 for a target
  // outside [0, C)); then "none", "sum" or "mean" (over the counted elements). In f32.
  ENode* crossEntropy(const meshfuse::Expr* e, const std::vector<int64_t>& shape) {
    ENode* x = asF32(operand(e->input(size_t{0})));
    ENode* t = operand(e->input(size_t{1}));
    const std::vector<int64_t> xs = x->shape, ts = t->shape;
    const int64_t cd = xs.size() >= 2 ? 1 : 0;
    const double ignore = static_cast<double>(e->attr<int64_t>("ignore_index"));
    const std::string reduction = e->attr<std::string>("reduction");
    ENode* m = reduce(x, {cd}, true);
    ENode* ex = map(xs, Type::F32, DataType::Float, {x, unreduce(m, xs, {cd})},
                    [](const auto& a) { return unary(Op::Exp, binary(Op::Sub, a[0], a[1])); });
    ENode* s = reduce(ex, {cd}, false);
    ENode* at_target =
        indexedMap(xs, Type::F32, DataType::Float, {x, unreduce(t, xs, {cd})}, [cd](const auto& a, const auto& i) {
          return select(binary(Op::Eq, cast(a[1], Type::F64), cast(i[cd], Type::F64)), a[0], constant(0, Type::F32));
        });
    ENode* picked = reduce(at_target, {cd}, false);
    auto counted = [ignore](const Expr& target) {
      return binary(Op::Ne, cast(target, Type::F64), constant(ignore, Type::F64));
    };
    ENode* loss = map(ts, Type::F32, DataType::Float, {s, m, picked, t}, [counted](const auto& a) {
      return select(counted(a[3]), binary(Op::Sub, add(unary(Op::Log, a[0]), a[1]), a[2]), constant(0, Type::F32));
    });
    if (reduction == "none") return loss;
    std::vector<int64_t> all;
    for (int64_t d = 0; d < static_cast<int64_t>(ts.size()); ++d) all.push_back(d);
    ENode* total = all.empty() ? loss : reduce(loss, all, false);
    if (reduction == "sum") return map(shape, Type::F32, DataType::Float, {total}, [](const auto& a) { return a[0]; });
    ENode* valid = map(ts, Type::F32, DataType::Float, {t}, [counted](const auto& a) {
      return select(counted(a[0]), constant(1, Type::F32), constant(0, Type::F32));
    });
    ENode* count = all.empty() ? valid : reduce(valid, all, false);
    return map(shape, Type::F32, DataType::Float, {total, count},
               [](const auto& a) { return binary(Op::Div, a[0], a[1]); });
  }

  // layer_norm: (x - mean) / sqrt(var + eps) * w + b; rms_norm: x / sqrt(mean(x^2) + eps) * w.
  ENode* norm(const meshfuse::Expr* e, const std::vector<int64_t>& shape) {
    const bool layer = e->kind() == OpKind::LayerNorm;
    const int64_t last = static_cast<int64_t>(shape.size()) - 1;
    const double n = static_cast<double>(shape.back()), eps = e->attr<double>("eps");
    ENode* x = asF32(operand(e->input(size_t{0})));
    auto meanOver = [&](ENode* v) {
      ENode* s = reduce(v, {last}, false);
      return unreduce(map(s->shape, Type::F32, DataType::Float, {s},
                          [n](const auto& a) { return binary(Op::Div, a[0], constant(n, Type::F32)); }),
                      shape, {last});
    };
    ENode* centered = x;
    if (layer) {
      ENode* mean = meanOver(x);
      centered =
          map(shape, Type::F32, DataType::Float, {x, mean}, [](const auto& a) { return binary(Op::Sub, a[0], a[1]); });
    }
    ENode* sq = map(shape, Type::F32, DataType::Float, {centered}, [](const auto& a) { return mul(a[0], a[0]); });
    ENode* var = meanOver(sq);
    std::vector<ENode*> ops = {centered, var};
    const Val* w = e->input("weight");
    const Val* b = layer ? e->input("bias") : nullptr;
    if (w) ops.push_back(lastDimParam(asF32(operand(w)), shape));
    if (b) ops.push_back(lastDimParam(asF32(operand(b)), shape));
    const bool has_w = w != nullptr, has_b = b != nullptr;
    const DataType odt = e->output()->dtype();
    return map(shape, Type::F32, odt, ops, [eps, has_w, has_b, odt](const auto& a) {
      Expr inv = unary(Op::Rsqrt, add(a[1], constant(eps, Type::F32)));
      Expr y = mul(a[0], inv);
      if (has_w) y = mul(y, a[2]);
      if (has_b) y = add(y, a[has_w ? 3 : 2]);
      return roundTo(y, odt);
    });
  }

  const LocalShapeFn& shape_of_;
  ElementGraph& g_;
  std::map<const Val*, ENode*> values_;
};

}  // namespace

ElementGraph buildElementGraph(const Segment& seg, const LocalShapeFn& shape_of, const Program& program) {
  ElementGraph g;
  GraphBuilder b(shape_of, g);
  MF_CHECK(program.buffers.size() >= seg.inputs.size(), "the segment's input buffers come first");
  for (size_t i = 0; i < seg.inputs.size(); ++i) b.input(seg.inputs[i], static_cast<int64_t>(i));
  for (const meshfuse::Expr* e : seg.exprs) b.build(e);
  for (const TensorView* out : seg.outputs) g.outputs.push_back(b.valueOf(out));
  return g;
}

}  // namespace meshfuse::kir
