// What a gradient rule sees while the backward fusion is built (src/autodiff only).
#pragma once

#include <functional>
#include <vector>

#include "meshfuse/ir/fusion.h"

namespace meshfuse::autodiff {

// The backward fusion under construction, and the forward values in it.
class GradContext {
 public:
  virtual ~GradContext() = default;
  // The backward fusion's copy of forward tensor `v`: a backward input (saved) or recomputed
  // from saved ones, per the save policy.
  virtual TensorView* primal(Val* v) = 0;
  virtual Fusion& backward() = 0;
  // Whether operand `i` of the expr whose rule runs needs a gradient (a floating-point tensor on
  // a path from a wrt input): rules build only the gradients wanted, so backward has no dead code
  // and reads no tensor it does not need.
  virtual bool wants(size_t i) const = 0;
};

// One gradient per operand of `e` (nullptr: none), given the gradient `g` of e's output. The
// result need not yet match its operand's broadcast dims or dtype: the caller sums and casts it.
using GradRule = std::vector<TensorView*> (*)(GradContext& ctx, const Expr* e, TensorView* g);
GradRule gradRuleOf(OpKind kind);

// Helpers the driver shares with the rules.
// g summed over the dims where `x` has a broadcast (size-1) dim and g has not, then cast to x's
// dtype (sums in f32).
TensorView* fitGradient(TensorView* g, const TensorView* x);
// A tensor of `like`'s shape and `dtype`, all `value` (NaN-safe: where(like == like, v, v)).
TensorView* filledLike(TensorView* like, double value, DataType dtype);

}  // namespace meshfuse::autodiff
