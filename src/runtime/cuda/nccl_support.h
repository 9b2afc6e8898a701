// What the rest of the CUDA runtime (and its tests) need to know about the NCCL communicator
// without including nccl.h: its version, and the watchdog's verdict on the operations in flight.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <functional>
#include <list>
#include <string>

namespace meshfuse::cuda {

std::string ncclVersionString();  // "2.28.3"

// An operation the NCCL communicator's watchdog follows: a collective (its completion event) or a
// blocking call in progress (no event; finished when removed from the list).
struct WatchedOperation {
  cudaEvent_t event = nullptr;
  std::chrono::steady_clock::time_point deadline;
  std::string what;
};

// One poll of the watchdog: drops the operations whose event completed (`query` is
// cudaEventQuery) and returns why the job must be aborted, or "" while all is well:
//  - an event query that fails (anything but cudaSuccess and cudaErrorNotReady) fails at once,
//    naming CUDA's error: this rank's GPU failed (a kernel fault is sticky: every later query
//    reports it), so waiting out the timeout and blaming a peer would be wrong;
//  - an operation still pending past its deadline is a timeout: a peer failed, hangs, or runs a
//    different program.
std::string pollWatched(std::list<WatchedOperation>& ops, std::chrono::steady_clock::time_point now,
                        double timeout_s, const std::function<cudaError_t(cudaEvent_t)>& query);

}  // namespace meshfuse::cuda
