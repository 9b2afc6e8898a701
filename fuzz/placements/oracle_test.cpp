// The placement fuzzer's own pieces, without MPI: the oracle's minimum on programs whose best plan
// is known by hand, that it flags a deliberately worse plan (an injected collective, and a real
// plan made worse by a pin on an intermediate), the case text round trip and the shrinker's
// restructuring.
#include <gtest/gtest.h>

#include "case_spec.h"
#include "meshfuse/ir/fusion.h"
#include "lower/pipeline.h"
#include "oracle.h"
#include "run_case.h"
#include "shrink.h"

namespace meshfuse::placement_fuzz {
namespace {

const Placement R = Placement::replicate(), P = Placement::partial();
Placement S(int64_t d) { return Placement::shard(d); }

// x [8, 16] on two ranks, then `ops` (each on the previous result); the last result is the output.
CaseSpec chain(const std::vector<Placement>& x, std::vector<OpSpec> ops, std::vector<Placement> pin = {}) {
  CaseSpec c;
  c.name = "hand";
  c.mesh_shape = {2};
  c.slots = {8, 16};
  c.input_shapes = {{{0}, {1}}};
  c.input_placements = {x};
  for (size_t i = 0; i < ops.size(); ++i) {
    ops[i].operands.insert(ops[i].operands.begin(), static_cast<int>(i));
    c.ops.push_back(ops[i]);
  }
  c.outputs = {c.numTensors() - 1};
  c.output_pins = {pin};
  return c;
}

OpSpec op(FuzzOp kind, int64_t axis = 0) {
  OpSpec o;
  o.kind = kind;
  o.axis = axis;
  return o;
}

TEST(PlacementOracle, SumOverTheShardedDimPinnedShardIsOneReduceScatter) {
  CaseSpec c = chain({S(0)}, {op(FuzzOp::Sum, 0)}, {S(0)});
  OraclePlan o = minimumBytes(c);
  ASSERT_TRUE(o.applicable) << o.why_not;
  // A reduce-scatter of [16] f32 partial sums on two ranks: each sends the half it does not keep
  // (32 bytes), 64 in all; values are kept times n.
  EXPECT_EQ(o.min_wire_times_n, 2 * 64);
  EXPECT_EQ(plannedWireTimesN(placedDefinition(c), 2), o.min_wire_times_n);
}

TEST(PlacementOracle, PointwiseOnShardsMovesNothing) {
  CaseSpec c = chain({S(1)}, {op(FuzzOp::Exp), op(FuzzOp::Tanh)});
  EXPECT_EQ(minimumBytes(c).min_wire_times_n, 0);
  EXPECT_EQ(plannedWireTimesN(placedDefinition(c), 2), 0);
}

// Megatron's MLP: column- then row-parallel, one allreduce of the [8, 16] output (512 B): each of
// two ranks sends 256 B in its reduce-scatter half and 256 B in its allgather half.
TEST(PlacementOracle, TensorParallelMlpIsOneAllreduce) {
  CaseSpec c;
  c.name = "mlp";
  c.mesh_shape = {2};
  c.slots = {8, 16, 32};
  c.input_shapes = {{{0}, {1}}, {{2}, {1}}, {{1}, {2}}};
  c.input_placements = {{R}, {S(0)}, {S(1)}};
  OpSpec up = op(FuzzOp::Linear), act = op(FuzzOp::Relu), down = op(FuzzOp::Linear);
  up.operands = {0, 1};
  act.operands = {3};
  down.operands = {4, 2};
  c.ops = {up, act, down};
  c.outputs = {5};
  c.output_pins = {{R}};
  OraclePlan o = minimumBytes(c);
  EXPECT_EQ(o.min_wire_times_n, 2 * 1024);
  EXPECT_EQ(plannedWireTimesN(placedDefinition(c), 2), o.min_wire_times_n);
  // The same plan counted both ways: one collective; work per rank 8*16 + 16*16 + 8*16 (up: x,
  // its weight's half, the half result), 2 * 8*16 (relu), 8*16 + 16*16 + 8*16 (down, its
  // pending-sum result whole) = 1280 elements.
  const PlanBounds mine = plannedBounds(placedDefinition(c));
  EXPECT_EQ(mine.collectives, 1);
  EXPECT_EQ(mine.work, 1280);
  EXPECT_EQ(o.collectives, mine.collectives);
  EXPECT_EQ(o.work, mine.work);
}

// The oracle keeps the priority's ranks before bytes. matmul(a [2, 2] Shard(1), b Replicate()),
// the output unpinned: meshfuse computes partial sums and all-reduces the [2, 2] result (32
// bytes); gathering `a` sends 16, but then each rank computes the whole product (more work per
// rank). Held to meshfuse's work, the oracle's best is meshfuse's plan; the bytes-only minimum is
// below. (Like the fuzzer, the oracle is given the output placement meshfuse chose as a pin.)
TEST(PlacementOracle, AGatherThatReplicatesComputeIsOutsideTheBounds) {
  CaseSpec c = parseCase("name=c72;mesh=2;slots=2,2,2;in=x0,x1@S1;in=x1,x2@R;op=matmul:0.1:;out=2@");
  const int64_t planned = plannedWireTimesN(placedDefinition(c), 2);
  EXPECT_EQ(planned, 2 * 32);
  const PlanBounds mine = plannedBounds(placedDefinition(c));
  c.output_pins[0] = {R};  // what meshfuse gave it
  OraclePlan o = minimumBytes(c, mine);
  ASSERT_TRUE(o.applicable) << o.why_not;
  EXPECT_EQ(o.min_wire_times_n, planned);
  EXPECT_EQ(o.bytes_only_min_times_n, 2 * 16);
  EXPECT_GT(o.bytes_only_work, mine.work);
  EXPECT_EQ(compareWithOracle(o, planned), "");
}

// max over dim 3 of a pending sum [2, 2, 2, 2], made Replicate(): one allreduce (128 bytes) in
// meshfuse's plan; a reduce-scatter, the max on each half, an allgather of the smaller result
// send 96 in two collectives. The priority puts fewer collectives first.
TEST(PlacementOracle, FewerBytesInMoreCollectivesIsOutsideTheBounds) {
  CaseSpec c = parseCase("name=c80;mesh=2;slots=2,2,2,2;in=x0,x1,x2,x3@P;op=max:0:3;out=1@");
  const int64_t planned = plannedWireTimesN(placedDefinition(c), 2);
  EXPECT_EQ(planned, 2 * 128);
  const PlanBounds mine = plannedBounds(placedDefinition(c));
  EXPECT_EQ(mine.collectives, 1);
  c.output_pins[0] = {R};  // what meshfuse gave it
  OraclePlan o = minimumBytes(c, mine);
  EXPECT_EQ(o.min_wire_times_n, planned);
  EXPECT_EQ(o.bytes_only_min_times_n, 2 * 96);
  EXPECT_EQ(o.bytes_only_collectives, 2);
}

// max has no pending-max placement: over a sharded dim the data must move.
TEST(PlacementOracle, MaxOverTheShardedDimNeedsAGather) {
  CaseSpec c = chain({S(0)}, {op(FuzzOp::Max, 0)});
  // Cheapest: an all-to-all of x to Shard(1), each rank sending the half of its 256 B block the
  // other needs (an allgather would send 256 B each; partial maxima cannot be all-reduced).
  EXPECT_EQ(minimumBytes(c).min_wire_times_n, 2 * 256);
}

TEST(PlacementOracle, FlagsAPlanWithAnInjectedCollective) {
  CaseSpec c = chain({S(0)}, {op(FuzzOp::Sum, 0)}, {S(0)});
  const PlanBounds mine = plannedBounds(placedDefinition(c));
  const int64_t planned = plannedWireTimesN(placedDefinition(c), 2);
  EXPECT_EQ(compareWithOracle(minimumBytes(c, mine), planned), "");
  // One more allreduce of the [16] result (64 bytes in on each of two ranks): one collective more,
  // so the bounds the plan sets are looser, and the oracle still finds the one reduce-scatter.
  const int64_t extra_allreduce = 2 * wireBytesTimesN(CommKind::Allreduce, 64, 2, 2);
  PlanBounds worse = mine;
  worse.collectives += 1;
  EXPECT_EQ(compareWithOracle(minimumBytes(c, worse), planned + extra_allreduce),
            "meshfuse's plan sends 192.0 bytes; the oracle's sends 64.0");
}

// A real plan made worse: exp(exp(x)) with x Shard(0) needs nothing, but pinning the first exp to
// Replicate makes meshfuse allgather it; held against the unpinned case's minimum it is flagged.
TEST(PlacementOracle, FlagsARealPlanMadeWorseByAPin) {
  CaseSpec c = chain({S(0)}, {op(FuzzOp::Exp), op(FuzzOp::Exp)});
  OraclePlan o = minimumBytes(c);
  ASSERT_EQ(o.min_wire_times_n, 0);
  std::unique_ptr<Fusion> worse = placedDefinition(c);
  auto* first_exp = static_cast<TensorView*>(worse->outputs()[0]->definition()->input(0));
  applyPlacements(first_exp, DeviceMesh({0, 1}), {R});
  const PlanBounds bounds = plannedBounds(worse->clone());
  const int64_t wire = plannedWireTimesN(std::move(worse), 2);
  EXPECT_EQ(wire, 2 * 512);  // the allgather of the first exp: each rank sends its 256 B half
  EXPECT_EQ(compareWithOracle(o, wire), "meshfuse's plan sends 512.0 bytes; the oracle's sends 0.0");
  // Held to that plan's own collectives and work, the oracle's plan (none, half the work) is within.
  EXPECT_EQ(compareWithOracle(minimumBytes(c, bounds), wire), "meshfuse's plan sends 512.0 bytes; the oracle's sends 0.0");
}

// Uneven blocks (8 rows on 3 ranks: 3, 3, 2): an allgather sends each rank's block to the two
// others, 2 * 512 B over all ranks whatever the block sizes, and meshfuse's report (each rank's
// own block) sums to the same.
TEST(PlacementOracle, UnevenBlocksAreCountedAsMeshfuseReportsThem) {
  CaseSpec c = chain({S(0)}, {op(FuzzOp::Exp)}, {R});
  c.mesh_shape = {3};
  OraclePlan o = minimumBytes(c);
  ASSERT_TRUE(o.applicable) << o.why_not;
  EXPECT_EQ(o.min_wire_times_n, 3 * 2 * 512);
  EXPECT_EQ(o.work, 3 * 16 + 3 * 16);  // exp reads and writes the largest block, 3 rows
  EXPECT_EQ(plannedWireTimesN(placedDefinition(c), 3), o.min_wire_times_n);
}

// A reshape carries a shard only where every rank's run of elements is the same on both sides:
// [8, 16] -> [128] on 2 ranks is 64 + 64 either way (free), on 3 ranks 48 + 48 + 32 rows'
// elements against torch.chunk's 43 + 43 + 42 (the input is gathered, 2 * 512 B).
TEST(PlacementOracle, AReshapeCarriesAShardOnlyWhereTheBlocksLineUp) {
  OpSpec flatten = op(FuzzOp::Reshape);
  flatten.new_shape = {{0, 1}};
  CaseSpec even = chain({S(0)}, {flatten}, {S(0)});
  EXPECT_EQ(minimumBytes(even).min_wire_times_n, 0);
  CaseSpec uneven = even;
  uneven.mesh_shape = {3};
  OraclePlan o = minimumBytes(uneven);
  ASSERT_TRUE(o.applicable) << o.why_not;
  EXPECT_EQ(o.min_wire_times_n, 3 * 2 * 512);
  EXPECT_EQ(plannedWireTimesN(placedDefinition(uneven), 3), o.min_wire_times_n);
}

// On a 2x2 mesh a step on one axis moves what that axis's teams hold. x [8, 16] (512 B)
// [Partial, Shard(0)] to Replicate everywhere: all-reducing axis 0 first reduces each team's
// 256 B half (2 teams x 2 x 256 B), then axis 1 gathers 512 B (2 teams x 256 B): 2048 B. The
// other order gathers pending sums whole first: 1024 + 2048 B.
TEST(PlacementOracle, OnA2x2MeshEachAxisStepMovesWhatItsTeamsHold) {
  CaseSpec c = chain({P, S(0)}, {op(FuzzOp::Exp)}, {R, R});
  c.mesh_shape = {2, 2};
  OraclePlan o = minimumBytes(c);
  ASSERT_TRUE(o.applicable) << o.why_not;
  EXPECT_EQ(o.n, 4);
  EXPECT_EQ(o.min_wire_times_n, 4 * 2048);
  EXPECT_EQ(o.collectives, 2);
  EXPECT_EQ(plannedWireTimesN(placedDefinition(c), 4), o.min_wire_times_n);
}

// Two axes that split one dim nest (axis 0 outermost): gathering [Shard(0), Shard(0)] takes the
// inner split away first (2 teams x 2 x 128 B), then the outer (2 teams x 2 x 256 B): 1536 B, what
// one allgather over the four ranks would send.
TEST(PlacementOracle, NestedSplitsAreGatheredInnerAxisFirst) {
  CaseSpec c = chain({S(0), S(0)}, {op(FuzzOp::Exp)}, {R, R});
  c.mesh_shape = {2, 2};
  OraclePlan o = minimumBytes(c);
  ASSERT_TRUE(o.applicable) << o.why_not;
  EXPECT_EQ(o.min_wire_times_n, 4 * 1536);
  EXPECT_EQ(plannedWireTimesN(placedDefinition(c), 4), o.min_wire_times_n);
  // The outer axis alone cannot be gathered under the inner split. To [Replicate, Shard(0)]:
  // gather both (1536 B, two collectives, meshfuse's plan), or in three all-to-all, allgather,
  // all-to-all through [Shard(0), Shard(1)] and [Replicate, Shard(1)] (256 + 512 + 512 B), which
  // meshfuse's bounds leave out.
  CaseSpec outer = chain({S(0), S(0)}, {op(FuzzOp::Exp)}, {R, S(0)});
  outer.mesh_shape = {2, 2};
  const PlanBounds mine = plannedBounds(placedDefinition(outer));
  EXPECT_EQ(mine.collectives, 2);
  OraclePlan p = minimumBytes(outer, mine);
  ASSERT_TRUE(p.applicable) << p.why_not;
  EXPECT_EQ(p.collectives, 2);
  EXPECT_EQ(p.min_wire_times_n, 4 * 1536);
  EXPECT_EQ(p.bytes_only_min_times_n, 4 * 1280);
  EXPECT_EQ(p.bytes_only_collectives, 3);
  EXPECT_EQ(plannedWireTimesN(placedDefinition(outer), 4), p.min_wire_times_n);
}

// sum over a dim split on both axes gives a pending sum on both: two allreduces of the [16]
// result (64 B), 256 B each over the four ranks. A reduce-scatter on axis 1, an allreduce of the
// halves on axis 0 and an allgather send 384 B, in three collectives: outside meshfuse's bounds.
TEST(PlacementOracle, OnA2x2MeshFewerBytesInMoreCollectivesIsOutsideTheBounds) {
  CaseSpec c = chain({S(0), S(0)}, {op(FuzzOp::Sum, 0)}, {R, R});
  c.mesh_shape = {2, 2};
  const PlanBounds mine = plannedBounds(placedDefinition(c));
  EXPECT_EQ(mine.collectives, 2);
  OraclePlan o = minimumBytes(c, mine);
  ASSERT_TRUE(o.applicable) << o.why_not;
  EXPECT_EQ(o.min_wire_times_n, 4 * 512);
  EXPECT_EQ(o.bytes_only_min_times_n, 4 * 384);
  EXPECT_EQ(o.bytes_only_collectives, 3);
  EXPECT_EQ(plannedWireTimesN(placedDefinition(c), 4), o.min_wire_times_n);
}

// Uneven nested blocks on a 2x2 mesh: 5 rows [Shard(0), Shard(0)] are chunked 3 + 2 by axis 0,
// then 2 + 1 and 1 + 1 by axis 1. To [Shard(0), Replicate] each axis-1 team gathers its own block:
// 192 B and 128 B (64 B a row), 320 B in all, what an even split of the same bytes would send.
// The work is exp's read and write of the largest block, ceil(ceil(5 / 2) / 2) = 2 rows.
TEST(PlacementOracle, UnevenNestedBlocksOnA2x2MeshAreCountedTeamByTeam) {
  CaseSpec c = chain({S(0), S(0)}, {op(FuzzOp::Exp)}, {S(0), R});
  c.slots = {5, 16};
  c.mesh_shape = {2, 2};
  OraclePlan o = minimumBytes(c);
  ASSERT_TRUE(o.applicable) << o.why_not;
  EXPECT_EQ(o.min_wire_times_n, 4 * 320);
  EXPECT_EQ(o.collectives, 1);
  EXPECT_EQ(o.work, 2 * 16 + 2 * 16);
  EXPECT_EQ(plannedWireTimesN(placedDefinition(c), 4), o.min_wire_times_n);
  // To Replicate on both: the inner split first (320 B), then each axis-0 team (one per axis-1
  // coordinate, both holding blocks of 3 and 2 rows) sends its other block: 2 x 320 B.
  CaseSpec whole = c;
  whole.output_pins = {{R, R}};
  OraclePlan w = minimumBytes(whole);
  ASSERT_TRUE(w.applicable) << w.why_not;
  EXPECT_EQ(w.min_wire_times_n, 4 * 960);
  EXPECT_EQ(plannedWireTimesN(placedDefinition(whole), 4), w.min_wire_times_n);
}

TEST(PlacementFuzzCase, GeneratedCasesBuildAndRoundTripThroughText) {
  for (int64_t world : {1, 2, 3, 4})
    for (int64_t i = 0; i < 100; ++i) {
      CaseSpec c = generateCase(7, i, world, 5);
      SCOPED_TRACE(describeCase(c));
      EXPECT_EQ(serializeCase(parseCase(serializeCase(c))), serializeCase(c));
      EXPECT_NO_THROW(buildDefinition(c));
      EXPECT_EQ(c.meshSize(), world);
    }
}

TEST(PlacementFuzzCase, MalformedCaseTextIsAValueError) {
  try {
    parseCase("name=x;mesh=2;slots=4;in=y0@R;out=1@");
    FAIL() << "expected a ValueError";
  } catch (const UserError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Value);
    EXPECT_EQ(e.message(), "placement-fuzz case: malformed dim 'y0'");
  }
}

TEST(PlacementFuzzShrink, AnOpResultBecomesAReplicateInput) {
  CaseSpec c = chain({S(0)}, {op(FuzzOp::Exp), op(FuzzOp::Sum, 1)});
  CaseSpec s = restructure(c, c.outputs, {true, false});
  EXPECT_EQ(serializeCase(s), "name=hand;mesh=2;slots=8,16;in=x0,x1@R;op=sum:0:1;out=1@");
  EXPECT_NO_THROW(buildDefinition(s));
}

}  // namespace
}  // namespace meshfuse::placement_fuzz
