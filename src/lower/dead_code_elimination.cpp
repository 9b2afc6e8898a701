#include "lower/dead_code_elimination.h"

#include "meshfuse/ir/fusion.h"

namespace meshfuse {

void eliminateDeadCode(Fusion& f) {
  // Reverse program order: removing a dead use can make its producer dead too.
  std::vector<Expr*> exprs = f.exprs();
  for (auto it = exprs.rbegin(); it != exprs.rend(); ++it) {
    bool live = false;
    for (TensorView* o : (*it)->outputs()) live |= !o->uses().empty() || f.isOutput(o);
    if (!live) f.removeExpr(*it);
  }
}

}  // namespace meshfuse
