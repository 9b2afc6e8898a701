// Which CUDA devices this process can use, and what they are. Everything here works on machines
// without a driver or a GPU: it reports why there is none instead of failing.
#pragma once

#include <cstdint>
#include <string>

namespace meshfuse::cuda {

// "" when at least one device is usable, else the driver's reason ("CUDA driver version is
// insufficient for CUDA runtime version (cudaErrorInsufficientDriver): no NVIDIA driver ...").
std::string unavailableReason();

// Throws RuntimeError "no CUDA device: <reason>" when none is usable; returns the device to use:
// `requested`, or for -1 the calling thread's current device. Checks that it exists.
int requireDevice(int requested);

struct DeviceProperties {
  int index = 0;
  std::string name;
  int major = 0, minor = 0;  // compute capability
  int sm_count = 0;
  int64_t memory_bytes = 0;
  int64_t l2_bytes = 0;
  int64_t shared_per_block_optin = 0;  // bytes a block may use after cudaFuncSetAttribute
  std::string uuid;                    // identifies the GPU across processes (hex)
  int arch() const { return major * 10 + minor; }  // 90 for sm_90
};
DeviceProperties deviceProperties(int device);

// Versions as "13.0" (driver and runtime), for logs and the compile cache key.
std::string driverVersionString();
std::string runtimeVersionString();

}  // namespace meshfuse::cuda
