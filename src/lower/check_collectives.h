// check-collectives: proves, before anything runs, that the per-rank host programs of one
// compiled program agree on every communication — what peers only diagnose after a hang (NCCL's
// flight recorder, torch's desync debugging). Every rank's program is derived from one shared
// program, so each rank can check all of them.
//
// Requires: one program per rank that takes part, specialized (specialize-for-rank resolved
// teams, roots and peers) and with streams assigned; the size bindings of the run (the counts
// of collectives over symbolic sizes are compared for these sizes).
// Guarantees, or throws InternalError naming both ranks and both host-IR nodes, with the
// programs of the ranks involved dumped:
//   1. for every team, the collectives its members issue agree one by one (in issue order, which
//      is program order, loops unrolled) in kind, element counts (per member where blocks
//      differ: uneven shards), dtype, reduce op and root;
//   2. every send has its recv (same peer pair and tag, in order) with the same size and dtype,
//      and every recv its send;
//   3. every wait waits for a communication its rank issued before;
//   4. the programs cannot deadlock: issuing never blocks (communications are non-blocking),
//      and a wait blocks its rank until every member of the communication has issued its part.
//      The check runs every rank's program to completion under these rules; a state where
//      every unfinished rank waits is a deadlock (e.g. a ring whose members all wait for their
//      recv before they issue their send). Waiting for the whole rank, not only for one stream,
//      is stricter than the runtime, so a program it accepts cannot hang at run time.
//
//   rank 0: comm h0 allreduce %a -> %b team [0, 1]   comm h1 allgather %c -> %d team [0, 1]
//   rank 1: comm h0 allgather %c -> %d team [0, 1]   comm h1 allreduce %a -> %b team [0, 1]
//   -> "team [0, 1]: collective #0 differs: rank 0 issues `comm h0 allreduce ...` (allreduce of
//       64 f32, sum) but rank 1 issues `comm h0 allgather ...` (allgather of 16 f32)"
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lower/host_ir.h"
#include "lower/pipeline.h"

namespace meshfuse {

// One communication one rank issues (a loop's node once per iteration).
struct PlannedCommunication {
  int64_t rank = -1;
  const hir::Communication* node = nullptr;  // during the check only (the plan outlives the programs)
  std::string where;             // the node as printed, with the iteration inside loops
  int64_t issue_index = -1;      // position among this rank's communications, in issue order
  int64_t team_position = -1;    // collectives: position in this rank's sequence on `team`
  Team team;                     // collectives: the team; send/recv: {sender, receiver} pairs below
  std::vector<int64_t> counts;   // collectives: what the kind compares, per member (see the .cpp)
  int64_t send_to = -1, recv_from = -1, tag = 0, send_elements = 0, recv_elements = 0;
};

// The communications of every rank, in issue order, as check-collectives proved them to match.
class CommunicationPlan {
 public:
  const std::vector<PlannedCommunication>& of(int64_t rank) const { return by_rank_.at(rank); }
  // For a run-time hang report: `rank` is blocked waiting for its communication `issue_index`;
  // `issued[p]` is how many communications rank p has issued so far in this run (-1: unknown,
  // -2: rank p is still in an earlier run). Says where
  // the communication stands in its team's sequence and which peers have not issued their part,
  // with the node each of them should be at.
  std::string describeWait(int64_t rank, int64_t issue_index, const std::map<int64_t, int64_t>& issued) const;

 private:
  friend CommunicationPlan checkCollectives(const std::vector<HostProgram>&, const SymbolBindings&);
  std::map<int64_t, std::vector<PlannedCommunication>> by_rank_;
  // For each communication: the (rank, issue_index) of every counterpart it needs to complete.
  std::map<std::pair<int64_t, int64_t>, std::vector<std::pair<int64_t, int64_t>>> needs_;
};

CommunicationPlan checkCollectives(const std::vector<HostProgram>& programs, const SymbolBindings& bindings);
// The same over programForRank() of every rank of `program`'s meshes (what each rank will run).
CommunicationPlan checkCollectives(const CompiledProgram& program, const SymbolBindings& bindings);

}  // namespace meshfuse
