// Device detection and properties (see cuda_device.h). cudart loads the driver (libcuda.so.1)
// lazily at the first call, so a process without a driver gets an error code here, not a crash.
#include "runtime/cuda/cuda_device.h"

#include <cuda_runtime_api.h>

#include "meshfuse/error.h"
#include "runtime/environment.h"
#include "runtime/cuda/cuda_error.h"

namespace meshfuse::cuda {
namespace {

std::string versionString(int v) { return v <= 0 ? "none" : fmt::format("{}.{}", v / 1000, (v % 1000) / 10); }

}  // namespace

std::string unavailableReason() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaSuccess && count > 0) return "";
  (void)cudaGetLastError();
  if (err == cudaSuccess) return "the driver reports no CUDA device";
  std::string why = fmt::format("{} ({})", cudaGetErrorString(err), cudaGetErrorName(err));
  if (err == cudaErrorInsufficientDriver)
    why += fmt::format(": no NVIDIA driver (libcuda.so.1) was found, or it is older than the CUDA {} runtime",
                       runtimeVersionString());
  if (err == cudaErrorNoDevice) why += ": CUDA_VISIBLE_DEVICES may hide every GPU";
  return why;
}

int requireDevice(int requested) {
  std::string why = unavailableReason();
  MF_USER_CHECK(why.empty(), ErrorKind::Runtime, "no CUDA device: {} (use --device=cpu)", why);
  int count = 0;
  MF_CUDA_CHECK(cudaGetDeviceCount(&count));
  int device = requested;
  if (device < 0) {
    // Each rank of a multi-GPU node its own GPU (NCCL needs it), else the thread's current one.
    int64_t local_rank = readRuntimeEnvironment().local_rank;
    if (local_rank >= 0 && count > 0) {
      device = static_cast<int>(local_rank % count);
    } else {
      MF_CUDA_CHECK(cudaGetDevice(&device));
    }
  }
  MF_USER_CHECK(device < count, ErrorKind::Value, "CUDA device {} requested but this process sees {} device(s)",
                device, count);
  return device;
}

DeviceProperties deviceProperties(int device) {
  cudaDeviceProp p{};
  MF_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  DeviceProperties d;
  d.index = device;
  d.name = p.name;
  d.major = p.major;
  d.minor = p.minor;
  d.sm_count = p.multiProcessorCount;
  d.memory_bytes = static_cast<int64_t>(p.totalGlobalMem);
  d.l2_bytes = p.l2CacheSize;
  d.shared_per_block_optin = static_cast<int64_t>(p.sharedMemPerBlockOptin);
  for (unsigned char c : p.uuid.bytes) d.uuid += fmt::format("{:02x}", c);
  return d;
}

std::string driverVersionString() {
  int v = 0;
  if (cudaDriverGetVersion(&v) != cudaSuccess) (void)cudaGetLastError();
  return versionString(v);
}

std::string runtimeVersionString() {
  int v = 0;
  if (cudaRuntimeGetVersion(&v) != cudaSuccess) (void)cudaGetLastError();
  return versionString(v);
}

}  // namespace meshfuse::cuda
