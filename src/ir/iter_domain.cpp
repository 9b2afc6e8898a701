// IterDomain printing.
#include "meshfuse/ir/iter_domain.h"

#include <fmt/format.h>

namespace meshfuse {

std::string IterDomain::toString() const {
  std::string s = extent_.toString();
  if (type_ == IterType::Reduction) s = "r" + s;
  if (ptype_ != ParallelType::Serial) s = fmt::format("{}{{{}}}", parallelTypeName(ptype_), s);
  return s;
}

}  // namespace meshfuse
