// Names of the user-error kinds (the Python exception class names).
#include "meshfuse/error.h"

namespace meshfuse {

const char* errorKindName(ErrorKind kind) {
  switch (kind) {
#define MESHFUSE_X(k, cls) \
  case ErrorKind::k:       \
    return #cls;
    MESHFUSE_ERROR_KINDS(MESHFUSE_X)
#undef MESHFUSE_X
  }
  return "Error";
}

}  // namespace meshfuse
