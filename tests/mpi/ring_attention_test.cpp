// Ring attention, derived (issue 17): q, k and v arriving split along the sequence, attention
// runs as n steps over the ring of the mesh axis, k and v travelling by send/recv (n - 1 steps
// each, per head group: one ring per group of (batch, head) pairs) while each rank attends the
// block it holds, partial outputs merged by log-sum-exp.
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
  int64_t ring_groups = 0;  // OverlapOptions::ring_groups (0: as many as keep half a block in flight)
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
  options.pipeline.overlap.ring_groups = at.ring_groups;
  std::vector<std::pair<DeviceMesh, Ps>> layouts(3, {mesh, layout});
  return runSharded(*definition(at), layouts, {}, options);
}

// The program compiled for every rank of `mesh` (the static plans, without running).
CompiledProgram compiled(const Attention& at, const DeviceMesh& mesh, const Ps& layout) {
  std::unique_ptr<Fusion> f = definition(at);
  for (TensorView* in : f->inputs()) applyPlacements(in, mesh, layout);
  PipelineOptions options;
  options.propagation.context_parallel = at.cp;
  options.overlap.ring_groups = at.ring_groups;
  return compile(std::move(f), options);
}

int64_t count(const std::vector<CollectiveInfo>& cs, const std::string& source) {
  return std::count_if(cs.begin(), cs.end(), [&](const CollectiveInfo& c) { return c.source == source; });
}

// The caller's k and v (which the ring may not overwrite) rotate in 4 head groups by default
// (2 x 2 (batch, head) pairs: one pair each), so that a quarter of a block is in flight and one
// is attended; ring_groups=1 rotates whole blocks; 2 is asked for.
TEST(RingAttention, KAndVRotateInNMinusOneSendRecvStepsPerHeadGroup) {
  const int64_t n = worldSize();
  const std::pair<int64_t, int64_t> cases[] = {{0, 4}, {1, 1}, {2, 2}};  // (ring_groups, head groups)
  for (auto [option, groups] : cases)
    for (bool causal : {false, true}) {
      SCOPED_TRACE(fmt::format("causal {}, ring_groups {}", causal, option));
      Attention at;
      at.causal = causal;
      at.ring_groups = option;
      ShardedRun r = run(at, worldMesh(), {S(2)});
      expectMatchesReference(r);
      expectSameCollectives(r.reported, r.collectives);
      EXPECT_EQ(r.local_outputs[0].placements, Ps{S(2)});
      for (const CollectiveInfo& c : r.collectives) EXPECT_EQ(commKindName(c.kind), std::string("send_recv"));
      // One head group's block of k or v per step, to the next rank on the ring.
      const int64_t block = at.batch * at.heads * (at.seq / n) * at.head_dim * 4;
      EXPECT_EQ(count(r.collectives, "%k"), groups * (n - 1));
      EXPECT_EQ(count(r.collectives, "%v"), groups * (n - 1));
      for (const CollectiveInfo& c : r.collectives) {
        if (c.source != "%k" && c.source != "%v") continue;
        EXPECT_EQ(c.bytes, block / groups);
        EXPECT_EQ(c.team, (Team{worldRank(), (worldRank() + 1) % n}));
      }
      // Causal: half of q goes to the mirror rank before and half of the output comes back after.
      const int64_t mirrors = causal && n > 1 ? 1 : 0;
      EXPECT_EQ(count(r.collectives, "%q"), mirrors);
      EXPECT_EQ(count(r.collectives, "%a"), mirrors);
      EXPECT_EQ(static_cast<int64_t>(r.collectives.size()), 2 * groups * (n - 1) + 2 * mirrors);
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
  for (int64_t step = 0; step < 4 * (n - 1); ++step)  // n - 1 per head group, 4 groups
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
  EXPECT_EQ(kinds(r.collectives), Strs(4 * 6, "send_recv"));  // k and v: 3 steps in each of 4 head groups
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
  // The ring's steps (2 head groups: one head each), and the query's half.
  EXPECT_EQ(count(r.collectives, "%x"), 2 * (n - 1) + mirrors);
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
    EXPECT_EQ(blocks[0].head_groups, 4);  // (counted for one: each attends the same pairs)
    EXPECT_EQ(blocks[0].steps, n);
    EXPECT_EQ(blocks[0].chunk, at.seq / (2 * n));
    EXPECT_EQ(blocks[0].attended, 2 * n + 1) << "rank " << rank;
    EXPECT_EQ(blocks[0].skipped, 4 * n - (2 * n + 1)) << "rank " << rank;
  }
}

// Memory: per rank, the attention's tensors shrink n times; the ring adds a head group's block of
// k and v in flight and one being attended (the inputs are the caller's, which it may not
// overwrite; on 2 ranks no step has both), and the f32 log-sum-exp of its query rows (the merge
// state). In 4 head groups (the default for 8 heads) that is at most half a block of k and v in
// all, so the rank holds less than one n-th of the single-device attention plus one block in
// flight (issue 17's bound); whole blocks (ring_groups=1) hold up to two. Exactly, from the plans'
// peak-memory reports, at sequence 4096.
MPI_TEST(RingAttention, PeakMemoryPerRankIsOneNthPlusTheBlocksInFlight, atLeast(2, "no ring on one rank")) {
  const int64_t n = worldSize();
  Attention at;
  at.batch = 1, at.heads = 8, at.seq = 4096, at.head_dim = 64;
  const int64_t tensor = at.batch * at.heads * at.seq * at.head_dim * 4;         // q, k, v or a, f32
  const int64_t lse = at.batch * at.heads * at.seq * 4, block = 2 * tensor / n;  // (a block: of k and of v)
  const int64_t slots = n > 2 ? 2 : 1;  // the attended block and the arriving one (2 ranks: no step has both)
  CompiledProgram single = compiled(at, DeviceMesh({0}), {R});
  EXPECT_EQ(peakMemoryBytes(programForRank(single, 0), {}), 4 * tensor);
  CompiledProgram ring = compiled(at, worldMesh(), {S(2)});
  at.ring_groups = 1;
  CompiledProgram whole = compiled(at, worldMesh(), {S(2)});
  for (int64_t rank = 0; rank < n; ++rank) {
    const int64_t peak = peakMemoryBytes(programForRank(ring, rank), {});
    EXPECT_EQ(peak, 4 * tensor / n + slots * (block / 4) + lse / n);
    EXPECT_LT(peak, 4 * tensor / n + block);
    EXPECT_EQ(peakMemoryBytes(programForRank(whole, rank), {}), 4 * tensor / n + slots * block + lse / n);
  }
}

// When k and v are the attention's own intermediates (projections, here casts of bf16 inputs),
// the ring reuses their buffers: a head group's block in flight (2 groups: half a block), the
// rest is one n-th.
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
  const int64_t tensor = kHeads * kSeq * kDim * 4, lse = kHeads * kSeq * 4, block = 2 * tensor / n;
  const int64_t single = peakMemoryBytes(programForRank(build(DeviceMesh({0}), {R}), 0), {});
  EXPECT_EQ(single, 3 * tensor / 2 + 4 * tensor);  // the bf16 inputs, their f32 casts, the output
  CompiledProgram ring = build(worldMesh(), {S(2)});
  for (int64_t rank = 0; rank < n; ++rank) {
    const int64_t peak = peakMemoryBytes(programForRank(ring, rank), {});
    EXPECT_EQ(peak, single / n + block / 2 + lse / n);
    EXPECT_LT(peak, single / n + block);
  }
}

// k and v computed in the fusion (casts of bf16 inputs), which the ring alone reads: it receives
// into their own buffers, in 2 head groups (half a block in flight), causal and not.
TEST(RingAttention, IntermediateKeysRotateThroughTheirOwnBuffers) {
  const int64_t n = worldSize();
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal);
    auto f = std::make_unique<Fusion>();
    std::vector<TensorView*> f32;
    for (const char* name : {"q", "k", "v"})
      f32.push_back(ops::cast(f->defineTensor({2, 2, 32, 8}, DataType::BFloat16, name), DataType::Float));
    TensorView* a = ops::sdpa(f32[0], f32[1], f32[2], causal);
    f->rename(a, "a");
    f->addOutput(a);
    ExecutorOptions options;
    options.pipeline.propagation.context_parallel = ContextParallel::Ring;
    ShardedRun r = runSharded(*f, {3, {worldMesh(), {S(2)}}}, {}, options);
    expectMatchesReference(r);
    expectSameCollectives(r.reported, r.collectives);
    const int64_t mirrors = causal && n > 1 ? 2 : 0;  // the query's half and the output's
    EXPECT_EQ(kinds(r.collectives), Strs(2 * 2 * (n - 1) + mirrors, "send_recv"));
  }
}

// ring_groups that do not split a rank's (batch, head) pairs is an error that says so.
MPI_TEST(RingAttention, HeadGroupsThatDoNotSplitAreAnError, atLeast(2, "no ring on one rank")) {
  Attention at;  // 2 x 2 (batch, head) pairs
  at.ring_groups = 3;
  const std::string message = errorOf(ErrorKind::Value, [&] { compiled(at, worldMesh(), {S(2)}); });
  EXPECT_THAT(message, ::testing::HasSubstr("ring attention of %a: ring_groups=3 asks for head groups, but it has 4 "
                                            "(batch, head) pairs per rank ([batch 2, heads 2]), which do not split "
                                            "into 3 groups of whole heads of one batch entry or whole batch entries"));
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
    // q's mirror; k and v in 2 head groups (its 2 (batch, head) pairs: the all-to-all's outputs,
    // whose buffers the ring reuses, half a block in flight); the output's mirror.
    const int64_t ring = (causal ? 1 : 0) + 2 * 2 + (causal ? 1 : 0);
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
