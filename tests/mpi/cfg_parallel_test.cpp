// CFG parallelism, derived (issue 17, docs/parallelisms.md "CFG parallelism"): a denoiser run on
// the two classifier-free-guidance branches as one batch, whose halves are sliced apart and
// combined, uncond + s (cond - uncond). With the batch Shard(0) every rank runs its branch and
// only the combine communicates (one allgather of the prediction); on a 2x2 mesh the branches
// split over mesh axis 0 compose with Ulysses over mesh axis 1. Numerics against single-device
// execution, the exact collectives each rank executes (with their teams) and the static report.
#include "meshfuse/ops.h"
#include "mpi_test_main.h"

namespace meshfuse::testing {
namespace {

using Strs = std::vector<std::string>;

constexpr int64_t kSeq = 8, kHidden = 16, kHeads = 4;
constexpr double kGuidance = 7.5;

// uncond + s (cond - uncond), the first `branch` rows of eps being the unconditional branch.
TensorView* guide(TensorView* eps, int64_t branch) {
  std::vector<int64_t> ends;
  for (const Extent& e : eps->shape()) ends.push_back(e.value());
  std::vector<int64_t> mid(ends.size(), 0);
  mid[0] = branch;
  std::vector<int64_t> first = ends;
  first[0] = branch;
  TensorView* uncond = ops::slice(eps, std::vector<int64_t>(ends.size(), 0), first);
  TensorView* cond = ops::slice(eps, mid, ends);
  return ops::add(uncond, ops::mul(ops::sub(cond, uncond), kGuidance));
}

// A conditioned MLP denoiser of x [2B, S, H] under embedding c [2B, H] (null, then prompt).
std::unique_ptr<Fusion> mlpDenoiser(int64_t branch) {
  auto owned = std::make_unique<Fusion>();
  Fusion& f = *owned;
  TensorView* x = f.defineTensor({2 * branch, kSeq, kHidden}, DataType::Float, "x");
  TensorView* c = f.defineTensor({2 * branch, kHidden}, DataType::Float, "c");
  TensorView* w1 = f.defineTensor({4 * kHidden, kHidden}, DataType::Float, "w1");
  TensorView* w2 = f.defineTensor({kHidden, 4 * kHidden}, DataType::Float, "w2");
  TensorView* cond = ops::broadcastInDim(c, {2 * branch, 1, kHidden}, {0, 2});
  TensorView* eps = ops::linear(ops::gelu(ops::linear(ops::add(x, cond), w1), "tanh"), w2);
  f.addOutput(guide(eps, branch));
  return owned;
}

TEST(CfgParallel, EachRankRunsOneBranchAndOnlyTheCombineCommunicates) {
  // 1 and 2 ranks: one row per branch; 4 ranks: two (data parallel inside each branch too).
  const int64_t branch = worldSize() == 4 ? 2 : 1;
  const DeviceMesh mesh = worldMesh();
  ShardedRun run = runSharded(*mlpDenoiser(branch), {{mesh, {S(0)}}, {mesh, {S(0)}}, {mesh, {R}}, {mesh, {R}}});
  expectMatchesReference(run);
  expectSameCollectives(run.reported, run.collectives);
  EXPECT_EQ(run.local_outputs[0].placements, Ps{R});
  if (worldSize() == 1) {
    EXPECT_TRUE(run.collectives.empty());
    return;
  }
  ASSERT_EQ(kinds(run.collectives), Strs{"allgather"});
  // The prediction of both branches, [2B, S, H], gathered once for both slices: every rank
  // sends its branch's block.
  EXPECT_EQ(run.collectives[0].bytes, (2 * branch / worldSize()) * kSeq * kHidden * 4);
}

// x [2B, S, H] through a self-attention block (q/k/v/o projections, heads split by reshape and
// permute), then guided: the denoiser of a DiT without its modulation (examples/python/dit_cfg.py
// has the whole block).
std::unique_ptr<Fusion> attentionDenoiser() {
  auto owned = std::make_unique<Fusion>();
  Fusion& f = *owned;
  TensorView* x = f.defineTensor({2, kSeq, kHidden}, DataType::Float, "x");
  TensorView* w[4];
  for (int i = 0; i < 4; ++i) w[i] = f.defineTensor({kHidden, kHidden}, DataType::Float, fmt::format("w{}", i));
  auto heads = [&](TensorView* t) {
    return ops::permute(ops::reshape(t, {2, kSeq, kHeads, kHidden / kHeads}), {0, 2, 1, 3});
  };
  TensorView* a = ops::sdpa(heads(ops::linear(x, w[0])), heads(ops::linear(x, w[1])), heads(ops::linear(x, w[2])));
  TensorView* merged = ops::reshape(ops::permute(a, {0, 2, 1, 3}), {2, kSeq, kHidden});
  f.addOutput(guide(ops::add(x, ops::linear(merged, w[3])), 1));
  return owned;
}

MPI_TEST(CfgParallel, ComposesWithUlyssesOnA2x2Mesh, exactly(4, "a 2x2 mesh: CFG x sequence")) {
  const DeviceMesh mesh({0, 1, 2, 3}, {2, 2});  // axis 0 (DIDy): the branches; axis 1 (DIDx): the sequence
  ShardedRun run = runSharded(*attentionDenoiser(),
                              {{mesh, {S(0), S(1)}}, {mesh, {R, R}}, {mesh, {R, R}}, {mesh, {R, R}}, {mesh, {R, R}}});
  expectMatchesReference(run);
  expectSameCollectives(run.reported, run.collectives);
  // Ulysses inside each branch: q, k and v to a split of the heads over the sequence axis; the
  // attention output, hidden-split after the heads merge, makes the output projection's
  // contraction a pending sum that the residual add reduce-scatters back to the sequence split;
  // the combine gathers the two branches over the CFG axis. The output keeps the sequence split.
  ASSERT_EQ(kinds(run.collectives), (Strs{"all_to_all", "all_to_all", "all_to_all", "reduce_scatter", "allgather"}));
  const int64_t r = worldRank();
  const Team sequence_axis = r < 2 ? Team{0, 1} : Team{2, 3}, cfg_axis = r % 2 == 0 ? Team{0, 2} : Team{1, 3};
  for (size_t i = 0; i + 1 < run.collectives.size(); ++i) {
    EXPECT_EQ(run.collectives[i].team, sequence_axis) << i;
    EXPECT_EQ(run.collectives[i].mesh_axis, 1) << i;
  }
  EXPECT_EQ(run.collectives.back().team, cfg_axis);
  EXPECT_EQ(run.collectives.back().mesh_axis, 0);
  EXPECT_EQ(run.local_outputs[0].placements, (Ps{R, S(1)}));
}

// The same with ring attention inside each branch (--cp=ring): the sequence halves of k and v
// rotate over mesh axis 1 by send/recv (no all-to-all, no allgather of k or v), the combine still
// gathers the branches over axis 0.
MPI_TEST(CfgParallel, ComposesWithRingAttentionOnA2x2Mesh, exactly(4, "a 2x2 mesh: CFG x sequence")) {
  const DeviceMesh mesh({0, 1, 2, 3}, {2, 2});
  ExecutorOptions options;
  options.pipeline.propagation.context_parallel = ContextParallel::Ring;
  ShardedRun run = runSharded(*attentionDenoiser(),
                              {{mesh, {S(0), S(1)}}, {mesh, {R, R}}, {mesh, {R, R}}, {mesh, {R, R}}, {mesh, {R, R}}},
                              {}, options);
  expectMatchesReference(run);
  expectSameCollectives(run.reported, run.collectives);
  const int64_t r = worldRank();
  const Team sequence_axis = r < 2 ? Team{0, 1} : Team{2, 3}, cfg_axis = r % 2 == 0 ? Team{0, 2} : Team{1, 3};
  int64_t sends = 0;
  for (const CollectiveInfo& c : run.collectives) {
    EXPECT_NE(c.kind, CommKind::AllToAll);
    if (c.kind == CommKind::SendRecv) {  // a pair of ranks of this rank's sequence axis
      ++sends;
      for (int64_t peer : c.team) EXPECT_NE(std::find(sequence_axis.begin(), sequence_axis.end(), peer), sequence_axis.end());
    }
  }
  EXPECT_EQ(sends, 4);
  // One rotation step of k and one of v (2 ranks per ring) in each of 2 head groups, then the
  // combine. The attention output keeps its query rows' sequence split, so the output projection
  // needs no collective.
  ASSERT_EQ(kinds(run.collectives), (Strs{"send_recv", "send_recv", "send_recv", "send_recv", "allgather"}));
  EXPECT_EQ(run.collectives.back().team, cfg_axis);
  EXPECT_EQ(run.local_outputs[0].placements, (Ps{R, S(1)}));
}

}  // namespace
}  // namespace meshfuse::testing
