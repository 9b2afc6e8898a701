// Ring attention, derived (issue 17): q, k and v arriving split along the sequence, attention
// runs as n steps over the ring of the mesh axis, k and v travelling by send/recv (n - 1 steps
// each) while each rank attends the block it holds, partial outputs merged by log-sum-exp.
// Against single-device execution on 1, 2 and 4 ranks (and the 2-D hybrid with Ulysses on a 2x2
// mesh), with the exact communications, the causal work per rank and the memory per rank.
#include <algorithm>

#include "meshfuse/ops.h"
#include "meshfuse/trace.h"
#include "lower/pipeline.h"
#include "mpi_test_main.h"

namespace meshfuse::testing {
namespace {

using Strs = std::vector<std::string>;

struct Attention {
  int64_t batch = 2, heads = 2, seq = 32, head_dim = 8;
  bool causal = false;
  DataType dtype = DataType::Float;
  ContextParallel cp = ContextParallel::Ring;
};

// a = sdpa(q, k, v) over [batch, heads, seq, head_dim], every operand placed `layout`.
std::unique_ptr<Fusion> definition(const Attention& at) {
  auto f = std::make_unique<Fusion>();
  auto in = [&](const char* name) {
    return f->defineTensor({at.batch, at.heads, at.seq, at.head_dim}, at.dtype, name);
  };
  TensorView *q = in("q"), *k = in("k"), *v = in("v");
  TensorView* a = ops::sdpa(q, k, v, at.causal);
  f->rename(a, "a");
  f->addOutput(a);
  return f;
}

ShardedRun run(const Attention& at, const DeviceMesh& mesh, const Ps& layout) {
  ExecutorOptions options;
  options.pipeline.propagation.context_parallel = at.cp;
  std::vector<std::pair<DeviceMesh, Ps>> layouts(3, {mesh, layout});
  return runSharded(*definition(at), layouts, {}, options);
}

// The program compiled for every rank of `mesh` (the static plans, without running).
CompiledProgram compiled(const Attention& at, const DeviceMesh& mesh, const Ps& layout) {
  std::unique_ptr<Fusion> f = definition(at);
  for (TensorView* in : f->inputs()) applyPlacements(in, mesh, layout);
  PipelineOptions options;
  options.propagation.context_parallel = at.cp;
  return compile(std::move(f), options);
}

int64_t count(const std::vector<CollectiveInfo>& cs, const std::string& source) {
  return std::count_if(cs.begin(), cs.end(), [&](const CollectiveInfo& c) { return c.source == source; });
}

TEST(RingAttention, KAndVRotateInNMinusOneSendRecvStepsEach) {
  const int64_t n = worldSize();
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal);
    Attention at;
    at.causal = causal;
    ShardedRun r = run(at, worldMesh(), {S(2)});
    expectMatchesReference(r);
    expectSameCollectives(r.reported, r.collectives);
    EXPECT_EQ(r.local_outputs[0].placements, Ps{S(2)});
    for (const CollectiveInfo& c : r.collectives) EXPECT_EQ(commKindName(c.kind), std::string("send_recv"));
    // One block of k or v per step, to the next rank on the ring.
    const int64_t block = at.batch * at.heads * (at.seq / n) * at.head_dim * 4;
    EXPECT_EQ(count(r.collectives, "%k"), n - 1);
    EXPECT_EQ(count(r.collectives, "%v"), n - 1);
    for (const CollectiveInfo& c : r.collectives) {
      if (c.source != "%k" && c.source != "%v") continue;
      EXPECT_EQ(c.bytes, block);
      EXPECT_EQ(c.team, (Team{worldRank(), (worldRank() + 1) % n}));
    }
    // Causal: half of q goes to the mirror rank before and half of the output comes back after.
    const int64_t mirrors = causal && n > 1 ? 1 : 0;
    EXPECT_EQ(count(r.collectives, "%q"), mirrors);
    EXPECT_EQ(count(r.collectives, "%a"), mirrors);
    EXPECT_EQ(static_cast<int64_t>(r.collectives.size()), 2 * (n - 1) + 2 * mirrors);
    for (const std::vector<CollectiveInfo>* cs : {&r.collectives, &r.reported}) {  // as executed, in the report
      for (const CollectiveInfo& c : *cs) {
        if (c.source == "%q" || c.source == "%a") {
          EXPECT_EQ(c.bytes, block / 2) << c.source;  // half a block
        }
      }
    }
  }
}

// The timeline names causal balance's half exchanges (and their waits) apart from the ring's
// rotation, so that the overlap summary can count the rotation alone (what the attention hides):
// the benchmarks' "rotation hidden" and `meshfuse run --trace`.
MPI_TEST(RingAttention, TimelineTellsTheRotationFromCausalBalance, atLeast(2, "no ring on one rank")) {
  const int64_t n = worldSize();
  Attention at;
  at.causal = true;
  ExecutorOptions options;
  options.pipeline.propagation.context_parallel = ContextParallel::Ring;
  options.trace = true;
  ShardedRun r = runSharded(*definition(at), {3, {worldMesh(), {S(2)}}}, {}, options);
  expectMatchesReference(r);
  Strs balance, rotation;
  for (const TraceEvent& e : r.trace) {
    if (e.kind != TaskKind::Communication) continue;
    (isCausalBalanceExchange(e) ? balance : rotation).push_back(e.name);
  }
  EXPECT_EQ(balance, (Strs{"send_recv %q (causal balance)", "wait for send_recv %q (causal balance)",
                           "send_recv %a (causal balance)", "wait for send_recv %a (causal balance)"}));
  Strs want;
  for (int64_t step = 0; step + 1 < n; ++step)
    for (const char* t : {"send_recv %k", "send_recv %v", "wait for send_recv %k", "wait for send_recv %v"})
      want.push_back(t);
  std::sort(rotation.begin(), rotation.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(rotation, want);
  // Counting the rotation alone leaves out exactly the balance exchanges' time.
  const OverlapSummary all = summarizeOverlap(r.trace);
  const OverlapSummary rotating =
      summarizeOverlap(r.trace, [](const TraceEvent& e) { return !isCausalBalanceExchange(e); });
  double balance_us = 0;
  for (const TraceEvent& e : r.trace)
    if (isCausalBalanceExchange(e)) balance_us += e.end_us - e.begin_us;
  EXPECT_NEAR(all.communication_us - rotating.communication_us, balance_us, 1e-6 * all.communication_us + 1e-9);
  EXPECT_EQ(all.compute_us, rotating.compute_us);
  EXPECT_LE(rotating.hidden_us, all.hidden_us);
}

TEST(RingAttention, MatchesSingleDeviceInBf16) {
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal);
    Attention at;
    at.causal = causal;
    at.dtype = DataType::BFloat16;
    expectMatchesReference(run(at, worldMesh(), {S(2)}));
  }
}

MPI_TEST(RingAttention, AutoTakesRingWhenTheHeadsDoNotDivide, exactly(4, "2 heads divide 1 and 2")) {
  Attention at;
  at.cp = ContextParallel::Auto;
  ShardedRun r = run(at, worldMesh(), {S(2)});
  expectMatchesReference(r);
  EXPECT_EQ(kinds(r.collectives), Strs(6, "send_recv"));
}

// Causal self-attention (q, k and v one tensor): the tensor rotates (in its ring slots) and is
// the query whose half the balance exchanges with the mirror rank (in a slot of its own).
TEST(RingAttention, CausalSelfAttentionOfOneTensor) {
  auto f = std::make_unique<Fusion>();
  TensorView* x = f->defineTensor({1, 2, 32, 8}, DataType::Float, "x");
  TensorView* a = ops::sdpa(x, x, x, /*is_causal=*/true);
  f->rename(a, "a");
  f->addOutput(a);
  ExecutorOptions options;
  options.pipeline.propagation.context_parallel = ContextParallel::Ring;
  ShardedRun r = runSharded(*f, {{worldMesh(), {S(2)}}}, {}, options);
  expectMatchesReference(r);
  const int64_t n = worldSize(), mirrors = n > 1 ? 1 : 0;
  EXPECT_EQ(count(r.collectives, "%x"), n - 1 + mirrors);  // the ring's steps, and the query's half
  EXPECT_EQ(count(r.collectives, "%a"), mirrors);
}

TEST(RingAttention, SequenceOf4096) {
  // One head of 8: the single-device reference stays cheap; every rank holds 4096 / n rows.
  Attention at;
  at.batch = 1, at.heads = 1, at.seq = 4096, at.head_dim = 8, at.causal = true;
  ShardedRun r = run(at, worldMesh(), {S(2)});
  expectMatchesReference(r);
  EXPECT_EQ(count(r.collectives, "%k"), worldSize() - 1);
}

// Causal work: every rank attends the same number of (query chunk, key chunk) pairs, chunks of
// s/2n rows: 2n + 1 (two diagonal pairs), and skips the 2n^2 - 2n - 1 others.
MPI_TEST(RingAttention, CausalWorkIsBalanced, atLeast(2, "no ring on one rank")) {
  const int64_t n = worldSize();
  Attention at;
  at.causal = true;
  CompiledProgram p = compiled(at, worldMesh(), {S(2)});
  for (int64_t rank = 0; rank < n; ++rank) {
    std::vector<AttentionBlocks> blocks = attentionBlocks(programForRank(p, rank), {});
    ASSERT_EQ(blocks.size(), 1u);
    EXPECT_EQ(blocks[0].tensor, "%a");
    EXPECT_EQ(blocks[0].steps, n);
    EXPECT_EQ(blocks[0].chunk, at.seq / (2 * n));
    EXPECT_EQ(blocks[0].attended, 2 * n + 1) << "rank " << rank;
    EXPECT_EQ(blocks[0].skipped, 4 * n - (2 * n + 1)) << "rank " << rank;
  }
}

// Memory: per rank, the attention's tensors shrink n times; the ring adds one block of k and v
// in flight and the block being attended (two extra blocks of k and v, since the inputs are the
// caller's and cannot be overwritten), and the f32 log-sum-exp of its query rows (the merge
// state). Exactly, from the plans' peak-memory reports, at sequence 4096 on the world.
MPI_TEST(RingAttention, PeakMemoryPerRankIsOneNthPlusTheBlocksInFlight, atLeast(2, "no ring on one rank")) {
  const int64_t n = worldSize();
  Attention at;
  at.batch = 1, at.heads = 8, at.seq = 4096, at.head_dim = 64;
  const int64_t tensor = at.batch * at.heads * at.seq * at.head_dim * 4;  // q, k, v or a, f32
  const int64_t lse = at.batch * at.heads * at.seq * 4;
  CompiledProgram single = compiled(at, DeviceMesh({0}), {R});
  EXPECT_EQ(peakMemoryBytes(programForRank(single, 0), {}), 4 * tensor);
  CompiledProgram ring = compiled(at, worldMesh(), {S(2)});
  for (int64_t rank = 0; rank < n; ++rank)
    EXPECT_EQ(peakMemoryBytes(programForRank(ring, rank), {}), 4 * tensor / n + 2 * (2 * tensor / n) + lse / n);
}

// When k and v are the attention's own intermediates (projections, here casts of bf16 inputs),
// the ring reuses their buffers: one block of k and v in flight, the rest is one n-th.
MPI_TEST(RingAttention, PeakMemoryReusesDeadKeyBuffers, atLeast(2, "no ring on one rank")) {
  const int64_t n = worldSize();
  constexpr int64_t kHeads = 8, kSeq = 4096, kDim = 64;
  auto build = [&](const DeviceMesh& mesh, const Ps& layout) {
    auto f = std::make_unique<Fusion>();
    std::vector<TensorView*> f32;
    for (const char* name : {"q", "k", "v"}) {
      TensorView* in = f->defineTensor({1, kHeads, kSeq, kDim}, DataType::BFloat16, name);
      applyPlacements(in, mesh, layout);
      f32.push_back(ops::cast(in, DataType::Float));
    }
    f->addOutput(ops::sdpa(f32[0], f32[1], f32[2]));
    PipelineOptions options;
    options.propagation.context_parallel = ContextParallel::Ring;
    return compile(std::move(f), options);
  };
  const int64_t tensor = kHeads * kSeq * kDim * 4, lse = kHeads * kSeq * 4;
  const int64_t single = peakMemoryBytes(programForRank(build(DeviceMesh({0}), {R}), 0), {});
  EXPECT_EQ(single, 3 * tensor / 2 + 4 * tensor);  // the bf16 inputs, their f32 casts, the output
  CompiledProgram ring = build(worldMesh(), {S(2)});
  for (int64_t rank = 0; rank < n; ++rank)
    EXPECT_EQ(peakMemoryBytes(programForRank(ring, rank), {}), single / n + 2 * tensor / n + lse / n);
}

// Ulysses on the inner mesh axis x ring on the outer one: 2 heads split over axis 1 (an
// all-to-all of q, k and v within each half of the sequence), the halves of the sequence rotate
// over axis 0; the output pinned back to the sequence split takes one more all-to-all.
MPI_TEST(RingAttention, HybridWithUlyssesOnA2x2Mesh, exactly(4, "a 2x2 mesh")) {
  const DeviceMesh mesh({0, 1, 2, 3}, {2, 2});
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal);
    Attention at;
    at.causal = causal;
    at.cp = ContextParallel::Auto;
    std::unique_ptr<Fusion> f = definition(at);
    applyPlacements(f->outputs()[0], mesh, {S(2), S(2)});
    ExecutorOptions options;
    std::vector<std::pair<DeviceMesh, Ps>> layouts(3, {mesh, Ps{S(2), S(2)}});
    ShardedRun r = runSharded(*f, layouts, {}, options);
    expectMatchesReference(r);
    expectSameCollectives(r.reported, r.collectives);
    Strs want = {"all_to_all", "all_to_all", "all_to_all"};
    const int64_t ring = (causal ? 1 : 0) + 2 + (causal ? 1 : 0);  // q's mirror, k and v, the output's
    for (int64_t i = 0; i < ring; ++i) want.push_back("send_recv");
    want.push_back("all_to_all");
    EXPECT_EQ(kinds(r.collectives), want);
    for (const CollectiveInfo& c : r.collectives)
      EXPECT_EQ(c.mesh_axis, c.kind == CommKind::AllToAll ? 1 : 0) << commKindName(c.kind) << " " << c.source;
  }
}

MPI_TEST(RingAttention, RingAskedForWithAQueryThatIsNotSplitIsAnError, atLeast(2, "nothing is split on one rank")) {
  Attention at;
  std::unique_ptr<Fusion> f = definition(at);
  applyPlacements(f->inputs()[0], worldMesh(), {R});
  for (size_t i : {1, 2}) applyPlacements(f->inputs()[i], worldMesh(), {S(2)});
  PipelineOptions options;
  options.propagation.context_parallel = ContextParallel::Ring;
  const std::string message = errorOf(ErrorKind::Unsupported, [&] { compile(std::move(f), options); });
  EXPECT_THAT(message, ::testing::HasSubstr(fmt::format(
                           "context parallelism \"ring\" for %a: ring attention needs q, k and v all split along the "
                           "sequence (dim 2) on mesh axis 0 ({} devices) of mesh {}, but %q (f32[2, 2, 32, 8]) is "
                           "Replicate() there",
                           worldSize(), worldMesh().toString())));
}

// A sequence the ranks do not divide (torch.chunk's uneven blocks): ring attention rotates
// blocks of one size, so `auto` gathers k and v instead (still matching single device), and ring
// asked for is an error that says why.
MPI_TEST(RingAttention, AnUnevenSequenceIsGatheredAndRingAskedForIsAnError, atLeast(2, "nothing is split on one rank")) {
  Attention at;
  at.seq = 4 * worldSize() + 1;
  at.causal = true;
  at.cp = ContextParallel::Auto;
  at.heads = worldSize() + 1;  // heads the ranks do not divide either: Ulysses is not chosen
  ShardedRun r = run(at, worldMesh(), {S(2)});
  expectMatchesReference(r);
  expectSameCollectives(r.reported, r.collectives);
  EXPECT_EQ(kinds(r.collectives), Strs(2, "allgather"));
  at.cp = ContextParallel::Ring;
  const std::string message = errorOf(ErrorKind::Unsupported, [&] { compiled(at, worldMesh(), {S(2)}); });
  EXPECT_THAT(message, ::testing::HasSubstr(fmt::format(
                           "context parallelism \"ring\" for %a: ring attention rotates blocks of one size, but the "
                           "sequence of %q ({}) does not divide among the {} devices of mesh axis 0",
                           at.seq, worldSize())));
}

}  // namespace
}  // namespace meshfuse::testing
