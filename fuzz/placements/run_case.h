// Running one placement-fuzzer case on every rank of the world (under mpirun) and checking it:
//   (a) every output, gathered, matches the single-device reference (compareWithReference);
//   (b) the collectives each rank executed equal its program's static report (collectives());
//   (c) where the oracle applies (oracle.h), the bytes all ranks' collectives send are at most the oracle's minimum
//       for the same input placements, reaching the same output placements (pins, and for an
//       unpinned output the placement meshfuse gave it), over the plans with no more collectives
//       and no more work per rank than meshfuse's (oracle.h: what the priority ranks first).
// Every rank calls runCase with the same case; the verdict is agreed between the ranks.
#pragma once

#include <string>

#include "case_spec.h"
#include "meshfuse/communicator.h"
#include "oracle.h"

namespace meshfuse::placement_fuzz {

struct CaseResult {
  enum Status { Pass, Refused, Invalid, Fail } status = Pass;
  std::string detail;     // Fail: which check and why; Refused/Invalid: the error message
  std::string plan;       // meshfuse's collectives (rank 0's, with the total over ranks)
  int64_t plan_wire_times_n = 0;  // bytes sent, summed over the ranks, times the mesh's size (oracle.h)
  PlanBounds plan_bounds;         // meshfuse's collectives and work per rank
  OraclePlan oracle;
  std::vector<std::vector<Placement>> output_placements;  // what meshfuse gave each output
};

CaseResult runCase(const CaseSpec& c, Communicator& world);

// The definition with its inputs placed on the case's mesh (what a reproducer prints).
std::unique_ptr<Fusion> placedDefinition(const CaseSpec& c);
// What every rank's compiled program would send (from its static collectives report, summed over
// the ranks, times the mesh's size), without running: what check (c) holds against the oracle, for tests
// without MPI.
int64_t plannedWireTimesN(std::unique_ptr<Fusion> placed, int64_t ranks);
// The work per rank of meshfuse's plan for `placed`, as the oracle and the plan search count it:
// the elements each compute op (not a `set`) reads and writes on one rank, summed over the ops of
// the decomposed fusion (before the permutes that lay out a collective's blocks).
int64_t plannedWork(std::unique_ptr<Fusion> placed);
// meshfuse's plan for `placed` in the oracle's bounds (rank 0's collectives, the work per rank).
PlanBounds plannedBounds(std::unique_ptr<Fusion> placed);

// The failure report: the program, the placements, meshfuse's plan and the oracle's.
std::string report(const CaseSpec& c, const CaseResult& r);

}  // namespace meshfuse::placement_fuzz
