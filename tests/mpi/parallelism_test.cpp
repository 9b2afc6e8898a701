// Every parallelism of the multi-rank issue, on however many ranks mpirun started (1, 2, 4):
// numerics against single-device execution AND the exact collectives each rank executes.
#include "meshfuse/ops.h"
#include "models.h"
#include "mpi_test_main.h"

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

// On a 1-D mesh over the world every collective is along mesh axis 0 among all ranks.
void expectWorldTeams(const ShardedRun& run) {
  for (const CollectiveInfo& c : run.collectives) {
    EXPECT_EQ(c.mesh_axis, 0) << c.tensor;
    EXPECT_EQ(c.team, worldMesh().devices()) << c.tensor;
  }
}

TEST(Parallelism, MegatronTensorParallelMlpHasOneAllreduce) {
  Fusion f;
  models::buildMlp(f, 16);
  ShardedRun run = runSharded(f, layouts({{R}, {S(0)}, {S(1)}}), {{"s0", 12}});
  expectMatchesReference(run);
  EXPECT_EQ(kinds(run.collectives), expect({"allreduce"}));
  expectWorldTeams(run);
  EXPECT_EQ(run.local_outputs[0].placements, Ps{R});
}

TEST(Parallelism, SequenceParallelMlpGathersThenReduceScatters) {
  Fusion f;
  models::buildMlp(f, 16);
  ShardedRun run = runSharded(f, layouts({{S(0)}, {S(0)}, {S(1)}}), {{"s0", 8}});
  expectMatchesReference(run);
  EXPECT_EQ(kinds(run.collectives), expect({"allgather", "reduce_scatter"}));
  expectWorldTeams(run);
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
  expectWorldTeams(run);
}

TEST(Parallelism, SequenceParallelDecoderLayerHasTwoAllgathersAndTwoReduceScatters) {
  Fusion f;
  models::buildDecoderLayer(f, {.batch = 2, .seq = 8, .hidden = 32, .heads = 4});
  ShardedRun run = runSharded(f, decoderLayouts({S(1)}));
  expectMatchesReference(run);
  EXPECT_EQ(kinds(run.collectives), expect({"allgather", "reduce_scatter", "allgather", "reduce_scatter"}));
  expectWorldTeams(run);
  EXPECT_EQ(run.local_outputs[0].placements, Ps{S(1)});
}

// The layer as Megatron and Thunder write it: x [s, h], heads made by reshape [s, nh, hd] ->
// permute -> reshape [1, nh, s, hd]. The leading 1 is inserted and removed beside the sharded
// heads, which keep their shard through it: the same collectives as the batched layer.
constexpr models::DecoderShape kLeadingOneLayer{
    .batch = 1, .seq = 8, .hidden = 32, .heads = 4, .layout = models::BatchLayout::LeadingOne};

TEST(Parallelism, TensorParallelDecoderLayerWithALeadingOneHasTwoAllreduces) {
  Fusion f;
  models::buildDecoderLayer(f, kLeadingOneLayer);
  ShardedRun run = runSharded(f, decoderLayouts({R}));
  expectMatchesReference(run);
  EXPECT_EQ(kinds(run.collectives), expect({"allreduce", "allreduce"}));
  expectWorldTeams(run);
  // Each allreduce is a [s, h] f32 pending sum: the projection's and the MLP's.
  for (const CollectiveInfo& c : run.collectives) EXPECT_EQ(c.bytes, 8 * 32 * 4) << c.tensor;
  EXPECT_EQ(run.local_outputs[0].placements, Ps{R});
}

TEST(Parallelism, SequenceParallelDecoderLayerWithALeadingOneHasTwoAllgathersAndTwoReduceScatters) {
  Fusion f;
  models::buildDecoderLayer(f, kLeadingOneLayer);
  ShardedRun run = runSharded(f, decoderLayouts({S(0)}));
  expectMatchesReference(run);
  EXPECT_EQ(kinds(run.collectives), expect({"allgather", "reduce_scatter", "allgather", "reduce_scatter"}));
  expectWorldTeams(run);
  EXPECT_EQ(run.local_outputs[0].placements, Ps{S(0)});
}

MPI_TEST(Parallelism, DataTimesTensorParallelMlpOnA2x2Mesh, exactly(4)) {
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
  expectWorldTeams(a);
  expectWorldTeams(b);
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

// A matmul pinned Partial whose operands are whole: its contraction is split locally (each rank
// slices its block of k), no communication.
TEST(Parallelism, MatmulPinnedPartialSplitsItsContraction) {
  Fusion f;
  TensorView* a = f.defineTensor({8, 16}, DataType::Float, "a");
  TensorView* b = f.defineTensor({16, 12}, DataType::Float, "b");
  TensorView* y = ops::matmul(a, b);
  applyPlacements(y, worldMesh(), {P});
  f.addOutput(y);
  ShardedRun run = runSharded(f, layouts({{R}, {R}}));
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
  expectWorldTeams(run);
}

// A pending sum (Partial) stays pending only through ops linear in it (DESIGN.md): a scalar or a
// replicated value added to it, or any non-linear use, needs the sum first.

// %q = a [8, 16] @ b [16, 12] with the contracted dim sharded: Partial on every rank.
TensorView* pendingSum(Fusion& f) {
  TensorView* a = f.defineTensor({8, 16}, DataType::Float, "a");
  TensorView* b = f.defineTensor({16, 12}, DataType::Float, "b");
  TensorView* q = ops::matmul(a, b);
  f.rename(q, "q");
  return q;
}

// The one allreduce reduces %q itself (every consumer shares it), not a later value.
void expectOneAllreduceOfQ(const ShardedRun& run) {
  EXPECT_EQ(kinds(run.collectives), expect({"allreduce"}));
  if (worldSize() > 1) {
    EXPECT_EQ(run.collectives[0].source, "%q");
  }
  expectWorldTeams(run);
}

TEST(Parallelism, ScalarAddedToAPendingSumIsAddedOnce) {
  Fusion f;
  TensorView* q = pendingSum(f);
  f.addOutput(ops::add(q, 1.0));
  f.addOutput(ops::sub(q, 1.0));
  f.addOutput(ops::sub(3.0, q));
  ShardedRun run = runSharded(f, layouts({{S(1)}, {S(0)}}));
  expectMatchesReference(run);
  expectOneAllreduceOfQ(run);
}

TEST(Parallelism, PendingSumIsReducedBeforeANonLinearUse) {
  Fusion f;
  TensorView* q = pendingSum(f);
  TensorView* r = f.defineTensor({8, 12}, DataType::Float, "r");
  f.addOutput(ops::div(r, q));  // q is the denominator
  f.addOutput(ops::div(2.0, q));
  f.addOutput(ops::div(q, q));  // one value in two operands: not linear in it
  f.addOutput(ops::mul(q, q));
  ShardedRun run = runSharded(f, layouts({{S(1)}, {S(0)}, {R}}));
  expectMatchesReference(run);
  expectOneAllreduceOfQ(run);
}

TEST(Parallelism, PendingSumPassesThroughLinearOpsAndIsReducedOnceAtTheEnd) {
  Fusion f;
  TensorView* q = pendingSum(f);
  TensorView* r = f.defineTensor({8, 12}, DataType::Float, "r");
  TensorView* y = ops::sum(ops::mul(ops::div(ops::neg(q), 4.0), r), {1});
  f.addOutput(y);
  ShardedRun run = runSharded(f, layouts({{S(1)}, {S(0)}, {R}}));
  expectMatchesReference(run);
  EXPECT_EQ(kinds(run.collectives), expect({"allreduce"}));
  // The sum of 8 rows is reduced, not the [8, 12] matmul.
  if (worldSize() > 1) {
    EXPECT_EQ(run.collectives[0].bytes, 8 * 4);
  }
}

// linear(x Shard(1), w Shard(1)): a row-parallel linear, Partial.
TensorView* rowParallelLinear(Fusion& f) {
  TensorView* x = f.defineTensor({8, 16}, DataType::Float, "x");
  TensorView* w = f.defineTensor({12, 16}, DataType::Float, "w");
  TensorView* q = ops::linear(x, w);
  f.rename(q, "q");
  return q;
}

TEST(Parallelism, RowParallelLinearFollowedByScalarsAndGelu) {
  Fusion f;
  TensorView* q = rowParallelLinear(f);
  f.addOutput(ops::add(q, 1.0));
  f.addOutput(ops::gelu(ops::sub(q, 0.5)));
  ShardedRun run = runSharded(f, layouts({{S(1)}, {S(1)}}));
  expectMatchesReference(run);
  expectOneAllreduceOfQ(run);
}

TEST(Parallelism, HandWrittenRmsNormAfterRowParallelLinearHasOneAllreduce) {
  Fusion f;
  TensorView* q = rowParallelLinear(f);
  TensorView* rms = ops::rsqrt(ops::add(ops::mean(ops::mul(q, q), {1}, /*keepdim=*/true), 1e-6));
  f.addOutput(ops::mul(q, rms));
  ShardedRun run = runSharded(f, layouts({{S(1)}, {S(1)}}));
  expectMatchesReference(run);
  expectOneAllreduceOfQ(run);
}

// One value in two operands that need it in different shardings: matmul(%h, %h) with %h
// sharded on rows keeps the left operand's rows and gathers the right operand whole.
TEST(Parallelism, OneValueInTwoOperandsIsReshardedPerOperand) {
  Fusion f;
  TensorView* x = f.defineTensor({8, 8}, DataType::Float, "x");
  TensorView* h = ops::relu(x);
  f.addOutput(ops::matmul(h, h));
  ShardedRun run = runSharded(f, layouts({{S(0)}}));
  expectMatchesReference(run);
  EXPECT_EQ(kinds(run.collectives), expect({"allgather"}));
  EXPECT_EQ(run.local_outputs[0].placements, Ps{S(0)});
  if (worldSize() > 1) {
    const Expr* mm = run.compiled->outputs()[0]->definition();
    ASSERT_EQ(mm->kind(), OpKind::Matmul);
    EXPECT_NE(mm->input(size_t{0}), mm->input(size_t{1}));
  }
}

// A linear of a pending sum with a replicated weight is linear in it: one allreduce, of the
// output, and no reduce-scatter of the input first.
TEST(Parallelism, LinearOfAPendingSumHasOneAllreduce) {
  Fusion f;
  TensorView* x = f.defineTensor({8, 16}, DataType::Float, "x");
  TensorView* w = f.defineTensor({12, 16}, DataType::Float, "w");
  f.addOutput(ops::linear(x, w));
  ShardedRun run = runSharded(f, layouts({{P}, {R}}));
  expectMatchesReference(run);
  EXPECT_EQ(kinds(run.collectives), expect({"allreduce"}));
  expectWorldTeams(run);
  EXPECT_EQ(run.local_outputs[0].placements, Ps{R});
  // With a column-parallel weight the input is reduced once, then the output stays sharded.
  ShardedRun col = runSharded(f, layouts({{P}, {S(0)}}));
  expectMatchesReference(col);
  EXPECT_EQ(kinds(col.collectives), expect({"allreduce"}));
  if (worldSize() > 1) {
    EXPECT_EQ(col.collectives[0].source, "%x");
  }
  EXPECT_EQ(col.local_outputs[0].placements, Ps{S(1)});
}

// An input the caller leaves unplaced takes the sharding its consumer needs (backward
// propagation) instead of staying replicated and making the sharded operand be gathered.
TEST(Parallelism, OpenInputFollowsItsShardedConsumer) {
  Fusion f;
  TensorView* a = f.defineTensor({8, 16}, DataType::Float, "a");
  TensorView* b = f.defineTensor({8, 16}, DataType::Float, "b");
  f.addOutput(ops::exp(ops::add(a, b)));
  std::vector<std::pair<DeviceMesh, Ps>> placed = {{worldMesh(), {S(0)}}, {DeviceMesh(), {}}};
  ShardedRun run = runSharded(f, placed);
  expectMatchesReference(run);
  EXPECT_THAT(run.collectives, IsEmpty());
  EXPECT_EQ(placementsOf(run.compiled->inputs()[1]), Ps{S(0)});
  EXPECT_EQ(run.local_outputs[0].placements, Ps{S(0)});
}

// A parameter operand left open (a batched matmul's b, a linear's weight) follows its op too: it
// takes the batch shard, or stays whole, rather than deciding where the op runs.
TEST(Parallelism, OpenParameterOperandFollowsItsOp) {
  Fusion f;
  TensorView* a = f.defineTensor({4, 8, 16}, DataType::Float, "a");
  TensorView* b = f.defineTensor({4, 16, 12}, DataType::Float, "b");
  TensorView* w = f.defineTensor({6, 12}, DataType::Float, "w");
  f.addOutput(ops::linear(ops::matmul(a, b), w));
  std::vector<std::pair<DeviceMesh, Ps>> placed = {{worldMesh(), {S(0)}}, {DeviceMesh(), {}}, {DeviceMesh(), {}}};
  ShardedRun run = runSharded(f, placed);
  expectMatchesReference(run);
  EXPECT_THAT(run.collectives, IsEmpty());
  EXPECT_EQ(placementsOf(run.compiled->inputs()[1]), Ps{S(0)});
  EXPECT_EQ(placementsOf(run.compiled->inputs()[2]), Ps{R});
  EXPECT_EQ(run.local_outputs[0].placements, Ps{S(0)});
}

// ... and so do the values computed only from such inputs: %t = tanh(%b + %c) is computed on
// the rows %a has, from rows of %b and %c.
TEST(Parallelism, ValuesComputedFromOpenInputsFollowTheirConsumer) {
  Fusion f;
  TensorView* a = f.defineTensor({8, 16}, DataType::Float, "a");
  TensorView* b = f.defineTensor({8, 16}, DataType::Float, "b");
  TensorView* c = f.defineTensor({8, 16}, DataType::Float, "c");
  f.addOutput(ops::mul(a, ops::tanh(ops::add(b, c))));
  std::vector<std::pair<DeviceMesh, Ps>> placed = {{worldMesh(), {S(0)}}, {DeviceMesh(), {}}, {DeviceMesh(), {}}};
  ShardedRun run = runSharded(f, placed);
  expectMatchesReference(run);
  EXPECT_THAT(run.collectives, IsEmpty());
  EXPECT_EQ(placementsOf(run.compiled->inputs()[1]), Ps{S(0)});
  EXPECT_EQ(placementsOf(run.compiled->inputs()[2]), Ps{S(0)});
}

// An op output the user pins sharded along a dim the op cannot split (softmax's normalized dim)
// is computed whole and sliced: the gather its operand needs, then no more communication.
TEST(Parallelism, PinnedOutputTheOpCannotSplitIsComputedWholeThenSliced) {
  Fusion f;
  TensorView* x = f.defineTensor({8, 12}, DataType::Float, "x");
  TensorView* y = ops::softmax(x, 1);
  applyPlacements(y, worldMesh(), {S(1)});
  f.addOutput(ops::exp(y));
  ShardedRun run = runSharded(f, layouts({{S(1)}}));
  expectMatchesReference(run);
  EXPECT_EQ(kinds(run.collectives), expect({"allgather"}));
  EXPECT_EQ(run.local_outputs[0].placements, Ps{S(1)});
}

// Attention with `heads` heads: x [2, 8, 32], QKV projections, sdpa, out-projection.
void buildAttention(Fusion& f, int64_t heads) {
  TensorView* x = f.defineTensor({2, 8, 32}, DataType::Float, "x");
  TensorView* wq = f.defineTensor({32, 32}, DataType::Float, "wq");
  TensorView* wk = f.defineTensor({32, 32}, DataType::Float, "wk");
  TensorView* wv = f.defineTensor({32, 32}, DataType::Float, "wv");
  TensorView* wo = f.defineTensor({32, 32}, DataType::Float, "wo");
  auto toHeads = [&](TensorView* t) { return ops::permute(ops::reshape(t, {2, 8, heads, 32 / heads}), {0, 2, 1, 3}); };
  TensorView* a = ops::sdpa(toHeads(ops::linear(x, wq)), toHeads(ops::linear(x, wk)), toHeads(ops::linear(x, wv)),
                            /*is_causal=*/true);
  f.addOutput(ops::linear(ops::reshape(ops::permute(a, {0, 2, 1, 3}), {2, 8, 32}), wo));
}

TEST(Parallelism, TensorParallelAttentionHasOneAllreduce) {
  Fusion f;
  buildAttention(f, /*heads=*/4);
  ShardedRun run = runSharded(f, layouts({{R}, {S(0)}, {S(0)}, {S(0)}, {S(1)}}));
  expectMatchesReference(run);
  EXPECT_EQ(kinds(run.collectives), expect({"allreduce"}));
  expectWorldTeams(run);
  EXPECT_EQ(run.local_outputs[0].placements, Ps{R});
}

// Fewer heads than ranks: the heads cannot be split, so the projections are gathered before
// the reshape into heads (no uneven intermediate shard is made).
TEST(Parallelism, AttentionWithFewerHeadsThanRanksGathersTheProjections) {
  Fusion f;
  buildAttention(f, /*heads=*/2);
  ShardedRun run = runSharded(f, layouts({{R}, {S(0)}, {S(0)}, {S(0)}, {S(1)}}));
  expectMatchesReference(run);
  Strs want = worldSize() > 2 ? Strs{"allgather", "allgather", "allgather", "allreduce"} : expect({"allreduce"});
  EXPECT_EQ(kinds(run.collectives), want);
  expectWorldTeams(run);
}

}  // namespace
}  // namespace meshfuse::testing

namespace meshfuse::testing {
namespace {

// Redistribution on a 2x2 mesh where splits of one dim nest across both mesh axes.
MPI_TEST(Parallelism, RedistributionOnA2x2MeshKeepsBlockOrder, exactly(4)) {
  DeviceMesh mesh({0, 1, 2, 3}, {2, 2});
  const std::vector<std::pair<Ps, Ps>> cases = {{{R, S(1)}, {S(1), R}},       {{S(1), R}, {R, S(1)}},
                                                {{S(1), S(1)}, {R, S(1)}},    {{S(0), R}, {S(0), S(0)}},
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
