// A pin on a reduction's or contraction's output (issue 14): the op computes a local pending sum
// and one reduce-scatter (Shard pin) or allreduce (Replicate pin) makes the pin, as when the same
// op is followed by a pinned set; its operands are not moved (no all-to-all of a reduction's
// whole input, no weight gathered). Numerics against single-device execution, the exact
// collectives each rank executes (with their bytes) and the static report, on 1, 2 and 4 ranks.
#include "meshfuse/ops.h"
#include "mpi_test_main.h"

namespace meshfuse::testing {
namespace {

using ::testing::IsEmpty;
using Strs = std::vector<std::string>;

// On one rank every mesh axis has one device and no collective is needed.
Strs expect(Strs kinds) { return worldSize() > 1 ? kinds : Strs{}; }

std::vector<std::pair<DeviceMesh, Ps>> layouts(std::initializer_list<Ps> per_input) {
  std::vector<std::pair<DeviceMesh, Ps>> out;
  for (const Ps& p : per_input) out.emplace_back(worldMesh(), p);
  return out;
}

// Numerics, the static report against what ran, and the kinds and bytes of each collective.
void expectPlan(const ShardedRun& run, const Strs& want, const std::vector<int64_t>& bytes) {
  expectMatchesReference(run);
  expectSameCollectives(run.reported, run.collectives);
  ASSERT_EQ(kinds(run.collectives), expect(want));
  if (worldSize() == 1) return;
  for (size_t i = 0; i < bytes.size(); ++i) {
    EXPECT_EQ(run.collectives[i].bytes, bytes[i]) << run.collectives[i].tensor;
    EXPECT_EQ(run.collectives[i].team, worldMesh().devices()) << run.collectives[i].tensor;
  }
}

// y = reduce(x [rows, 16] Shard(0), dims [0]) with y pinned `pin` (via_set: y = set(reduce(x)),
// the set pinned).
ShardedRun reduceRows(OpKind kind, int64_t rows, const Placement& pin, bool via_set) {
  Fusion f;
  TensorView* x = f.defineTensor({rows, 16}, DataType::Float, "x");
  TensorView* y = kind == OpKind::Sum ? ops::sum(x, {0}) : ops::mean(x, {0});
  if (via_set) y = ops::set(y);
  f.rename(y, "y");
  applyPlacements(y, worldMesh(), {pin});
  f.addOutput(y);
  return runSharded(f, layouts({{S(0)}}));
}

TEST(PinnedReductions, SumPinnedShardIsOneReduceScatterWhateverTheRowCount) {
  // The reduce-scatter sends this rank's [16] f32 partial sum: 64 bytes, for 64 rows or 256 (an
  // all-to-all of the input would send a block of rows).
  for (int64_t rows : {64, 256}) {
    SCOPED_TRACE(rows);
    ShardedRun run = reduceRows(OpKind::Sum, rows, S(0), /*via_set=*/false);
    expectPlan(run, {"reduce_scatter"}, {64});
    EXPECT_EQ(run.local_outputs[0].placements, Ps{S(0)});
    if (worldSize() > 1) {
      EXPECT_EQ(run.collectives[0].provenance, "pinned by the user: %y = sum placed [Shard(0)]");
    }
  }
}

TEST(PinnedReductions, SumPinnedReplicateIsOneAllreduce) {
  ShardedRun run = reduceRows(OpKind::Sum, 64, R, /*via_set=*/false);
  expectPlan(run, {"allreduce"}, {64});
  EXPECT_EQ(run.local_outputs[0].placements, Ps{R});
}

TEST(PinnedReductions, SumFollowedByAPinnedSetHasTheSamePlan) {
  for (const Placement& pin : {S(0), R}) {
    SCOPED_TRACE(pin.toString());
    ShardedRun pinned = reduceRows(OpKind::Sum, 64, pin, /*via_set=*/false);
    ShardedRun set = reduceRows(OpKind::Sum, 64, pin, /*via_set=*/true);
    expectPlan(set, {pin == R ? "allreduce" : "reduce_scatter"}, {64});
    EXPECT_EQ(kinds(set.collectives), kinds(pinned.collectives));
  }
}

// A mean over a sharded dim is a pending sum divided by the global count.
TEST(PinnedReductions, MeanPinnedShardIsOneReduceScatter) {
  ShardedRun run = reduceRows(OpKind::Mean, 64, S(0), /*via_set=*/false);
  expectPlan(run, {"reduce_scatter"}, {64});
  EXPECT_EQ(run.local_outputs[0].placements, Ps{S(0)});
}

TEST(PinnedReductions, MeanOverAShardedDimIsReducedNotGathered) {
  Fusion f;
  TensorView* x = f.defineTensor({64, 16}, DataType::Float, "x");
  f.addOutput(ops::exp(ops::mean(x, {0})));
  ShardedRun run = runSharded(f, layouts({{S(0)}}));
  expectPlan(run, {"allreduce"}, {64});  // of the [16] means, not an allgather of x
}

// linear(x [8, 16] Shard(1), w [12, 16] Shard(1)): row-parallel, the contracted dim sharded.
ShardedRun rowParallelLinear(const Placement& pin, bool via_set, bool bias = false) {
  Fusion f;
  TensorView* x = f.defineTensor({8, 16}, DataType::Float, "x");
  TensorView* w = f.defineTensor({12, 16}, DataType::Float, "w");
  TensorView* b = bias ? f.defineTensor({12}, DataType::Float, "b") : nullptr;
  TensorView* y = ops::linear(x, w, b);
  if (via_set) y = ops::set(y);
  applyPlacements(y, worldMesh(), {pin});
  f.addOutput(y);
  return bias ? runSharded(f, layouts({{S(1)}, {S(1)}, {R}})) : runSharded(f, layouts({{S(1)}, {S(1)}}));
}

TEST(PinnedReductions, RowParallelLinearPinnedShardMovesNoWeight) {
  for (bool via_set : {false, true}) {
    SCOPED_TRACE(via_set ? "pinned set" : "pinned linear");
    ShardedRun run = rowParallelLinear(S(0), via_set);
    expectPlan(run, {"reduce_scatter"}, {8 * 12 * 4});  // this rank's [8, 12] f32 partial sums
    EXPECT_EQ(run.local_outputs[0].placements, Ps{S(0)});
  }
}

TEST(PinnedReductions, RowParallelLinearPinnedReplicateIsOneAllreduce) {
  ShardedRun run = rowParallelLinear(R, /*via_set=*/false);
  expectPlan(run, {"allreduce"}, {8 * 12 * 4});
  EXPECT_EQ(run.local_outputs[0].placements, Ps{R});
}

// With a bias the pending sum is reduce-scattered before the bias is added (once).
TEST(PinnedReductions, RowParallelLinearWithBiasPinnedShard) {
  ShardedRun run = rowParallelLinear(S(1), /*via_set=*/false, /*bias=*/true);
  expectPlan(run, {"reduce_scatter"}, {8 * 12 * 4});
  EXPECT_EQ(run.local_outputs[0].placements, Ps{S(1)});
}

// A batched matmul contracting a sharded dim, pinned along its batch dim.
TEST(PinnedReductions, BatchedMatmulPinnedOnItsBatchDimIsOneReduceScatter) {
  Fusion f;
  TensorView* a = f.defineTensor({4, 8, 16}, DataType::Float, "a");
  TensorView* b = f.defineTensor({4, 16, 12}, DataType::Float, "b");
  TensorView* y = ops::matmul(a, b);
  applyPlacements(y, worldMesh(), {S(0)});
  f.addOutput(y);
  ShardedRun run = runSharded(f, layouts({{S(2)}, {S(1)}}));
  expectPlan(run, {"reduce_scatter"}, {4 * 8 * 12 * 4});
  EXPECT_EQ(run.local_outputs[0].placements, Ps{S(0)});
  // Sharded along the batch dims, the same matmul needs nothing.
  ShardedRun batch = runSharded(f, layouts({{S(0)}, {S(0)}}));
  expectPlan(batch, {}, {});
}

// nvFuser's spelling (its test_reduce_scatter): x [n, 4n] with its outer axis parallelized on
// the mesh, the output split by n and its outer part parallelized, all through the schedule.
TEST(PinnedReductions, NvFuserScheduleOfAReduceScatter) {
  const int64_t n = worldSize();
  Fusion f;
  TensorView* x = f.defineTensor({n, 4 * n}, DataType::Float, "x");
  TensorView* y = ops::sum(x, {0});
  f.addOutput(y);
  x->setDeviceMesh(worldMesh());
  x->parallelize(0, ParallelType::DIDx);
  y->setDeviceMesh(worldMesh());
  y->split(-1, n);
  y->parallelize(-2, ParallelType::DIDx);
  ShardedRun run = runSharded(f, layouts({{S(0)}}));
  expectPlan(run, {"reduce_scatter"}, {4 * n * 4});
  EXPECT_EQ(run.local_outputs[0].placements, Ps{S(0)});
}

// Data x tensor: the pending sum of the tensor axis is reduce-scattered over that axis only.
MPI_TEST(PinnedReductions, OnA2x2MeshTheReduceScatterRunsOverTheTensorAxis, exactly(4)) {
  DeviceMesh mesh({0, 1, 2, 3}, {2, 2});
  Fusion f;
  TensorView* x = f.defineTensor({8, 16}, DataType::Float, "x");
  TensorView* w = f.defineTensor({12, 16}, DataType::Float, "w");
  TensorView* y = ops::linear(x, w);
  applyPlacements(y, mesh, {S(0), S(1)});
  f.addOutput(y);
  ShardedRun run = runSharded(f, {{mesh, {S(0), S(1)}}, {mesh, {R, S(1)}}});
  expectMatchesReference(run);
  expectSameCollectives(run.reported, run.collectives);
  ASSERT_EQ(kinds(run.collectives), Strs{"reduce_scatter"});
  EXPECT_EQ(run.collectives[0].mesh_axis, 1);
  EXPECT_EQ(run.collectives[0].team, worldRank() < 2 ? (Team{0, 1}) : (Team{2, 3}));
  EXPECT_EQ(run.collectives[0].bytes, 4 * 12 * 4);  // this rank's [4, 12] partial sums
  EXPECT_EQ(run.local_outputs[0].placements, (Ps{S(0), S(1)}));
}

}  // namespace
}  // namespace meshfuse::testing
