// search-placements: the placements propagate-shardings gives, improved by a search over its
// decisions that measures each plan by what decomposition makes of it. The pipeline's
// propagate-shardings pass runs this.
//
// requires: a placed definition (the user's pins), as propagate-shardings does.
// guarantees: what propagate-shardings guarantees; and, where the search applies, a plan that
//   ranks no worse than the greedy one: every plan it tries is decomposed (on a copy) and
//   measured by the bytes its collectives put on the wire, summed over the ranks (wireBytes in
//   resharding_steps.h). Plans rank by the moves of parameters first (the documented priority:
//   pins > parameters never move), bytes second, collectives third, and one is taken only
//   within two bounds set by the greedy plan: no more collectives (the priority puts fewer
//   collectives before fewer bytes) and no more work, the elements each op reads and writes on
//   a rank summed over the ops (compute split across ranks, data parallelism's above all, is
//   not replicated to save bytes). Every output keeps the placement the greedy plan gives it
//   (what the user sees does not depend on the search): a plan that computes one otherwise
//   pays for a set after it, which takes its name.
//
// The greedy pass decides op by op (propagate_shardings.h), so it cannot see that a choice
// free at one op costs a larger collective later, or that a collective another consumer pays
// for could serve this one too: a Partial reduced once per consumer instead of once, an operand
// sliced (free) where gathering it would make a later allreduce unnecessary, a value gathered
// for one consumer while another goes Partial. The search revisits the decisions: each decision
// ranks its candidates (the greedy's first, then every other sharding the op can give from
// operands moved to fit: PlanChoices), and from the greedy plan the search tries changing one
// decision, then one value's decisions on every mesh axis at once (a move from [Replicate,
// Shard(0)] to [Shard(0), Replicate] on a 2-D mesh), then two decisions, and so on, the later
// decisions re-made greedily around them, and moves to the first plan that ranks better, until
// none does or its budget (kMaxPlans) is spent. Then it climbs again, budgeted apart, from the
// plan whose decisions keep values as they arrive where candidates tie
// (PlanChoices::fewest_moves_on_ties), and takes the better of the two ends: the greedy order
// takes a free split of an upstream hint at each op of a chain, which a pinned end pays a gather
// for, and undoing that one decision at a time needs a change at every op. On a mesh of two axes
// it climbs a third time, from the best plan so far where its conversions would route otherwise
// by fewest bytes, with every conversion so routed (Fusion::reshardByBytes, resharding_steps.h: a
// collective more on one conversion that the plan saves elsewhere); the program says `reshard by
// bytes` when that plan is taken. Last, each climb that spent its budget resumes from where it
// stopped, with a budget as large again. A plan is measured once per search (a resumed
// climb does not count again against its budget what was measured before). A program whose
// decisions have fewer than kMaxPlans combinations is thus searched (nearly) exhaustively; a
// larger one locally: the placement fuzzer's oracle (fuzz/placements/oracle.h) measures how close it
// comes (docs/testing.md, "Known failures"). Several changes at once are needed where each
// alone costs more than the plan it leaves: a pending sum reduce-scattered for one op pays off
// only when the op after it computes on the gathered whole, and that one's consumers follow it.
//
// Attention that context parallelism placed in the greedy plan (its keys or values arrive split
// along the sequence) reads its operands and gives its result as in the greedy plan in every plan
// tried under a forced --cp: context parallelism chooses how they move (Ulysses, ring or a gather),
// and a search by bytes must not override the user's choice. Under --cp=auto a plan may place it
// otherwise only where it reads every operand split evenly on the axes the sequence was split on
// (each rank holding and attending no more than ring attention leaves it): on a split of the
// batch, typically; or anywhere, where context parallelism gathered the keys and values (neither
// ring attention nor Ulysses applied, so every rank holds and attends the whole sequence, and no
// plan within the bounds does worse). Where attention's operands come from, other attention, and
// the rest of the program are searched as any op. Ring attention's rotations count as their
// n - 1 send/recv steps each, as the executed program has them.
//
// Where it does not apply the greedy plan stands: a program on one device or on several meshes
// (pipeline stages), with symbolic sizes (its bytes depend on them, and the executor compiles
// it once for every size), under FSDP (gather_parameters moves parameters by design), of more
// than kMaxExprs ops, or with PropagationOptions::search off (--plan=greedy).
//
//   %t0 = input f32[2, 2, 3, 3, r2] @m0 {parallelize(4, DIDx)}     (Partial() on two ranks)
//   %t1 = add(%t0, %t0)   %t2 = mean(%t0, dims=[3])   %t3 = relu(%t2)   output %t1, %t3
//   greedy:  %t1 is all-reduced (144 bytes a rank) and so is %t2 (48): 2 collectives
//   search:  %t0 is all-reduced once (144 bytes a rank), both ops compute on it: 1 collective
#pragma once

#include <cstdint>

namespace meshfuse {

class Fusion;
struct PipelineOptions;

namespace search_placements {
constexpr int64_t kMaxExprs = 64;   // larger programs keep the greedy plan
constexpr int64_t kMaxPlans = 256;  // plans decomposed and measured, the greedy one included
}  // namespace search_placements

void searchPlacements(Fusion& fusion, const PipelineOptions& options);

// The work per rank of a decomposed fusion, the bound the search keeps: the elements each compute
// op (not a `set`) reads and writes on one rank (the largest of torch.chunk's blocks; a pending
// sum whole), summed over the ops. The placement fuzzer holds its oracle to it too.
int64_t workPerRank(const Fusion& decomposed);

}  // namespace meshfuse
