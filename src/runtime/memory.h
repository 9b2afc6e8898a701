// Allocations that cannot succeed, refused before they are tried.
//
// A tensor larger than all the memory there is (a symbolic size bound to 2^40 rows) must end in a
// clear error naming the tensor, its dtype, shape and bytes, not in std::bad_alloc, a segfault or
// the OOM killer. The allocators refuse such a request with its dtype, shape and bytes
// (checkAllocation); MultiDeviceExecutor::run and `meshfuse run` check every buffer of the program
// before anything runs (checkProgramAllocations), so the error also names the tensor and the ranks
// that would hold it, and is raised identically on every rank, before any collective.
//
// "Larger than the memory there is" is decided against the whole machine (RAM + swap, bounded by
// the cgroup's limit and ulimit -v), the bound beyond which Linux refuses the allocation outright
// (overcommit heuristic) or, failing that, the process is OOM-killed when it writes the tensor. A
// tensor that fits this bound but not the memory that is free at the time is not caught here: the
// allocator's own error (with dtype, shape, bytes) reports it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshfuse/ir/extent.h"
#include "meshfuse/tensor.h"

namespace meshfuse {

struct HostProgram;

// The most bytes one tensor can take on a device, and what that memory is, for messages
// ("host memory (RAM + swap)", "memory of GPU 0").
struct MemoryLimit {
  int64_t bytes = 0;  // 0: unknown (nothing is refused)
  std::string what;
};

// This machine's host memory: physical memory plus swap, bounded by the memory cgroup's limit
// (plus swap) and by the address-space limit (ulimit -v). Read once.
const MemoryLimit& hostMemoryLimit();  // read once

// "64 TiB", "23.4 GiB", "512 bytes".
std::string formatBytes(int64_t bytes);

// A RuntimeError unless a tensor of `dtype` and `shape` fits `limit`: "cannot allocate WHAT, a
// f32 tensor of shape [1099511627776, 16]: 70368744177664 bytes (64 TiB), more than the 23.4 GiB
// of host memory (RAM + swap)". `what` names the tensor ("%y on ranks 0, 1", "input 0 (%x)"), or
// is empty. Sizes whose bytes an int64 cannot count are refused alike.
void checkAllocation(const std::string& what, DataType dtype, const std::vector<int64_t>& shape,
                     const MemoryLimit& limit);

// checkAllocation for every buffer `program` allocates (its local shape for `sizes`, the largest
// any rank holds where shards are uneven; a chunk of it inside a Stream-parallel loop). With the
// collective program (rank -1) every rank finds the same first offender, so every rank raises
// the same error before running. A buffer whose shape cannot be computed (an unbound size) is
// left to the run to report.
void checkProgramAllocations(const HostProgram& program, const SymbolBindings& sizes, const MemoryLimit& limit);

}  // namespace meshfuse
