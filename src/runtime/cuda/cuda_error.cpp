// CUDA runtime errors as RuntimeErrors (see cuda_error.h).
#include "runtime/cuda/cuda_error.h"

namespace meshfuse::cuda {

void throwCudaError(cudaError_t err, const char* call, const char* file, int line) {
  (void)cudaGetLastError();  // clear a non-sticky error so that the next call does not see it
  std::string hint;
  if (err == cudaErrorMemoryAllocation) hint = " (the GPU is out of memory)";
  if (err == cudaErrorIllegalAddress || err == cudaErrorLaunchFailure)
    hint = " (a kernel faulted; the CUDA context is unusable now: run under compute-sanitizer to find it)";
  userError(ErrorKind::Runtime, "CUDA error in {}: {} ({}){} [{}:{}]", call, cudaGetErrorString(err),
            cudaGetErrorName(err), hint, file, line);
}

}  // namespace meshfuse::cuda
