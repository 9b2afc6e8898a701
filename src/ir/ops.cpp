// The C++ op functions: thin wrappers over Fusion::apply.
#include "meshfuse/ops.h"

#include <algorithm>

namespace meshfuse::ops {
namespace {

Fusion& fusionOf(std::initializer_list<Operand> xs) {
  for (const Operand& x : xs)
    if (x.tensor()) return *x.tensor()->fusion();
  userError(ErrorKind::Value, "a pointwise op needs at least one tensor operand");
}

TensorView* pointwise(OpKind k, std::initializer_list<Operand> xs, Attributes attrs = {}) {
  Fusion& f = fusionOf(xs);
  std::vector<Val*> in;
  for (const Operand& x : xs) in.push_back(x.in(f));
  return f.apply(k, in, std::move(attrs));
}

Fusion& owner(TensorView* x, OpKind k) {
  MF_USER_CHECK(x != nullptr, ErrorKind::Value, "{}: the first operand is null", opInfo(k).name);
  return *x->fusion();
}

TensorView* unaryOp(OpKind k, TensorView* x) { return owner(x, k).apply(k, {x}); }

TensorView* reduction(OpKind k, TensorView* x, std::vector<int64_t> dims, bool keepdim) {
  TensorView* r = owner(x, k).apply(k, {x}, {{"dims", dims}});
  int64_t rank = x->rank();
  if (!keepdim) return r;
  std::vector<int64_t> shape, bdims;
  for (int64_t& d : dims) d = d < 0 ? d + rank : d;
  for (int64_t d = 0; d < rank; ++d) {
    bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
    shape.push_back(reduced ? 1 : -1);
    if (!reduced) bdims.push_back(d);
  }
  return broadcastInDim(r, shape, bdims);
}

}  // namespace

#define MESHFUSE_UNARY(fn, kind) \
  TensorView* fn(TensorView* x) { return unaryOp(OpKind::kind, x); }
MESHFUSE_UNARY(neg, Neg)
MESHFUSE_UNARY(abs, Abs)
MESHFUSE_UNARY(exp, Exp)
MESHFUSE_UNARY(log, Log)
MESHFUSE_UNARY(sqrt, Sqrt)
MESHFUSE_UNARY(rsqrt, Rsqrt)
MESHFUSE_UNARY(reciprocal, Reciprocal)
MESHFUSE_UNARY(tanh, Tanh)
MESHFUSE_UNARY(sigmoid, Sigmoid)
MESHFUSE_UNARY(relu, Relu)
MESHFUSE_UNARY(silu, Silu)
#undef MESHFUSE_UNARY

TensorView* gelu(TensorView* x, const std::string& approximate) {
  MF_USER_CHECK(approximate == "none" || approximate == "tanh", ErrorKind::Value,
                "gelu: approximate must be \"none\" or \"tanh\", got \"{}\"", approximate);
  return pointwise(OpKind::Gelu, {x}, {{"approximate", approximate}});
}

#define MESHFUSE_BINARY(fn, kind) \
  TensorView* fn(Operand x, Operand y) { return pointwise(OpKind::kind, {x, y}); }
MESHFUSE_BINARY(add, Add)
MESHFUSE_BINARY(sub, Sub)
MESHFUSE_BINARY(mul, Mul)
MESHFUSE_BINARY(div, Div)
MESHFUSE_BINARY(pow, Pow)
MESHFUSE_BINARY(maximum, Maximum)
MESHFUSE_BINARY(minimum, Minimum)
MESHFUSE_BINARY(eq, Eq)
MESHFUSE_BINARY(ne, Ne)
MESHFUSE_BINARY(lt, Lt)
MESHFUSE_BINARY(le, Le)
MESHFUSE_BINARY(gt, Gt)
MESHFUSE_BINARY(ge, Ge)
#undef MESHFUSE_BINARY

TensorView* where(TensorView* cond, Operand x, Operand y) { return pointwise(OpKind::Where, {cond, x, y}); }
TensorView* cast(TensorView* x, DataType dtype) { return owner(x, OpKind::Cast).apply(OpKind::Cast, {x}, {{"dtype", dtype}}); }
TensorView* set(TensorView* x) { return unaryOp(OpKind::Set, x); }
TensorView* sum(TensorView* x, std::vector<int64_t> dims, bool keepdim) { return reduction(OpKind::Sum, x, dims, keepdim); }
TensorView* max(TensorView* x, std::vector<int64_t> dims, bool keepdim) { return reduction(OpKind::Max, x, dims, keepdim); }
TensorView* mean(TensorView* x, std::vector<int64_t> dims, bool keepdim) { return reduction(OpKind::Mean, x, dims, keepdim); }

TensorView* linear(TensorView* x, TensorView* weight, TensorView* bias) {
  return owner(x, OpKind::Linear).apply(OpKind::Linear, {x, weight, bias});
}
TensorView* matmul(TensorView* a, TensorView* b) { return owner(a, OpKind::Matmul).apply(OpKind::Matmul, {a, b}); }

TensorView* broadcastInDim(TensorView* x, std::vector<int64_t> shape, std::vector<int64_t> broadcast_dims) {
  return owner(x, OpKind::BroadcastInDim).apply(OpKind::BroadcastInDim, {x}, {{"shape", shape}, {"broadcast_dims", broadcast_dims}});
}
TensorView* reshape(TensorView* x, std::vector<int64_t> shape) {
  return owner(x, OpKind::Reshape).apply(OpKind::Reshape, {x}, {{"shape", shape}});
}
TensorView* permute(TensorView* x, std::vector<int64_t> dims) {
  return owner(x, OpKind::Permute).apply(OpKind::Permute, {x}, {{"dims", dims}});
}
TensorView* slice(TensorView* x, std::vector<int64_t> starts, std::vector<int64_t> ends) {
  return owner(x, OpKind::Slice).apply(OpKind::Slice, {x}, {{"starts", starts}, {"ends", ends}});
}
TensorView* cat(const std::vector<TensorView*>& xs, int64_t dim) {
  MF_USER_CHECK(!xs.empty(), ErrorKind::Value, "cat: needs at least one tensor");
  return owner(xs[0], OpKind::Cat).apply(OpKind::Cat, std::vector<Val*>(xs.begin(), xs.end()), {{"dim", dim}});
}

TensorView* softmax(TensorView* x, int64_t dim) { return owner(x, OpKind::Softmax).apply(OpKind::Softmax, {x}, {{"dim", dim}}); }
TensorView* logSoftmax(TensorView* x, int64_t dim) {
  return owner(x, OpKind::LogSoftmax).apply(OpKind::LogSoftmax, {x}, {{"dim", dim}});
}
TensorView* layerNorm(TensorView* x, TensorView* weight, TensorView* bias, double eps) {
  return owner(x, OpKind::LayerNorm).apply(OpKind::LayerNorm, {x, weight, bias}, {{"eps", eps}});
}
TensorView* rmsNorm(TensorView* x, TensorView* weight, double eps) {
  return owner(x, OpKind::RmsNorm).apply(OpKind::RmsNorm, {x, weight}, {{"eps", eps}});
}
TensorView* sdpa(TensorView* q, TensorView* k, TensorView* v, bool is_causal, std::optional<double> scale) {
  MF_USER_CHECK(!scale || *scale != 0, ErrorKind::Value,
                "sdpa: scale 0 would zero every attention score; leave it unset for 1/sqrt(head size)");
  return owner(q, OpKind::Sdpa)
      .apply(OpKind::Sdpa, {q, k, v}, {{"is_causal", is_causal}, {"scale", scale.value_or(0.0)}});
}
TensorView* sdpaLse(TensorView* q, TensorView* k, bool is_causal, std::optional<double> scale) {
  MF_USER_CHECK(!scale || *scale != 0, ErrorKind::Value,
                "sdpa_lse: scale 0 would zero every attention score; leave it unset for 1/sqrt(head size)");
  return owner(q, OpKind::SdpaLse)
      .apply(OpKind::SdpaLse, {q, k}, {{"is_causal", is_causal}, {"scale", scale.value_or(0.0)}});
}
TensorView* sdpaGrad(TensorView* q, TensorView* k, TensorView* v, TensorView* grad, const std::string& wrt,
                     bool is_causal, std::optional<double> scale, TensorView* lse, TensorView* delta) {
  MF_USER_CHECK(!scale || *scale != 0, ErrorKind::Value,
                "sdpa_grad: scale 0 would zero every attention score; leave it unset for 1/sqrt(head size)");
  return owner(q, OpKind::SdpaGrad)
      .apply(OpKind::SdpaGrad, {q, k, v, grad, lse, delta},
             {{"wrt", wrt}, {"is_causal", is_causal}, {"scale", scale.value_or(0.0)}});
}

TensorView* embedding(TensorView* weight, TensorView* indices) {
  return owner(weight, OpKind::Embedding).apply(OpKind::Embedding, {weight, indices});
}
TensorView* embeddingBackward(TensorView* grad, TensorView* indices, int64_t num_weights, bool grouped) {
  return owner(grad, OpKind::EmbeddingBackward)
      .apply(OpKind::EmbeddingBackward, {grad, indices}, {{"num_weights", num_weights}, {"grouped", grouped}});
}
TensorView* oneHot(TensorView* indices, int64_t num_classes) {
  return owner(indices, OpKind::OneHot).apply(OpKind::OneHot, {indices}, {{"num_classes", num_classes}});
}
TensorView* crossEntropy(TensorView* logits, TensorView* target, int64_t ignore_index, const std::string& reduction) {
  return owner(logits, OpKind::CrossEntropy)
      .apply(OpKind::CrossEntropy, {logits, target}, {{"ignore_index", ignore_index}, {"reduction", reduction}});
}

}  // namespace meshfuse::ops
