// Names of the collective kinds (meshfuse/ir/collective.h).
#include "meshfuse/ir/collective.h"

namespace meshfuse {

const char* commKindName(CommKind k) {
  switch (k) {
#define MESHFUSE_X(e, s) \
  case CommKind::e: return s;
    MESHFUSE_COMM_KINDS(MESHFUSE_X)
#undef MESHFUSE_X
  }
  return "?";
}

}  // namespace meshfuse
