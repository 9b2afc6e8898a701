// Do the ranks agree on what they were given? The C++ counterpart of python/meshfuse/_agreement.py
// (same protocol, same messages), for MultiDeviceExecutor (ExecutorOptions::check_inputs).
//
// Ranks given inputs that differ where they must agree (one passes bf16 where the others pass
// f32, Shard(0) where the others replicate, another global shape) would compile different
// programs: one raises while the others wait in a collective, or they enter different
// collectives, until MESHFUSE_COMM_TIMEOUT aborts the job. agreeOnFields() instead raises the
// same ValueError on every rank, naming what differs and which ranks had what.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "runtime/backend.h"
#include "meshfuse/communicator.h"

namespace meshfuse {

// (label, value): ("input 0 (%x) dtype", "f32"). A rank whose value of a label is "?" does not
// know it (a rank outside an input's mesh, given no global shape): it agrees with any value.
using AgreementFields = std::vector<std::pair<std::string, std::string>>;

// Collective over `team` (global ranks): throws UserError(Value) "WHAT: the ranks disagree:
// input 0 (%x) dtype is bf16 on rank 1 but f32 on ranks 0, 2, 3" on every member unless they all
// pass the same fields. A rank that already failed passes {{"error", its message}}: the others then
// fail with "WHAT: rank 1 failed: ...". Cost when they agree: one allgather of two int64 per rank
// (a digest and a length); a second one carries the fields only when the digests differ. Buffers
// go through `backend` (device memory for a GPU communicator).
void agreeOnFields(Communicator& comm, Backend& backend, const std::string& what, const AgreementFields& fields,
                   const Team& team);

// The message part of a disagreement among {rank: fields}, or "" when they agree ("?" values
// agree with anything): "the ranks disagree: LABEL is A on rank 1 but B on ranks 0, 2" or "rank 1
// failed: MESSAGE". Against the most common fields (ties: those of the lowest rank).
std::string describeDisagreement(const std::vector<std::pair<int64_t, AgreementFields>>& per_rank);

}  // namespace meshfuse
