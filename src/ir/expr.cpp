// Expr operand lookup by schema name.
#include "meshfuse/ir/expr.h"

namespace meshfuse {

Val* Expr::input(std::string_view n) const {
  int64_t i = info().findOperand(n);
  MF_CHECK(i >= 0, "{} has no operand named '{}'", name(), n);
  MF_CHECK(!info().operands[i].variadic, "operand '{}' of {} is variadic", n, name());
  return inputs_.at(i);
}

}  // namespace meshfuse
