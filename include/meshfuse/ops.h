// The C++ front end: nvFuser-style op functions over TensorViews of one Fusion.
//
//   Fusion f;
//   TensorView* inp = f.defineTensor({-1, 64}, DataType::Float, "inp");
//   TensorView* w = f.defineTensor({256, 64}, DataType::Float, "w");
//   TensorView* y = ops::gelu(ops::linear(inp, w), "tanh");
//   f.addOutput(y);
//
// Every function checks its operands and throws a typed UserError naming the op and tensors.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "meshfuse/ir/fusion.h"

namespace meshfuse::ops {

// An operand of a pointwise op: a tensor or a scalar constant.
class Operand {
 public:
  Operand(TensorView* tv) : tv_(tv) {}  // NOLINT: implicit by design
  Operand(double v) : value_(v), dtype_(DataType::Float) {}
  Operand(int v) : value_(v), dtype_(DataType::Int64) {}
  Operand(int64_t v) : value_(static_cast<double>(v)), dtype_(DataType::Int64) {}
  Val* in(Fusion& f) const { return tv_ ? static_cast<Val*>(tv_) : f.scalar(value_, dtype_); }
  TensorView* tensor() const { return tv_; }

 private:
  TensorView* tv_ = nullptr;
  double value_ = 0;
  DataType dtype_ = DataType::Float;
};

TensorView* neg(TensorView* x);
TensorView* abs(TensorView* x);
TensorView* exp(TensorView* x);
TensorView* log(TensorView* x);
TensorView* sqrt(TensorView* x);
TensorView* rsqrt(TensorView* x);
TensorView* reciprocal(TensorView* x);
TensorView* tanh(TensorView* x);
TensorView* sigmoid(TensorView* x);
TensorView* relu(TensorView* x);
TensorView* silu(TensorView* x);
TensorView* gelu(TensorView* x, const std::string& approximate = "none");  // "none" | "tanh"

TensorView* add(Operand x, Operand y);
TensorView* sub(Operand x, Operand y);
TensorView* mul(Operand x, Operand y);
TensorView* div(Operand x, Operand y);
TensorView* pow(Operand x, Operand y);
TensorView* maximum(Operand x, Operand y);
TensorView* minimum(Operand x, Operand y);
TensorView* eq(Operand x, Operand y);
TensorView* ne(Operand x, Operand y);
TensorView* lt(Operand x, Operand y);
TensorView* le(Operand x, Operand y);
TensorView* gt(Operand x, Operand y);
TensorView* ge(Operand x, Operand y);
TensorView* where(TensorView* cond, Operand x, Operand y);

TensorView* cast(TensorView* x, DataType dtype);
TensorView* set(TensorView* x);
// keepdim re-inserts the reduced dims as size-1 dims (a broadcast_in_dim after the reduction).
TensorView* sum(TensorView* x, std::vector<int64_t> dims, bool keepdim = false);
TensorView* max(TensorView* x, std::vector<int64_t> dims, bool keepdim = false);
TensorView* mean(TensorView* x, std::vector<int64_t> dims, bool keepdim = false);

TensorView* linear(TensorView* x, TensorView* weight, TensorView* bias = nullptr);
TensorView* matmul(TensorView* a, TensorView* b);

TensorView* broadcastInDim(TensorView* x, std::vector<int64_t> shape, std::vector<int64_t> broadcast_dims);
TensorView* reshape(TensorView* x, std::vector<int64_t> shape);
TensorView* permute(TensorView* x, std::vector<int64_t> dims);
TensorView* slice(TensorView* x, std::vector<int64_t> starts, std::vector<int64_t> ends);
TensorView* cat(const std::vector<TensorView*>& xs, int64_t dim);

TensorView* softmax(TensorView* x, int64_t dim);
TensorView* logSoftmax(TensorView* x, int64_t dim);
TensorView* layerNorm(TensorView* x, TensorView* weight = nullptr, TensorView* bias = nullptr, double eps = 1e-5);
TensorView* rmsNorm(TensorView* x, TensorView* weight = nullptr, double eps = 1e-6);
// `scale` multiplies the scores; none means 1/sqrt(head size), as in PyTorch. An explicit 0 is
// refused (it would zero every score), which also keeps the IR's "0 = default" encoding unambiguous.
TensorView* sdpa(TensorView* q, TensorView* k, TensorView* v, bool is_causal = false,
                 std::optional<double> scale = std::nullopt);
// The log-sum-exp of sdpa's scores per (batch, head, query row), f32; `scale` as for sdpa.
TensorView* sdpaLse(TensorView* q, TensorView* k, bool is_causal = false, std::optional<double> scale = std::nullopt);
// The gradient of sdpa(q, k, v, is_causal, scale) for output gradient `grad` with respect to
// `wrt` ("query", "key" or "value"), shaped like that operand; `scale` as for sdpa. `lse` and
// `delta` (both or neither): the forward's sdpa_lse(q, k) and rowsum(grad * sdpa(q, k, v)) over the
// last dim, f32 [b, heads, s], which let its rows split (ops.def).
TensorView* sdpaGrad(TensorView* q, TensorView* k, TensorView* v, TensorView* grad, const std::string& wrt,
                     bool is_causal = false, std::optional<double> scale = std::nullopt, TensorView* lse = nullptr,
                     TensorView* delta = nullptr);

// Training ops (docs/training.md). `indices` and `target` are i64.
// weight [V, H] (or grouped [G, V, H] with indices [G, ...]) -> [indices..., H]; an index outside
// [0, V) gives a zero row.
TensorView* embedding(TensorView* weight, TensorView* indices);
// The scatter-add gradient of embedding: [num_weights, H] (grouped: [G, num_weights, H]).
TensorView* embeddingBackward(TensorView* grad, TensorView* indices, int64_t num_weights, bool grouped = false);
// i64 [indices..., num_classes]: 1 where the class is the index.
TensorView* oneHot(TensorView* indices, int64_t num_classes);
// logits [N, C, d...] (or [C]), target [N, d...] (or a scalar); reduction "mean", "sum" or "none".
// The loss is f32 (computed in f32 whatever the logits' dtype).
TensorView* crossEntropy(TensorView* logits, TensorView* target, int64_t ignore_index = -100,
                         const std::string& reduction = "mean");

}  // namespace meshfuse::ops
