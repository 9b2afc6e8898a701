// Context parallelism of attention, derived by propagation (issue 17): q, k and v arriving
// sharded on the sequence dim. Ulysses (the default where the heads divide the group) moves them
// to a split of the heads by all-to-all, runs attention on whole sequences locally and, when the
// output is wanted sharded on the sequence again, moves it back: four all-to-alls. `gather`
// all-gathers k and v instead (the query keeps its rows); ring attention has its own suite
// (ring_attention_test.cpp). Numerics against single-device execution, the exact collectives
// each rank executes and the static report, on 1, 2 and 4 ranks.
#include "meshfuse/ops.h"
#include "mpi_test_main.h"

namespace meshfuse::testing {
namespace {

using Strs = std::vector<std::string>;

Strs expect(Strs kinds) { return worldSize() > 1 ? kinds : Strs{}; }

constexpr int64_t kBatch = 2, kSeq = 16, kHeadDim = 8;

// a = sdpa(q, k, v) over [batch, heads, seq, head_dim], q/k/v Shard(2) (the sequence); with
// `pin_seq` the output is pinned Shard(2) too (the next layer's sequence parallelism).
ShardedRun attention(int64_t heads, bool causal, bool pin_seq, ContextParallel cp) {
  Fusion f;
  auto in = [&](const char* name) { return f.defineTensor({kBatch, heads, kSeq, kHeadDim}, DataType::Float, name); };
  TensorView *q = in("q"), *k = in("k"), *v = in("v");
  TensorView* a = ops::sdpa(q, k, v, causal);
  f.rename(a, "a");
  if (pin_seq) applyPlacements(a, worldMesh(), {S(2)});
  f.addOutput(a);
  ExecutorOptions options;
  options.pipeline.propagation.context_parallel = cp;
  std::vector<std::pair<DeviceMesh, Ps>> layouts(3, {worldMesh(), Ps{S(2)}});
  return runSharded(f, layouts, {}, options);
}

void expectPlan(const ShardedRun& run, const Strs& want) {
  expectMatchesReference(run);
  expectSameCollectives(run.reported, run.collectives);
  EXPECT_EQ(kinds(run.collectives), expect(want));
}

TEST(ContextParallel, UlyssesIsFourAllToAllsWhenTheOutputStaysSequenceSharded) {
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal);
    ShardedRun run = attention(/*heads=*/4, causal, /*pin_seq=*/true, ContextParallel::Auto);
    expectPlan(run, {"all_to_all", "all_to_all", "all_to_all", "all_to_all"});
    EXPECT_EQ(run.local_outputs[0].placements, Ps{S(2)});
    if (worldSize() == 1) continue;
    // Each all-to-all sends the (n-1)/n of this rank's [2, 4, 16/n, 8] f32 block that other
    // ranks' heads need; the collective's size is the block it starts from.
    const int64_t block = kBatch * 4 * (kSeq / worldSize()) * kHeadDim * 4;
    for (const CollectiveInfo& c : run.collectives) EXPECT_EQ(c.bytes, block) << c.tensor;
  }
}

TEST(ContextParallel, UlyssesLeavesAnUnpinnedOutputSplitByHeads) {
  ShardedRun run = attention(/*heads=*/4, /*causal=*/true, /*pin_seq=*/false, ContextParallel::Ulysses);
  expectPlan(run, {"all_to_all", "all_to_all", "all_to_all"});
  EXPECT_EQ(run.local_outputs[0].placements, Ps{S(1)});
}

TEST(ContextParallel, GatherAllGathersKAndV) {
  // Each query row's attention is computed where the row is: only the keys and values move, and
  // the output keeps the sequence split.
  ShardedRun run = attention(/*heads=*/4, /*causal=*/true, /*pin_seq=*/false, ContextParallel::Gather);
  expectPlan(run, {"allgather", "allgather"});
  EXPECT_EQ(run.local_outputs[0].placements, Ps{S(2)});
}

MPI_TEST(ContextParallel, AutoRotatesKAndVWhenTheHeadsDoNotDivide, exactly(4, "2 heads divide 1 and 2")) {
  // 2 heads on 4 ranks: Ulysses cannot split them, so k and v rotate around the ring (3 steps),
  // in 4 head groups (the 2 x 2 (batch, head) pairs: a quarter of a block each step).
  ShardedRun run = attention(/*heads=*/2, /*causal=*/false, /*pin_seq=*/false, ContextParallel::Auto);
  expectPlan(run, Strs(4 * 6, "send_recv"));
}

// Asked for, Ulysses splits heads the mesh does not divide as torch.chunk does: 2 heads on 4
// ranks are 1, 1, 0, 0 (two ranks attend to no head); all-to-alls of blocks of different sizes.
TEST(ContextParallel, UlyssesAskedForWithHeadsThatDoNotDivideSplitsThemUnevenly) {
  ShardedRun run = attention(/*heads=*/2, /*causal=*/false, /*pin_seq=*/false, ContextParallel::Ulysses);
  expectPlan(run, {"all_to_all", "all_to_all", "all_to_all"});
  EXPECT_EQ(run.local_outputs[0].placements, Ps{S(1)});
  EXPECT_EQ(run.local_outputs[0].local.shape()[1], chunkSpan(2, worldSize(), worldRank()).size);
}

}  // namespace
}  // namespace meshfuse::testing
