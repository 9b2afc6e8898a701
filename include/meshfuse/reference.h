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

// Evaluates one op on (local) operand tensors, aligned with e->inputs() (nullptr for scalars
// and absent optional operands), into a tensor of `out_shape`. The reference kernel of the CPU
// backend until generated kernels land.
Tensor evaluateExpr(const Expr* e, const std::vector<const Tensor*>& operands, const std::vector<int64_t>& out_shape);

}  // namespace meshfuse
