// NVRTC, cuBLASLt and NCCL, loaded with dlopen when first used instead of linked.
//
// Why: a process often holds a second copy of these libraries -- PyTorch's, from its own wheels,
// usually newer. Libraries are found by soname, so whichever copy loads first serves both; if
// ours (older) loaded first, torch fails to import ("undefined symbol: ncclCommResume"). Loading
// on first use lets torch's copy win when torch is already imported, keeps `import meshfuse`
// free of them, and lets binaries load where they are not installed (cudart itself is linked
// statically for the same reason, and finds the driver at run time).
//
// Files in this directory call the API as dyn::<usual name>(...): the forwarding functions below
// (qualified, so that argument-dependent lookup cannot pick the headers' declarations instead).
#pragma once

#include <cublasLt.h>
#include <nccl.h>
#include <nvrtc.h>

namespace meshfuse::cuda {

#define MF_NVRTC_API(X)                                                                                 \
  X(nvrtcVersion) X(nvrtcGetErrorString) X(nvrtcCreateProgram) X(nvrtcDestroyProgram) X(nvrtcCompileProgram) \
  X(nvrtcGetProgramLogSize) X(nvrtcGetProgramLog) X(nvrtcGetPTXSize) X(nvrtcGetPTX) X(nvrtcGetCUBINSize)      \
  X(nvrtcGetCUBIN)

#define MF_CUBLASLT_API(X)                                                                               \
  X(cublasLtGetVersion) X(cublasLtGetStatusName) X(cublasLtGetStatusString) X(cublasLtCreate)             \
  X(cublasLtDestroy) X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy)                              \
  X(cublasLtMatmulDescSetAttribute) X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy)           \
  X(cublasLtMatrixLayoutSetAttribute) X(cublasLtMatmulPreferenceCreate) X(cublasLtMatmulPreferenceDestroy) \
  X(cublasLtMatmulPreferenceSetAttribute) X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmul)

#define MF_NCCL_API(X)                                                                                  \
  X(ncclGetVersion) X(ncclGetErrorString) X(ncclGetLastError) X(ncclGetUniqueId) X(ncclCommInitRank)    \
  X(ncclCommFinalize) X(ncclCommDestroy) X(ncclCommAbort) X(ncclCommGetAsyncError) X(ncclAllGather)     \
  X(ncclReduceScatter) X(ncclAllReduce) X(ncclBroadcast) X(ncclReduce) X(ncclSend) X(ncclRecv)          \
  X(ncclGroupStart) X(ncclGroupEnd)

#define MF_API_MEMBER(f) decltype(&::f) f = nullptr;
struct NvrtcApi {
  MF_NVRTC_API(MF_API_MEMBER)
};
struct CublasLtApi {
  MF_CUBLASLT_API(MF_API_MEMBER)
};
struct NcclApi {
  MF_NCCL_API(MF_API_MEMBER)
};
#undef MF_API_MEMBER

// Loaded on first call; RuntimeError naming the library and where it was looked for when absent.
const NvrtcApi& nvrtcApi();
const CublasLtApi& cublasLtApi();
const NcclApi& ncclApi();

namespace dyn {
#define MF_API_FORWARD(api, f)                                          \
  template <typename... Args>                                           \
  inline auto f(Args... args) {                                         \
    return api().f(args...);                                            \
  }
#define MF_NVRTC_FORWARD(f) MF_API_FORWARD(nvrtcApi, f)
#define MF_CUBLASLT_FORWARD(f) MF_API_FORWARD(cublasLtApi, f)
#define MF_NCCL_FORWARD(f) MF_API_FORWARD(ncclApi, f)
MF_NVRTC_API(MF_NVRTC_FORWARD)
MF_CUBLASLT_API(MF_CUBLASLT_FORWARD)
MF_NCCL_API(MF_NCCL_FORWARD)
#undef MF_NVRTC_FORWARD
#undef MF_CUBLASLT_FORWARD
#undef MF_NCCL_FORWARD
#undef MF_API_FORWARD
}  // namespace dyn

}  // namespace meshfuse::cuda
