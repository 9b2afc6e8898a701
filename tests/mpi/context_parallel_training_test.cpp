// Context parallelism trains (issue 17, deliverable 6): attention's gradient is the first-class
// op sdpa_grad (attention's sharding rule), so with q, k and v sequence-sharded the backward is
// Ulysses too: the saved q, k, v, the output's gradient and delta move to a split of the heads by
// all-to-all, the gradients are computed on whole sequences, and dq, dk, dv move back; or, with
// the heads not divisible or cp = ring, ring attention's backward (blocks rotate). Gradients
// against single-device execution (the reference executor's sdpa_grad, in f64) and the exact
// collectives, on 1, 2 and 4 ranks; an attention layer trained by TrainingExecutor with its
// tokens sequence-sharded against the same training on one device.
#include <cmath>
#include <map>

#include "driver/backends.h"
#include "lower/pipeline.h"
#include "meshfuse/autodiff.h"
#include "meshfuse/ops.h"
#include "meshfuse/training_executor.h"
#include "mpi_test_main.h"

namespace meshfuse::testing {
namespace {

using Strs = std::vector<std::string>;

Strs expect(Strs kinds) { return worldSize() > 1 ? kinds : Strs{}; }

// The mirrored exchanges (send/recv of half a rank's rows with rank n - 1 - r) that balance a
// causal ring attention's backward: the lse's ring takes q in the balanced layout and gives the
// lse back (2), dq's takes q, the output's gradient, lse and delta and gives dq back (5), the ring
// of dk and dv takes k and v and gives both gradients back (4).
constexpr int64_t kBalanceExchanges = 11;

// The backward fusion of sdpa(q, k, v) ([2, 4, 16, 8], placed Shard(2) on the world: autodiff
// places the backward's inputs like the forward tensors they stand for, the seed like the output,
// and pins each gradient to its input's placement).
Gradients attentionGradients(bool causal) {
  Fusion f;
  std::vector<TensorView*> in;
  for (const char* name : {"q", "k", "v"}) {
    in.push_back(f.defineTensor({2, 4, 16, 8}, DataType::Float, name));
    applyPlacements(in.back(), worldMesh(), {S(2)});
  }
  TensorView* a = ops::sdpa(in[0], in[1], in[2], causal);
  applyPlacements(a, worldMesh(), {S(2)});
  f.addOutput(a);
  return differentiate(f, {0}, {0, 1, 2});
}

TEST(ContextParallelTraining, UlyssesBackwardIsEightAllToAlls) {
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal);
    Gradients g = attentionGradients(causal);
    std::vector<std::pair<DeviceMesh, Ps>> layouts(g.backward->inputs().size(), {worldMesh(), Ps{S(2)}});
    ShardedRun run = runSharded(*g.backward, layouts);
    expectMatchesReference(run);
    expectSameCollectives(run.reported, run.collectives);
    // In: the saved q, k, v, the output's gradient and delta = rowsum(grad * output) (computed
    // where grad and the saved output are), each from the sequence split to the heads' (as the
    // forward's three); out: dq, dk and dv back to their inputs' sequence split.
    EXPECT_EQ(kinds(run.collectives), expect(Strs(8, "all_to_all")));
    for (size_t i = 0; i < run.local_outputs.size(); ++i) EXPECT_EQ(run.local_outputs[i].placements, Ps{S(2)}) << i;
  }
}

// Ring attention trains: with two heads, which 4 ranks do not split, or with cp = ring, each
// sdpa_grad keeps its own rows (dq query rows, dk and dv key rows) and the other side's blocks
// rotate: the log-sum-exp's ring rotates k, dq's k and v, and the one ring of dk and dv (one
// kernel computes both) q, the seed, the lse and delta. Every transfer is a send/recv (n - 1 per
// rotating tensor and head group: each ring runs in 4 groups of 2 heads, 4 x 7 (n - 1)), none an
// allgather.
TEST(ContextParallelTraining, RingBackwardRotatesBlocksAndMatchesSingleDevice) {
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal);
    Gradients g = attentionGradients(causal);
    std::vector<std::pair<DeviceMesh, Ps>> layouts(g.backward->inputs().size(), {worldMesh(), Ps{S(2)}});
    ExecutorOptions options;
    options.pipeline.propagation.context_parallel = ContextParallel::Ring;
    ShardedRun run = runSharded(*g.backward, layouts, {}, options);
    expectMatchesReference(run);
    expectSameCollectives(run.reported, run.collectives);
    const int64_t n = worldSize();
    // Causal: the work is balanced as in the forward (kBalanceExchanges more, below).
    EXPECT_EQ(kinds(run.collectives), expect(Strs(4 * 7 * (n - 1) + (causal ? kBalanceExchanges : 0), "send_recv")));
    for (size_t i = 0; i < run.local_outputs.size(); ++i) EXPECT_EQ(run.local_outputs[i].placements, Ps{S(2)}) << i;
  }
}

// Causal ring attention's backward balances its work as the forward does: each ring keeps its
// rows in two chunks, i and 2n - 1 - i, so every rank attends the same (query chunk, key chunk)
// pairs, 2n + 1 of them, in each of the three rings (the lse's, dq's, and the one of dk and dv).
MPI_TEST(ContextParallelTraining, CausalRingBackwardIsBalanced, atLeast(2, "no ring on one rank")) {
  const int64_t n = worldSize();
  Gradients g = attentionGradients(true);
  PipelineOptions options;
  options.propagation.context_parallel = ContextParallel::Ring;
  CompiledProgram p = compile(g.backward->clone(), options);
  for (int64_t rank = 0; rank < n; ++rank) {
    std::vector<AttentionBlocks> blocks = attentionBlocks(programForRank(p, rank), {});
    ASSERT_EQ(blocks.size(), 3u);
    for (const AttentionBlocks& b : blocks) {
      EXPECT_EQ(b.steps, n) << b.tensor;
      EXPECT_EQ(b.chunk, 16 / (2 * n)) << b.tensor;
      EXPECT_EQ(b.attended, 2 * n + 1) << b.tensor << " on rank " << rank;
      EXPECT_EQ(b.skipped, 2 * n - 1) << b.tensor << " on rank " << rank;
    }
  }
}

// The 2-D hybrid trains: on a 2x2 mesh with the sequence split on both axes and heads that divide
// 2 but not 4 (auto), each gradient takes Ulysses on the inner axis (all-to-alls there) and ring
// attention's backward on the outer one (send/recvs there). One sequence: a batch of two would
// be split over the outer axis instead, which sends fewer bytes than the ring (the plan search,
// search_placements.h).
MPI_TEST(ContextParallelTraining, HybridUlyssesAndRingBackwardOnA2x2Mesh, exactly(4, "a 2x2 mesh")) {
  const DeviceMesh mesh({0, 1, 2, 3}, {2, 2});
  Fusion f;
  std::vector<TensorView*> in;
  for (const char* name : {"q", "k", "v"}) {
    in.push_back(f.defineTensor({1, 2, 16, 8}, DataType::Float, name));
    applyPlacements(in.back(), mesh, {S(2), S(2)});
  }
  TensorView* a = ops::sdpa(in[0], in[1], in[2], true);
  applyPlacements(a, mesh, {S(2), S(2)});
  f.addOutput(a);
  Gradients g = differentiate(f, {0}, {0, 1, 2});
  std::vector<std::pair<DeviceMesh, Ps>> layouts(g.backward->inputs().size(), {mesh, Ps{S(2), S(2)}});
  ShardedRun run = runSharded(*g.backward, layouts);
  expectMatchesReference(run);
  expectSameCollectives(run.reported, run.collectives);
  int64_t sends = 0;
  for (const CollectiveInfo& c : run.collectives) {
    EXPECT_NE(c.kind, CommKind::Allgather) << c.source;
    if (c.kind == CommKind::SendRecv) ++sends;
    EXPECT_EQ(c.mesh_axis, c.kind == CommKind::SendRecv ? 0 : 1) << commKindName(c.kind) << " " << c.source;
  }
  // One step (2 ranks on axis 0) per rotating tensor: k; k, v; q, grad, lse, delta; and the
  // causal balance's exchanges.
  EXPECT_EQ(sends, 7 + kBalanceExchanges);
}

// The same on the reference backend (the f64 oracle's own attention-gradient steps).
TEST(ContextParallelTraining, RingBackwardOnTheReferenceBackend) {
  Gradients g = attentionGradients(true);
  std::vector<std::pair<DeviceMesh, Ps>> layouts(g.backward->inputs().size(), {worldMesh(), Ps{S(2)}});
  ExecutorOptions options;
  options.pipeline.propagation.context_parallel = ContextParallel::Ring;
  ShardedRun run = runSharded(*g.backward, layouts, {}, options, makeReferenceBackend());
  expectMatchesReference(run);
}

// loss = mean((attn(x) - y)^2) of a self-attention layer, x and y [2, 16, 32] (4 heads of 8).
std::unique_ptr<Fusion> attentionLoss() {
  auto f = std::make_unique<Fusion>();
  TensorView* x = f->defineTensor({2, 16, 32}, DataType::Float, "x");
  TensorView* y = f->defineTensor({2, 16, 32}, DataType::Float, "y");
  std::vector<TensorView*> w;
  for (const char* name : {"wq", "wk", "wv", "wo"}) w.push_back(f->defineTensor({32, 32}, DataType::Float, name));
  auto heads = [](TensorView* t) { return ops::permute(ops::reshape(t, {2, 16, 4, 8}), {0, 2, 1, 3}); };
  TensorView* a =
      ops::sdpa(heads(ops::linear(x, w[0])), heads(ops::linear(x, w[1])), heads(ops::linear(x, w[2])), true);
  TensorView* out = ops::linear(ops::reshape(ops::permute(a, {0, 2, 1, 3}), {2, 16, 32}), w[3]);
  TensorView* err = ops::sub(out, y);
  f->addOutput(ops::mean(ops::mul(err, err), {0, 1, 2}));
  return f;
}

// Two SGD steps of attentionLoss() with x and y token-sharded (Shard(1)) over the world and the
// weights replicated, compiled with `options`, against the same steps on one device: the losses
// and the last gradients. Returns the collectives of the last sharded step.
std::vector<PhaseCollective> trainAsOnOneDevice(const TrainingOptions& options, uint64_t seed) {
  std::vector<Tensor> full;
  for (size_t i = 0; i < 6; ++i)
    full.push_back(Tensor::random(DataType::Float,
                                  i < 2 ? std::vector<int64_t>{2, 16, 32} : std::vector<int64_t>{32, 32}, seed + i));
  std::vector<ShardedTensor> sharded, single;
  for (size_t i = 0; i < full.size(); ++i) {
    sharded.push_back(distributeTensor(full[i], worldMesh(), {i < 2 ? S(1) : R}, worldRank()));
    single.push_back({full[i].clone(), DeviceMesh({0}), {R}});
  }
  const std::vector<int64_t> params = {2, 3, 4, 5};
  const OptimizerConfig sgd = SgdOptions{.lr = 0.1};
  TrainingExecutor trainer(attentionLoss(), 0, params, sgd, world(), options);
  std::unique_ptr<Communicator> self = makeSelfCommunicator();
  TrainingExecutor twin(attentionLoss(), 0, params, sgd, *self);
  for (int s = 0; s < 2; ++s) {
    double loss = trainer.step(sharded), ref = twin.step(single);
    EXPECT_NEAR(loss, ref, 1e-5 * std::max(1.0, std::fabs(ref))) << "step " << s;
  }
  for (size_t p = 0; p < params.size(); ++p) {
    int64_t bad = 0;
    for (int64_t i = 0; i < twin.lastGradients()[p].local.numel(); ++i)
      bad += std::fabs(trainer.lastGradients()[p].local.get(i) - twin.lastGradients()[p].local.get(i)) > 1e-5;
    EXPECT_EQ(bad, 0) << "elements of gradient " << p << " differ from one device's by more than 1e-5";
  }
  return trainer.lastCollectives();
}

TEST(ContextParallelTraining, AttentionLayerWithSequenceShardedTokensTrainsAsOnOneDevice) {
  Strs forward, backward;
  for (const PhaseCollective& c : trainAsOnOneDevice({}, 20))
    (c.phase == "forward" ? forward : backward).push_back(commKindName(c.info.kind));
  // Forward: Ulysses (q, k, v to the heads' split, the attention output back to the tokens: 4
  // all-to-alls), the projection on the tokens' rows; the loss's sum is all-reduced. (Op by op,
  // the projection of the heads-split attention output is a pending sum reduce-scattered to the
  // tokens, which sends more: the plan search's fewer bytes, search_placements.h.)
  EXPECT_EQ(forward, expect({"all_to_all", "all_to_all", "all_to_all", "all_to_all", "allreduce"}));
  // Backward: attention's gradient is Ulysses (the saved q, k, v to the heads' split: 3
  // all-to-alls; the output's gradient is a slice of the copy all-gathered for the projection's
  // GEMM, not a fourth; dq, dk, dv stay there). The weight gradients are not the pending sums
  // over the tokens that DeepSpeed-Ulysses all-reduces: the loss gradient and x are all-gathered
  // for the GEMMs against the hidden-split dq/dk/dv/attention output, and each weight's gradient
  // rows all-gathered (docs/training.md "Known issues").
  EXPECT_EQ(backward, expect({"allgather", "all_to_all", "all_to_all", "all_to_all", "allgather", "allgather",
                              "allgather", "allgather", "allgather"}));
}

// The same layer with cp = ring: ring attention forward and backward (k and v, then the
// gradients' blocks, rotate by send/recv; no all-to-all), the same training as on one device.
TEST(ContextParallelTraining, AttentionLayerTrainsWithRingAttention) {
  TrainingOptions ring;
  ring.executor.pipeline.propagation.context_parallel = ContextParallel::Ring;
  const std::vector<PhaseCollective> collectives = trainAsOnOneDevice(ring, 40);
  std::map<std::string, int64_t> sends;
  for (const PhaseCollective& c : collectives) {
    EXPECT_NE(c.info.kind, CommKind::AllToAll) << c.phase;
    if (c.info.kind == CommKind::SendRecv) ++sends[c.phase];
  }
  if (worldSize() > 1) {
    EXPECT_GT(sends["forward"], 0);
    EXPECT_GT(sends["backward"], 0);
  }
}

}  // namespace
}  // namespace meshfuse::testing
