// Turning CUDA runtime error codes into meshfuse errors. A failing CUDA call is a RuntimeError
// (the device, the driver or memory failed), naming the call and CUDA's own error name, so that
// a user can tell "out of memory" from "no driver" from a kernel fault.
#pragma once

#include <cuda_runtime_api.h>

#include "meshfuse/error.h"

namespace meshfuse::cuda {

[[noreturn]] void throwCudaError(cudaError_t err, const char* call, const char* file, int line);

inline void check(cudaError_t err, const char* call, const char* file, int line) {
  if (err != cudaSuccess) throwCudaError(err, call, file, line);
}

}  // namespace meshfuse::cuda

// MF_CUDA_CHECK(cudaMalloc(&p, n)): throws RuntimeError "CUDA error in cudaMalloc(&p, n): ...".
#define MF_CUDA_CHECK(call) ::meshfuse::cuda::check((call), #call, __FILE__, __LINE__)
