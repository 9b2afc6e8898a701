// The CPU backend of the runtime. Until the generated-kernel path lands it runs segments with
// the reference loops (see reference_backend.cpp).
#include "meshfuse/runtime/backend.h"

namespace meshfuse {

std::unique_ptr<Backend> makeCpuBackend() { return makeReferenceBackend(); }

}  // namespace meshfuse
