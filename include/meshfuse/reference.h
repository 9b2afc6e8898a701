// Single-device reference execution of any Fusion: obviously-correct loops in double precision,
// rounded to each op's output dtype after the op (bf16/f16 ops thus see f32-or-better math).
// It is the oracle that generated kernels and multi-rank runs are checked against.
#pragma once

#include <vector>

#include "meshfuse/ir/extent.h"
#include "meshfuse/tensor.h"

namespace meshfuse {

class Fusion;
class Expr;

// Binds the symbolic sizes of `fusion`'s inputs to the given tensors' sizes. Throws
// ValueError/ShapeError/DtypeError naming the input and both sides when the number of inputs,
// a dtype, a rank, a size, or two bindings of one symbol disagree.
SymbolBindings bindInputs(const Fusion& fusion, const std::vector<Tensor>& inputs);

// Runs the whole fusion on full (unsharded) tensors; returns one tensor per fusion output.
// Shardings are ignored: this is the single-device meaning of the definition.
std::vector<Tensor> evaluateReference(const Fusion& fusion, const std::vector<Tensor>& inputs);

// The same loops without rounding to the ops' dtypes: the definition's meaning in f64, for
// finite differences (grad-check). Input values are taken as given (not rounded to the dtype).
struct ReferenceArray {
  std::vector<int64_t> shape;
  std::vector<double> data;
};
std::vector<ReferenceArray> evaluateReferenceF64(const Fusion& fusion, const std::vector<ReferenceArray>& inputs);
// Evaluates one op on (local) operand tensors, aligned with e->inputs() (nullptr for scalars
// and absent optional operands), into a tensor of `out_shape`. The reference kernel of the CPU
// backend until generated kernels land.
Tensor evaluateExpr(const Expr* e, const std::vector<const Tensor*>& operands, const std::vector<int64_t>& out_shape);

// How a result of another execution (sharded, compiled, other backend) compares with the
// reference's. Element i passes when
//   |actual_i - ref_i| <= kReferenceToleranceEps * eps * (max_j |ref_j| + |ref_i|)
// with eps the machine epsilon of the dtype (dtypeEpsilon; 0 for i64/bool: exact). The other
// execution sums in another order (over ranks, in chunks) and, in bf16/f16, rounds partial sums
// where the reference does not; that error scales with the magnitude of the values summed, which
// the output's largest value stands for, not with each element (a small element of a large
// output carries the large rounding error). A wrong program (a dropped allreduce, a missing
// chunk) is off by much more than a few eps of the output's range.
inline constexpr double kReferenceToleranceEps = 16;
struct ReferenceComparison {
  double max_abs_err = 0;
  double max_rel_err = 0;  // |actual - ref| / |ref|, elementwise (large near zeros: information only)
  double max_ref = 0;      // max |ref|
  double allowed_abs = 0;  // the tolerance's absolute part: kReferenceToleranceEps * eps * max_ref
  bool pass = false;       // same shape and every element within the tolerance
};
ReferenceComparison compareWithReference(const Tensor& actual, const Tensor& reference);

}  // namespace meshfuse
