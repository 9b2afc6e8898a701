// The CUDA entry points of a build without the CUDA backend (MESHFUSE_CUDA=OFF, or AUTO without
// the toolkit: cmake/MeshfuseCuda.cmake). They fail the way a build with the backend fails on a
// machine without a GPU ("no CUDA device: <reason>", see docs/cuda.md), so callers, the CLI's
// --device=cuda and the GPU tests' skips need no second code path.
#include "meshfuse/error.h"
#include "runtime/backend.h"
#include "runtime/cuda.h"
#include "meshfuse_cuda_absent.h"  // MESHFUSE_CUDA_ABSENT_REASON, written by CMake

namespace meshfuse {
namespace {

constexpr const char* kReason = "meshfuse was built without CUDA: " MESHFUSE_CUDA_ABSENT_REASON;

[[noreturn]] void unavailable(const char* what) {
  userError(ErrorKind::Runtime, "no CUDA device: {} (the {} needs it; use --device=cpu)", kReason, what);
}

}  // namespace

bool cudaDeviceAvailable() { return false; }

std::string cudaDeviceDescription(int) { return std::string("no CUDA device: ") + kReason; }

std::unique_ptr<Backend> makeCudaBackend(const CudaBackendOptions&) { unavailable("CUDA backend"); }

std::unique_ptr<Backend> makeCudaBackend() { unavailable("CUDA backend"); }

std::unique_ptr<Communicator> makeNcclCommunicator(std::unique_ptr<Communicator>) { unavailable("NCCL communicator"); }

std::unique_ptr<Communicator> makeHostStagedCommunicator(std::unique_ptr<Communicator>) {
  unavailable("host-staged GPU communicator");
}

std::unique_ptr<Communicator> makeCudaCommunicator(std::unique_ptr<Communicator>) { unavailable("GPU communicator"); }

}  // namespace meshfuse
