// The optimal-plan oracle of the placement fuzzer: for a case on a 1-D or 2-D mesh, the fewest
// bytes any plan can move, found by exhaustive search, independently of src/propagation.
//
// Model (DTensor's, written down here from first principles, not taken from meshfuse):
//   - every tensor has one placement per mesh axis: Replicate, Partial (pending sum) or
//     Shard(d). Axes that shard one dim nest, axis 0 outermost. A shard divides its dim evenly
//     (by the product of the axes that split it) or, in a case that the fuzzer drew uneven (an
//     input placed or an output pinned in blocks of different sizes), any extent in torch.chunk's
//     blocks, nested as DTensor nests them: axis 0 chunks the dim, axis 1 chunks each block;
//   - each op computes locally under a small table of rules "operand placements -> result
//     placement" per mesh axis (e.g. sum over a sharded dim: Shard(a) -> Partial; linear:
//     Shard(k), Shard(k) -> Partial; exp: Shard(d) -> Shard(d), but not Partial -> Partial),
//     combined over the axes as DTensor combines its strategies (a reshape keeps two axes'
//     splits only on different dims);
//   - an operand whose placement differs from what its consumer's rule needs is converted; a
//     tensor converted to several placements pays for each conversion once, each from its own
//     placement or from one it was already converted to (Partial -> Shard -> Replicate);
//   - an output is converted to its pin; an unpinned output may be anything but Partial;
//   - meshfuse's documented priority is kept. Plans are ranked by how many times a parameter (an
//     input that is a linear's or matmul's weight operand) is converted first, by bytes second.
//     And a plan is compared with meshfuse's only when it is no worse in what the priority puts
//     before bytes: no more collectives (each one-axis step that sends anything counts one), and
//     no more work per rank (the elements each op reads and writes on a rank, summed over the
//     ops: a plan that gathers a batch so that every rank computes all of it sends less but
//     gives up the data parallelism). The minimum is the bytes of the best-ranked plan within
//     those bounds; the bytes-only minimum (no bounds) is reported beside it.
// A conversion is the cheapest chain of one-axis steps, each a collective over that axis's teams
// (m ranks each) or a local slice. A step that changes a dim's split on an axis is one only where
// no inner axis splits that dim too (the blocks would interleave). What a step sends over the
// wire, summed over all ranks, as ring algorithms do (B = the tensor's global bytes, s = the
// ranks the other axes shard it over, so each team holds B/s): Shard -> Replicate allgather
// (m-1)B/s; Partial -> Shard reduce-scatter (m-1)B/s; Partial -> Replicate allreduce 2(m-1)B/s;
// Shard(a) -> Shard(b) all-to-all (m-1)B/(sm); Replicate -> Shard or Partial: 0 (local); Shard
// -> Partial: not allowed. On a 1-D mesh m is the mesh size n and s is 1. The same sums for
// uneven blocks, each rank counted by its own block: a team's allgather, reduce-scatter or
// allreduce sends (m-1) or 2(m-1) times what the team holds, whatever its blocks, and the teams
// hold B/s each on average (on a 2x2 mesh teams hold different amounts when the other axis
// splits unevenly; their sum is the same). An all-to-all of uneven blocks really sends
// B(1 - sum_r a_r b_r / B^2) for blocks a_r and b_r of the two dims: the model keeps the even
// formula on both sides, meshfuse's report and the oracle's.
// meshfuse's plan is measured the same way from its collectives report (each collective's
// bytes in on each rank, its kind and team: wireBytesTimesN). The report's bytes themselves are
// not a measure of traffic: a reduce-scatter's input is m times an allgather's of the same
// result, for the same traffic. Values are kept times N, the mesh's size, so that they are
// integers.
// The search tries one rule per op (which fixes every intermediate's placement), cutting only
// branches that cannot beat the best plan found, so it is exhaustive over the intermediates'
// placements the rules can produce.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "case_spec.h"
#include "lower/host_ir.h"
#include "lower/pipeline.h"

namespace meshfuse::placement_fuzz {

// What meshfuse's plan costs in the measures the priority ranks before bytes: the oracle compares
// it only with plans no worse in these. The default is no bound.
struct PlanBounds {
  int64_t collectives = std::numeric_limits<int64_t>::max();  // collectives per rank
  int64_t work = std::numeric_limits<int64_t>::max();         // elements read and written per rank
};

struct OraclePlan {
  bool applicable = false;
  std::string why_not;              // when not applicable
  int64_t n = 1;                    // the mesh's size, N
  int64_t min_wire_times_n = 0;     // the best plan within the bounds: its wire bytes over all ranks, times N
  int64_t weight_moves = 0;         // conversions of parameters the best plan cannot avoid
  int64_t collectives = 0;          // the best plan's collectives per rank
  int64_t work = 0;                 // the best plan's work per rank
  std::vector<std::string> lines;   // the argmin: each tensor's placement and its conversions
  // The best plan of all, bounds or not (set whenever some plan fits the rules, applicable or not).
  int64_t bytes_only_min_times_n = -1;
  int64_t bytes_only_collectives = 0;
  int64_t bytes_only_work = 0;
};

// The minimum over all plans within `bounds` (applicable: a 1-D or 2-D mesh, even or uneven
// blocks; at most `max_plans` partial plans visited; some plan within the bounds).
OraclePlan minimumBytes(const CaseSpec& c, const PlanBounds& bounds = {}, int64_t max_plans = 2'000'000);

// What one rank's collective of `kind` with `in_bytes` in, on a team of `team` ranks, sends, times
// the mesh's size.
int64_t wireBytesTimesN(CommKind kind, int64_t in_bytes, int64_t team, int64_t mesh_size);

// Whether a plan sending `plan_wire_times_n` (over all ranks, times N) is acceptable against the
// oracle's minimum: it must not send more. Returns the verdict's explanation ("" when it is).
std::string compareWithOracle(const OraclePlan& oracle, int64_t plan_wire_times_n);

}  // namespace meshfuse::placement_fuzz
