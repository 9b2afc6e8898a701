// The CUDA backend. Until the CUDA issue lands, building it reports clearly that it is missing.
#include "meshfuse/error.h"
#include "meshfuse/runtime/backend.h"

namespace meshfuse {

bool cudaDeviceAvailable() { return false; }

std::unique_ptr<Backend> makeCudaBackend() {
  userError(ErrorKind::Unsupported, "the CUDA backend is not built yet (see the CUDA backend issue); use --device=cpu");
}

}  // namespace meshfuse
