// The host-staged communicator (cuda.h: makeHostStagedCommunicator), with its memory operations
// behind an interface so that the staging logic is unit-tested with host memory.
//
// Per call: each buffer that lives on the device gets a host twin. Send data is copied to its
// twin after the current stream finished producing it; the inner (host) communicator runs on
// the twins; Work::wait() waits for the inner operation, then copies received data back to the
// device on the waiting task's stream. Which buffers are read and written follows the
// collective and this rank's role (communicator.h's pictures):
//
//   collective      reads (elements)            writes (elements)
//   allgather       send: count                 recv: count * team
//   reduce_scatter  send: count * team          recv: count
//   allreduce       send: count                 recv: count        (send == recv: in place)
//   all_to_all      send: count * team          recv: count * team
//   broadcast       buf on the root: count      buf elsewhere: count
//   reduce          send: count                 recv on the root: count
//   gather          send: count                 recv on the root: count * team
//   scatter         send on the root: count*team recv: count
//   send / recv     buf: count                  buf: count
//   sendRecv        send: send_count            recv: recv_count
#pragma once

#include <cstddef>
#include <memory>

#include "meshfuse/communicator.h"

namespace meshfuse::cuda {

class StagingMemory {
 public:
  virtual ~StagingMemory() = default;
  // Whether `p` is device memory (then it is staged; host memory is passed through).
  virtual bool onDevice(const void* p) = 0;
  // Host memory for a twin of `bytes` bytes; reusable once the last reference is gone and the
  // copies that used it finished.
  virtual std::shared_ptr<void> hostBuffer(size_t bytes) = 0;
  // device -> host, complete on return, after the work already queued on the current stream.
  virtual void toHost(void* host, const void* device, size_t bytes) = 0;
  // host -> device on the current stream (may complete later, in stream order).
  virtual void toDevice(void* device, const void* host, size_t bytes) = 0;
};

// CUDA staging: pinned host twins, copies on the current task's stream.
std::shared_ptr<StagingMemory> makeCudaStagingMemory();

std::unique_ptr<Communicator> makeHostStagedCommunicator(std::unique_ptr<Communicator> inner,
                                                         std::shared_ptr<StagingMemory> memory);

}  // namespace meshfuse::cuda
