// dead-code-elimination: removes every Expr whose result reaches no fusion output.
//   requires: nothing.   guarantees: every Expr output is used or is a fusion output.
//   before: %1 = exp(%0); %2 = neg(%0); output %2    after: %2 = neg(%0); output %2
#pragma once

namespace meshfuse {
class Fusion;
void eliminateDeadCode(Fusion& fusion);
}  // namespace meshfuse
