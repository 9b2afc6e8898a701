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
// compiles and runs: the op-by-op plan gathered the rows on axis 1 (to nest the new axis-0 split
// outside), sliced them on both axes, and gathered them on axis 1 again for the pin; the plan
// search (decompose/search_placements.h) finds the plan that gathers once and slices on axis 0.
MPI_TEST(PlacementFuzzRegressions, ShardMovedBetweenMeshAxesOfATwoRowTensor, exactly(4, "a 2x2 mesh")) {
  const DeviceMesh mesh({0, 1, 2, 3}, {2, 2});
  Fusion f;
  TensorView* x = f.defineTensor({2, 3}, DataType::Float, "x");
  TensorView* y = ops::relu(ops::rmsNorm(x));
  applyPlacements(y, mesh, {S(0), R});
  f.addOutput(y);
  ShardedRun run = runSharded(f, {{mesh, {R, S(0)}}});
  expectMatchesReference(run);
  expectSameCollectives(run.reported, run.collectives);
  ASSERT_EQ(kinds(run.collectives), (std::vector<std::string>{"allgather"}));
  EXPECT_EQ(run.collectives[0].mesh_axis, 1);
  EXPECT_EQ(run.collectives[0].bytes, 12);  // this rank's row of 3 f32
  EXPECT_EQ(run.local_outputs[0].placements, (Ps{S(0), R}));
}

// s2-w4-c88, reduced: linear(x [12, 6] [Shard(1), Replicate()], w [3, 6] [Replicate(), Shard(1)])
// contracts a dim of 6 split on axis 0 (by x) and on axis 1 (by w): pending sums on both axes
// split it by 4, which compiling refused with "uneven sharding not supported: contracted dim ...
// has size 3". Nested uneven blocks of the contracted dim (3 + 3, then 2 + 1) are valid now.
// The op-by-op plan sliced x on axis 1, regathered w on axis 1 and all-reduced the [12, 3]
// pending sums on both axes; the plan search splits x's rows on axis 0 instead of its
// contracted dim (an all-to-all of its [12, 3] block), so that the contraction is split on axis
// 1 only: the [6, 3] pending sums are all-reduced over axis 1 and their rows gathered over axis
// 0 (w stays where it is).
MPI_TEST(PlacementFuzzRegressions, ContractedDimShardedOnBothMeshAxes, exactly(4, "a 2x2 mesh")) {
  const DeviceMesh mesh({0, 1, 2, 3}, {2, 2});
  Fusion f;
  TensorView* x = f.defineTensor({12, 6}, DataType::Float, "x");
  TensorView* w = f.defineTensor({3, 6}, DataType::Float, "w");
  f.addOutput(ops::linear(x, w));
  ShardedRun run = runSharded(f, {{mesh, {S(1), R}}, {mesh, {R, S(1)}}});
  expectMatchesReference(run);
  expectSameCollectives(run.reported, run.collectives);
  ASSERT_EQ(kinds(run.collectives), (std::vector<std::string>{"all_to_all", "allreduce", "allgather"}));
  const std::vector<int64_t> axes = {0, 1, 0}, bytes = {12 * 3 * 4, 6 * 3 * 4, 6 * 3 * 4};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(run.collectives[i].mesh_axis, axes[i]) << "collective " << i;
    EXPECT_EQ(run.collectives[i].bytes, bytes[i]) << "collective " << i;
  }
}

}  // namespace
}  // namespace meshfuse::testing
