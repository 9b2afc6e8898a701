// propagate-shardings: gives every TensorView a mesh and DID axes.
//
// requires: the user's pins (input placements, schedule-API meshes).
// guarantees: every TensorView has a mesh and records its provenance (which operand and rule
//   decided it; for a pinned one, the user's pin); every op's output is sharded as the op gives
//   it locally from operands resharded to fit (an output pinned otherwise, or pinned where a set
//   after the op is cheaper, is that set's output: see below); no op is given an output a
//   Partial operand cannot pass to (requiredOperandState: a pending sum is never added to a
//   scalar or passed through an operand the op is not linear in): a pinned Partial the op cannot
//   give is computed whole and made pending by a set after it (Replicate -> Partial, local); a
//   Shard may split a dim the mesh axis does not divide (torch.chunk's uneven blocks), but only
//   where the blocks of the operand dim it comes from line up with the output's (carriesShard: a
//   reshape's split or merge); where an op keeps the pending sum of one of several pending
//   operands, a set before it makes the others whole (the IR says which passes: decomposition
//   reads the first pending operand as the source); every fusion output is materialized: an
//   unpinned output that would be Partial gets a `set` that reduce-scatters it along a dim that
//   was sharded on that mesh axis in the inputs it derives from (sequence parallelism keeps `t`
//   sharded), or all-reduces it to Replicate otherwise.
//
// Each op's rule (sharding_rule.h) proposes candidate output shardings per mesh axis; the
// cheapest in communication wins, where moving a parameter (an op's weight operand that is a
// fusion input) costs 1000x: priority user pins > weights never move > fewer collectives
// (with gather_parameters, the FSDP strategy, moving an activation costs 1000x instead). Every
// collective counts one (a reduction too), a local slice none. A move an earlier decision
// already makes is free (decomposition makes it once for every consumer); on equal cost a
// settled output beats a Partial one (which costs a reduction later), then fewer bytes moved
// win (per rank, from the shapes; symbolic sizes stay symbols and a comparison that depends on
// them is a tie). A replicated value made a pending sum (local: the first device keeps it, the
// others hold zeros) counts one too, so that op by op a pending sum is reduced before it meets a
// replicated value; the plan search takes the local partition where it sends less.
//
// A pin on an op's output says what the value must be, not how the op computes it: the op takes
// the cheapest sharding counting the set after it that makes the pin, and on a tie the one that
// moves less before the op. A reduction or contraction whose contracted dim is sharded stays a
// local pending sum that one reduce-scatter (a Shard pin) or allreduce (a Replicate pin) makes
// the pin, as when a pinned `set` follows the op, instead of its input being moved (an
// all-to-all of every row) or its weight; an output pinned along a dim its op cannot split
// (softmax's normalized dim) is computed whole and the set slices it. The pin and the name then
// move to a new `set` after the op. A mean over a sharded dim of static size becomes
// div(sum, count), a pending sum like any sum (a mean kernel divides by its local count).
//
// Tensors on different meshes are pipeline stages: an op's output goes to its
// parameter's mesh, else to the mesh of its latest-computed operand; decomposition moves data
// between stages. An operand on a mesh of the output's shape carries its sharding across (axes
// correspond); one on a mesh of another shape proposes nothing and costs the same whatever the
// op needs of it (it is broadcast, scattered, gathered or reduced to it), except a pending sum,
// which no move between meshes makes. Forward and backward sweeps repeat until nothing changes; when they stall on
// an op waiting for an input the user left open, that op decides from its placed operands and
// the backward sweep gives the open input what the op needs. Anything left is replicated.
//
// A linear with a bias whose output would be Partial is rewritten as linear + add(bias) so the
// pending sum is reduced before the bias is added once.
//
//   before: %x = input f32[?t, 256] @m {split(1, 4), parallelize(1, DIDx)}
//           %w = input f32[64, 256] @m {split(1, 4), parallelize(1, DIDx)}
//           %y = linear(%x, %w) : f32[?t, 64, r256]
//   after:  %y = linear(%x, %w) : f32[?t, 64, r256] @m {split(2, 4), parallelize(2, DIDx)} from "..."
//           %1 = set(%y) : f32[?t, 64] @m {} from "output materialized: ..."
//
//   before: %x = input f32[64, 16] @m {split(0, 4), parallelize(0, DIDx)}
//           %y = sum(%x, dims=[0]) : f32[r64, 16] @m {split(1, 4), parallelize(1, DIDx)}   (pinned)
//   after:  %0 = sum(%x, dims=[0]) : f32[r64, 16] @m {split(0, 4), parallelize(0, DIDx)} from "..."
//           %y = set(%0) : f32[16] @m {split(0, 4), parallelize(0, DIDx)}                  (pinned)
#pragma once

#include <cstdint>
#include <vector>

#include "meshfuse/ir/extent.h"
#include "meshfuse/options.h"

namespace meshfuse {

class Fusion;

// The decisions of one run, for a search that revisits them (decompose/search_placements.h):
// the pass decides op by op, one mesh axis at a time, and ranks each decision's feasible
// candidates by the cost above (0: the cheapest, what the greedy pass takes).
struct PlanChoices {
  // In: per decision, in the order the pass makes them, the rank of the candidate to take
  // (decisions past the end take 0; a rank past a decision's last candidate takes its last).
  std::vector<int64_t> take;
  // Out: per decision, how many feasible candidates it had, and which op's output it places:
  // the decisions one op makes in a row (one per mesh axis) share the number.
  std::vector<int64_t> candidates;
  std::vector<int64_t> op;
  // In: rank candidates that tie in everything the cost above compares by how many operands
  // they move (a free slice included), fewest first, before the pin and the candidate order. The
  // greedy order takes a split it gets for free (an upstream hint: less work per rank); this
  // order keeps values as they arrive, which a search needs where the split costs a gather at a
  // pinned output several ops later (search_placements.h).
  bool fewest_moves_on_ties = false;
};

// `sizes`: symbolic sizes known at compile time; a reshape that splits or merges an unbound
// symbolic dim keeps no shard through it (whether its blocks line up depends on the size).
// `choices`: when given, the candidates it names are taken and the candidate counts recorded.
void propagateShardings(Fusion& fusion, const PropagationOptions& options = {}, const SymbolBindings& sizes = {},
                        PlanChoices* choices = nullptr);

}  // namespace meshfuse
