// What every Backend shares.
#include "meshfuse/runtime/backend.h"

namespace meshfuse {

Streams& Backend::streams() {
  if (!streams_) streams_ = makeCpuStreams();
  return *streams_;
}

}  // namespace meshfuse
