// Streams and events, as the host-IR evaluator uses them (DESIGN.md "Host IR": SetCurrentStream,
// Synchronize). A stream runs its tasks in submission order; tasks on different streams may run
// concurrently; an event marks a point in a stream that other streams (or the host) wait for.
//
// Stream 0 is the main stream. On CPUs (CpuStreams) it runs tasks inline on the calling thread
// and every other stream is a worker thread; a "compute" task takes the process's compute lock,
// so that at most one kernel or GEMM runs at a time per rank (one core per rank) while
// communication tasks run beside it: that is where CPU overlap comes from. A GPU backend
// implements the same interface with CUDA streams and events.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "meshfuse/trace.h"

namespace meshfuse {

class Event {
 public:
  virtual ~Event() = default;
  virtual void wait() = 0;  // blocks the calling thread until the event has happened
};

class Streams {
 public:
  virtual ~Streams() = default;
  // Runs `task` on `stream` after the stream's earlier tasks. Exceptions thrown by a task are
  // rethrown by a later synchronize() (or submit) on the host.
  virtual void submit(int64_t stream, TaskKind kind, const std::string& name, std::function<void()> task) = 0;
  // An event that happens when `stream` has run every task submitted to it so far.
  virtual std::shared_ptr<Event> record(int64_t stream) = 0;
  // Makes `stream`'s later tasks wait for `event`.
  virtual void wait(int64_t stream, std::shared_ptr<Event> event) = 0;
  // Blocks the host until every stream has run all its tasks; rethrows a task's exception.
  virtual void synchronize() = 0;

  // Timeline recording (off by default): every task's begin and end.
  virtual void setTracing(bool on) = 0;
  virtual std::vector<TraceEvent> takeTrace() = 0;
};

// Threads as streams (see above).
std::unique_ptr<Streams> makeCpuStreams();

}  // namespace meshfuse
