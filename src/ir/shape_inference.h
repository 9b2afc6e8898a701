// Output shape and dtype of a new op (used by Fusion::apply; errors name op and tensors).
#pragma once

#include <vector>

#include "meshfuse/ir/fusion.h"

namespace meshfuse {

struct InferredOutput {
  DataType dtype;
  std::vector<IterDomain*> logical;
};

InferredOutput inferOutput(Fusion& f, OpKind kind, const std::vector<Val*>& inputs,
                           const Attributes& attrs);

// Normalizes a possibly negative dim index against `rank`; ShapeError naming `what` otherwise.
int64_t normalizeDim(int64_t dim, int64_t rank, const std::string& what);

}  // namespace meshfuse
