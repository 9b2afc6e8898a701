// Every parallelism of the multi-rank issue, on however many ranks mpirun started (1, 2, 4):
// numerics against single-device execution AND the exact collectives each rank executes.
#include "mpi_test_main.h"
#include "meshfuse/ops.h"
#include "models.h"

namespace meshfuse::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using Strs = std::vector<std::string>;

// On one rank no collective is needed: every mesh axis has size 1.
Strs expect(Strs kinds) { return worldSize() > 1 ? kinds : Strs{}; }

std::vector<std::pair<DeviceMesh, Ps>> layouts(std::initializer_list<Ps> per_input) {
  std::vector<std::pair<DeviceMesh, Ps>> out;
  for (const Ps& p : per_input) out.emplace_back(worldMesh(), p);
  return out;
}

TEST(Parallelism, MegatronTensorParallelMlpHasOneAllreduce) {
  Fusion f;
  models::buildMlp(f, 16);
  ShardedRun run = runSharded(f, layouts({{R}, {S(0)}, {S(1)}}), {{"s0", 12}});
  expectMatchesReference(run);
  EXPECT_EQ(kinds(run.collectives), expect({"allreduce"}));
  EXPECT_EQ(run.local_outputs[0].placements, Ps{R});
}

TEST(Parallelism, SequenceParallelMlpGathersThenReduceScatters) {
  Fusion f;
  models::buildMlp(f, 16);
  ShardedRun run = runSharded(f, layouts({{S(0)}, {S(0)}, {S(1)}}), {{"s0", 8}});
  expectMatchesReference(run);
  EXPECT_EQ(kinds(run.collectives), expect({"allgather", "reduce_scatter"}));
  EXPECT_EQ(run.local_outputs[0].placements, Ps{S(0)});
}

TEST(Parallelism, DataParallelMlpNeedsNoCollective) {
  Fusion f;
  models::buildMlp(f, 16, /*residual=*/true);
  ShardedRun run = runSharded(f, layouts({{S(0)}, {R}, {R}}), {{"s0", 8}});
  expectMatchesReference(run);
  EXPECT_THAT(run.collectives, IsEmpty());
  EXPECT_EQ(run.local_outputs[0].placements, Ps{S(0)});
}

std::vector<std::pair<DeviceMesh, Ps>> decoderLayouts(const Ps& x) {
  // x, ln1_w, ln1_b, wq, wk, wv, wo, ln2_w, ln2_b, up_w, down_w
  return layouts({x, {R}, {R}, {S(0)}, {S(0)}, {S(0)}, {S(1)}, {R}, {R}, {S(0)}, {S(1)}});
}

TEST(Parallelism, TensorParallelDecoderLayerHasTwoAllreduces) {
  Fusion f;
  models::buildDecoderLayer(f, {.batch = 2, .seq = 8, .hidden = 32, .heads = 4});
  ShardedRun run = runSharded(f, decoderLayouts({R}));
  expectMatchesReference(run);
  EXPECT_EQ(kinds(run.collectives), expect({"allreduce", "allreduce"}));
}

TEST(Parallelism, SequenceParallelDecoderLayerHasTwoAllgathersAndTwoReduceScatters) {
  Fusion f;
  models::buildDecoderLayer(f, {.batch = 2, .seq = 8, .hidden = 32, .heads = 4});
  ShardedRun run = runSharded(f, decoderLayouts({S(1)}));
  expectMatchesReference(run);
  EXPECT_EQ(kinds(run.collectives), expect({"allgather", "reduce_scatter", "allgather", "reduce_scatter"}));
  EXPECT_EQ(run.local_outputs[0].placements, Ps{S(1)});
}

TEST(Parallelism, DataTimesTensorParallelMlpOnA2x2Mesh) {
  if (worldSize() != 4) GTEST_SKIP() << "needs 4 ranks";
  Fusion f;
  models::buildMlp(f, 16);
  DeviceMesh mesh({0, 1, 2, 3}, {2, 2});  // axis 0 (DIDy): data; axis 1 (DIDx): tensor
  ShardedRun run = runSharded(f, {{mesh, {S(0), R}}, {mesh, {R, S(0)}}, {mesh, {R, S(1)}}}, {{"s0", 8}});
  expectMatchesReference(run);
  ASSERT_EQ(kinds(run.collectives), Strs{"allreduce"});
  Team tensor_axis = worldRank() < 2 ? Team{0, 1} : Team{2, 3};
  EXPECT_EQ(run.collectives[0].team, tensor_axis);
  EXPECT_EQ(run.collectives[0].mesh_axis, 1);
  EXPECT_EQ(run.local_outputs[0].placements, (Ps{S(0), R}));
}

// `out = set(x)` with x placed `from` and out pinned `to`.
ShardedRun redistribute(const Ps& from, const Ps& to) {
  Fusion f;
  TensorView* x = f.defineTensor({8, 12}, DataType::Float, "x");
  TensorView* out = ops::set(x);
  applyPlacements(out, worldMesh(), to);
  f.addOutput(out);
  return runSharded(f, layouts({from}));
}

TEST(Parallelism, RedistributionWithSet) {
  ShardedRun a = redistribute({S(0)}, {S(1)});
  expectMatchesReference(a);
  EXPECT_EQ(kinds(a.collectives), expect({"all_to_all"}));
  ShardedRun b = redistribute({S(0)}, {R});
  expectMatchesReference(b);
  EXPECT_EQ(kinds(b.collectives), expect({"allgather"}));
  ShardedRun c = redistribute({R}, {S(0)});
  expectMatchesReference(c);
  EXPECT_THAT(c.collectives, IsEmpty());
  EXPECT_EQ(c.local_outputs[0].placements, Ps{S(0)});
}

TEST(Parallelism, ElementwiseChainOnShardsNeedsNoCollective) {
  Fusion f;
  TensorView* a = f.defineTensor({-1, 8}, DataType::Float, "a");
  TensorView* b = f.defineTensor({-1, 8}, DataType::Float, "b");
  f.addOutput(ops::tanh(ops::add(ops::mul(a, 2.0), ops::exp(b))));
  ShardedRun run = runSharded(f, layouts({{S(0)}, {S(0)}}), {{"s0", 8}, {"s1", 8}});
  expectMatchesReference(run);
  EXPECT_THAT(run.collectives, IsEmpty());
  EXPECT_EQ(run.local_outputs[0].placements, Ps{S(0)});
}

// a [8, 16] @ b [16, 12] with the contracted dim sharded, times 0.5.
TensorView* contractedMatmul(Fusion& f) {
  TensorView* a = f.defineTensor({8, 16}, DataType::Float, "a");
  TensorView* b = f.defineTensor({16, 12}, DataType::Float, "b");
  return ops::mul(ops::matmul(a, b), 0.5);
}

TEST(Parallelism, PartialOutputPinnedPartialNeedsNoCollective) {
  Fusion f;
  TensorView* y = contractedMatmul(f);
  applyPlacements(y, worldMesh(), {P});
  f.addOutput(y);
  ShardedRun run = runSharded(f, layouts({{S(1)}, {S(0)}}));
  expectMatchesReference(run);  // assembleGlobal sums the Partial blocks
  EXPECT_THAT(run.collectives, IsEmpty());
  EXPECT_EQ(run.local_outputs[0].placements, Ps{P});
}

TEST(Parallelism, NonLinearConsumerForcesOneAllreduceBeforeIt) {
  Fusion f;
  f.addOutput(ops::relu(contractedMatmul(f)));
  ShardedRun run = runSharded(f, layouts({{S(1)}, {S(0)}}));
  expectMatchesReference(run);
  EXPECT_EQ(kinds(run.collectives), expect({"allreduce"}));
  if (worldSize() > 1) {
    // The allreduce produces relu's operand: it happens before the relu.
    const Expr* relu = run.compiled->outputs()[0]->definition();
    ASSERT_EQ(relu->kind(), OpKind::Relu);
    EXPECT_EQ(run.collectives[0].tensor, run.compiled->displayName(relu->input(size_t{0})));
  }
}

TEST(Parallelism, RowParallelLinearAddsTheReplicatedBiasOnce) {
  Fusion f;
  TensorView* x = f.defineTensor({8, 16}, DataType::Float, "x");
  TensorView* w = f.defineTensor({12, 16}, DataType::Float, "w");
  TensorView* b = f.defineTensor({12}, DataType::Float, "b");
  f.addOutput(ops::linear(x, w, b));
  ShardedRun run = runSharded(f, layouts({{S(1)}, {S(1)}, {R}}));
  expectMatchesReference(run);
  EXPECT_EQ(kinds(run.collectives), expect({"allreduce"}));
}

}  // namespace
}  // namespace meshfuse::testing

namespace meshfuse::testing {
namespace {

// Redistribution on a 2x2 mesh where splits of one dim nest across both mesh axes.
TEST(Parallelism, RedistributionOnA2x2MeshKeepsBlockOrder) {
  if (worldSize() != 4) GTEST_SKIP() << "needs 4 ranks";
  DeviceMesh mesh({0, 1, 2, 3}, {2, 2});
  const std::vector<std::pair<Ps, Ps>> cases = {{{R, S(1)}, {S(1), R}},    {{S(1), R}, {R, S(1)}},
                                                {{S(1), S(1)}, {R, S(1)}}, {{S(0), R}, {S(0), S(0)}},
                                                {{S(0), S(1)}, {S(1), S(0)}}, {{R, R}, {S(1), S(1)}}};
  for (const auto& [from, to] : cases) {
    SCOPED_TRACE(placementsToString(from) + " -> " + placementsToString(to));
    Fusion f;
    TensorView* x = f.defineTensor({8, 12}, DataType::Float, "x");
    TensorView* out = ops::set(x);
    applyPlacements(out, mesh, to);
    f.addOutput(out);
    ShardedRun run = runSharded(f, {{mesh, from}});
    expectMatchesReference(run);
    EXPECT_EQ(run.local_outputs[0].placements, to);
  }
}

}  // namespace
}  // namespace meshfuse::testing
