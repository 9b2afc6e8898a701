// Backends by name (driver/backends.h).
#include "driver/backends.h"

#include "meshfuse/error.h"
#include "runtime/cuda.h"

namespace meshfuse {

std::unique_ptr<Backend> makeBackend(const std::string& device) {
  if (device == "cpu") return makeCpuBackend();
  if (device == "cuda") return makeCudaBackend();
  if (device == "reference") return makeReferenceBackend();
  MF_USER_CHECK(device == "auto", ErrorKind::Value, "unknown device '{}' (expected cpu, cuda, auto or reference)",
                device);
  return cudaDeviceAvailable() ? makeCudaBackend() : makeCpuBackend();
}

}  // namespace meshfuse
