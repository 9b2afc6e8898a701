// Bugs the placement fuzzer found (fuzz/placements, docs/testing.md), each as the smallest program
// that showed it, with numerics against single-device execution and the exact collectives.
#include "meshfuse/ops.h"
#include "mpi_test_main.h"

namespace meshfuse::testing {
namespace {

// s1-w4-c22: on a 2x2 mesh, x [2, 3] [Replicate(), Shard(0)] and relu(x) pinned [Shard(0),
// Replicate()]. Propagation gave relu's operand [Shard(0), Shard(0)] (each axis alone divides the
// 2 rows, both together do not), and compiling failed with "uneven sharding not supported". Now
// that nested uneven shards are valid (axis 0 cuts 1 + 1 rows, axis 1 then 1 + 0), that plan
// compiles and runs: the rows are gathered on axis 1 (to nest the new axis-0 split outside),
// sliced on both axes, and gathered on axis 1 again for the pin. (Gathering once and slicing on
// axis 0 moves less: propagation decides each mesh axis on its own and does not count the
// regathering a new outer split costs; the same plan with 4 rows, even, has done so all along.)
TEST(PlacementFuzzRegressions, ShardMovedBetweenMeshAxesOfATwoRowTensor) {
  if (worldSize() != 4) GTEST_SKIP() << "needs a 2x2 mesh (4 ranks), have " << worldSize();
  const DeviceMesh mesh({0, 1, 2, 3}, {2, 2});
  Fusion f;
  TensorView* x = f.defineTensor({2, 3}, DataType::Float, "x");
  TensorView* y = ops::relu(ops::rmsNorm(x));
  applyPlacements(y, mesh, {S(0), R});
  f.addOutput(y);
  ShardedRun run = runSharded(f, {{mesh, {R, S(0)}}});
  expectMatchesReference(run);
  expectSameCollectives(run.reported, run.collectives);
  ASSERT_EQ(kinds(run.collectives), (std::vector<std::string>{"allgather", "allgather"}));
  for (const CollectiveInfo& c : run.collectives) EXPECT_EQ(c.mesh_axis, 1);
  EXPECT_EQ(run.collectives[0].bytes, 12);  // this rank's row of 3 f32
  // Then the nested blocks: rows 1 + 0 of the axis-0 block's 1 row.
  EXPECT_EQ(run.collectives[1].bytes, worldRank() % 2 == 0 ? 12 : 0);
  EXPECT_EQ(run.local_outputs[0].placements, (Ps{S(0), R}));
}

// s2-w4-c88, reduced: linear(x [12, 6] [Shard(1), Replicate()], w [3, 6] [Replicate(), Shard(1)])
// contracts a dim of 6 split on axis 0 (by x) and on axis 1 (by w): pending sums on both axes
// split it by 4, which compiling refused with "uneven sharding not supported: contracted dim ...
// has size 3". Nested uneven blocks of the contracted dim (3 + 3, then 2 + 1) are valid now: x
// is sliced on axis 1, w regathered on axis 1 and sliced on both, and the [12, 3] pending sums
// all-reduced on both axes. (Gathering w on axis 1 and all-reducing over axis 0 alone is one
// collective less: the same per-axis cost model as above.)
TEST(PlacementFuzzRegressions, ContractedDimShardedOnBothMeshAxes) {
  if (worldSize() != 4) GTEST_SKIP() << "needs a 2x2 mesh (4 ranks), have " << worldSize();
  const DeviceMesh mesh({0, 1, 2, 3}, {2, 2});
  Fusion f;
  TensorView* x = f.defineTensor({12, 6}, DataType::Float, "x");
  TensorView* w = f.defineTensor({3, 6}, DataType::Float, "w");
  f.addOutput(ops::linear(x, w));
  ShardedRun run = runSharded(f, {{mesh, {S(1), R}}, {mesh, {R, S(1)}}});
  expectMatchesReference(run);
  expectSameCollectives(run.reported, run.collectives);
  ASSERT_EQ(kinds(run.collectives), (std::vector<std::string>{"allgather", "allreduce", "allreduce"}));
  EXPECT_EQ(run.collectives[0].mesh_axis, 1);
  EXPECT_EQ(run.collectives[0].bytes, 3 * 3 * 4);  // this rank's [3, 3] block of w
  for (size_t i = 1; i < 3; ++i) EXPECT_EQ(run.collectives[i].bytes, 12 * 3 * 4);  // the [12, 3] partial sums
}

}  // namespace
}  // namespace meshfuse::testing
