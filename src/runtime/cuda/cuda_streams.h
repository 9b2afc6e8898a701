// CudaStreams: the Streams interface (streams.h) over CUDA streams and events.
//
// A task runs on the host thread at once, with its CUDA stream made current (currentStream()):
// the kernels, GEMMs, copies and NCCL collectives it enqueues run on that stream, in submission
// order, concurrently with other streams' work. Events are cudaEvent_t, waits are
// cudaStreamWaitEvent, so no host thread blocks on the GPU except in synchronize(). A task that
// throws fails at once (the exception reaches the evaluator, which synchronizes and rethrows).
//
// Tracing records a pair of timing events around each task; takeTrace() reports the GPU time
// each task's work occupied on its stream, relative to the moment tracing was switched on.
#pragma once

#include <memory>

#include "runtime/streams.h"
#include "runtime/cuda/cuda_context.h"

namespace meshfuse::cuda {

std::unique_ptr<Streams> makeCudaStreams(std::shared_ptr<CudaContext> ctx);

}  // namespace meshfuse::cuda
