// The CUDA side of the runtime that callers choose explicitly: backend options, device
// description, and the communicators that move device buffers (DESIGN.md "Host IR").
//
//   makeCudaBackend(options)     NVRTC kernels, cuBLASLt GEMMs, CUDA streams/events, a caching
//                                device allocator and pinned host staging (backend.h has the
//                                option-less makeCudaBackend())
//   makeNcclCommunicator(mpi)    NCCL, one process per GPU; bootstrapped over `mpi`
//   makeHostStagedCommunicator   `mpi` on device buffers staged through pinned host memory: the
//                                way several ranks share one GPU (NCCL refuses that)
//   makeCudaCommunicator(mpi)    picks one of the two for this node
//
// Every entry point builds on machines without a GPU; there they throw RuntimeError
// "no CUDA device: <the driver's reason>".
#pragma once

#include <memory>
#include <string>

#include "runtime/backend.h"
#include "meshfuse/communicator.h"

namespace meshfuse {

struct CudaBackendOptions {
  // The GPU this process uses. -1: the calling thread's current CUDA device (0 unless the
  // application chose one, as a trainer does with its local rank).
  int device = -1;
  // f32 GEMMs on TF32 tensor cores. Off by default: f32 then matches the CPU backend's f32.
  bool allow_tf32 = false;
  // Where compiled kernels (CUBIN) are cached on disk; empty: <MESHFUSE_CACHE_DIR>/cuda.
  std::string cache_dir;
};

std::unique_ptr<Backend> makeCudaBackend(const CudaBackendOptions& options);

// "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.1 GiB); driver 13.0, runtime 13.0, NVRTC 13.0,
// cuBLASLt 130000, NCCL 2.28.3" for the device `device` (-1: as CudaBackendOptions), or, without
// a usable device, "no CUDA device: <reason>".
std::string cudaDeviceDescription(int device = -1);

// NCCL communicators over the GPUs of the ranks of `bootstrap` (the `mpi` communicator, or
// `self` at world size 1): per team, the team's first rank creates the unique id and broadcasts
// it over `bootstrap` to the team's members only. Collectives run on the current CUDA stream
// (the task's stream inside the evaluator); Work::wait() makes the waiting task's stream wait for
// them. Outside a task they run on the communicator's own stream, after the caller finished
// producing the buffers (synchronize the backend's streams first), and wait() blocks the host. A collective that fails or does not finish within
// MESHFUSE_COMM_TIMEOUT aborts every NCCL communicator (ncclCommAbort) and then the job through
// bootstrap.abort(), so no peer waits forever. Requires one GPU per rank on each node.
std::unique_ptr<Communicator> makeNcclCommunicator(std::unique_ptr<Communicator> bootstrap);

// `inner`'s collectives on buffers that may live on the GPU: device buffers are copied to pinned
// host memory (after the current stream finished producing them), `inner` runs on the host
// copies, and Work::wait() copies the results back on the waiting task's stream. Host buffers
// pass through untouched. Slower than NCCL; it lets several ranks share one GPU (tests on a
// one-GPU machine) and works with any MPI.
std::unique_ptr<Communicator> makeHostStagedCommunicator(std::unique_ptr<Communicator> inner);

// For a CUDA backend: NCCL when every rank of this node has a GPU of its own, else the
// host-staged `world`. At world size 1 (`self`), NCCL over one rank.
std::unique_ptr<Communicator> makeCudaCommunicator(std::unique_ptr<Communicator> world);

}  // namespace meshfuse
