// Output shape and dtype of an op (used by Fusion::apply and the verifier; errors name op and tensors).
#pragma once

#include <vector>

#include "meshfuse/ir/fusion.h"

namespace meshfuse {

// One dim of an op's output logical domain (the IterDomain is made by Fusion::apply).
struct InferredDim {
  Extent extent;
  IterType type;
  bool operator==(const InferredDim&) const = default;
};

struct InferredOutput {
  DataType dtype;
  std::vector<InferredDim> logical;
  // Extents the op requires equal that are known only at run time (Fusion::ExtentConstraint).
  std::vector<Fusion::ExtentConstraint> constraints = {};
};

// The output type of `kind` applied to `inputs` with `attrs` (defaults filled in). Has no effect
// on `f`: Fusion::apply builds the output from it, the verifier compares it with the stored one.
// Throws a typed UserError naming the op and tensors when the operands do not fit.
InferredOutput inferOutput(const Fusion& f, OpKind kind, const std::vector<Val*>& inputs, const Attributes& attrs);

// Normalizes a possibly negative dim index against `rank`; ShapeError naming `what` otherwise.
int64_t normalizeDim(int64_t dim, int64_t rank, const std::string& what);

}  // namespace meshfuse
