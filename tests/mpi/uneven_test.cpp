// Sizes the mesh does not divide: Shard(d) follows torch.chunk (leading ranks ceil(n / D), the
// trailing ones fewer, possibly none), as torch's DTensor does. Every parallelism of
// docs/parallelisms.md runs with such sizes (7 tokens on 2, 3 and 4 ranks, odd dims on a 2x2
// mesh) against single-device execution, with its exact collectives and a static report equal
// to what ran; every collective kind moves blocks of different sizes exactly; kernels take empty
// local tensors (3 rows on 4 ranks, 1 row on any number). Runs on 1, 2, 3 and 4 ranks.
#include "meshfuse/ir/parser.h"
#include "meshfuse/ops.h"
#include "models.h"
#include "mpi_test_main.h"

namespace meshfuse::testing {
namespace {

using Strs = std::vector<std::string>;

Strs expect(Strs kinds) { return worldSize() > 1 ? kinds : Strs{}; }

std::vector<std::pair<DeviceMesh, Ps>> onWorld(std::initializer_list<Ps> per_input) {
  std::vector<std::pair<DeviceMesh, Ps>> out;
  for (const Ps& p : per_input) out.emplace_back(worldMesh(), p);
  return out;
}

// Numerics against single-device execution, the collectives' kinds, and the static report
// (`meshfuse collectives`) equal to what ran, bytes and padded bytes included.
void expectPlan(const ShardedRun& run, const Strs& want) {
  expectMatchesReference(run);
  expectSameCollectives(run.reported, run.collectives);
  EXPECT_EQ(kinds(run.collectives), expect(want));
}

// The rows torch.chunk gives `rank` of `n` rows over the world.
int64_t rowsOf(int64_t n, int64_t rank) { return chunkSpan(n, worldSize(), rank).size; }

// ---- the collectives themselves ------------------------------------------------------------

Team everyone() { return worldMesh().devices(); }

// Block j of member r holds the values 1000 * r + 10 * j + k (k < its count): every element
// says where it came from, so a misplaced or padded element cannot pass.
std::vector<float> blockOf(int64_t r, int64_t j, int64_t count) {
  std::vector<float> out;
  for (int64_t k = 0; k < count; ++k) out.push_back(static_cast<float>(1000 * r + 10 * j + k));
  return out;
}

TEST(Uneven, EveryCollectiveKindMovesBlocksOfDifferentSizesExactly) {
  const int64_t n = worldSize(), me = worldRank();
  // Member j's block has j % 3 elements: rank 0's is empty, some ranks' differ.
  Counts counts;
  for (int64_t j = 0; j < n; ++j) counts.push_back(j % 3);
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  // allgatherv: every rank gets every block in team order.
  std::vector<float> mine = blockOf(me, 0, counts[me]), all(static_cast<size_t>(total) + 1, -1);
  world().allgatherv(mine.data(), all.data(), counts, DataType::Float, everyone())->wait();
  std::vector<float> want;
  for (int64_t j = 0; j < n; ++j)
    for (float v : blockOf(j, 0, counts[j])) want.push_back(v);
  want.push_back(-1);  // nothing written past the blocks
  EXPECT_EQ(all, want);
  // reduceScatterv: rank j gets the sum over ranks of their block j.
  std::vector<float> send;
  for (int64_t j = 0; j < n; ++j)
    for (int64_t k = 0; k < counts[j]; ++k) send.push_back(static_cast<float>(me + 100 * j + k));
  std::vector<float> sum(static_cast<size_t>(counts[me]) + 1, -1), sum_want;
  world().reduceScatterv(send.data(), sum.data(), counts, DataType::Float, ReduceOp::Sum, everyone())->wait();
  for (int64_t k = 0; k < counts[me]; ++k) sum_want.push_back(static_cast<float>(n * (n - 1) / 2 + n * (100 * me + k)));
  sum_want.push_back(-1);
  EXPECT_EQ(sum, sum_want);
  // allToAllv: rank r sends (r + j) % 3 elements to rank j.
  Counts sends, recvs;
  std::vector<float> out, got_want;
  for (int64_t j = 0; j < n; ++j) {
    sends.push_back((me + j) % 3);
    recvs.push_back((j + me) % 3);
    for (float v : blockOf(me, j, sends.back())) out.push_back(v);
    for (float v : blockOf(j, me, recvs.back())) got_want.push_back(v);
  }
  std::vector<float> got(got_want.size() + 1, -1);
  got_want.push_back(-1);
  world().allToAllv(out.data(), sends, got.data(), recvs, DataType::Float, everyone())->wait();
  EXPECT_EQ(got, got_want);
  // gatherv and scatterv, rooted at the last rank.
  const int64_t root = n - 1;
  std::vector<float> gathered(static_cast<size_t>(total) + 1, -1);
  world().gatherv(mine.data(), me == root ? gathered.data() : nullptr, counts, DataType::Float, root, everyone())->wait();
  if (me == root) {
    EXPECT_EQ(gathered, want);
  }
  std::vector<float> piece(static_cast<size_t>(counts[me]) + 1, -1), piece_want = blockOf(me, 0, counts[me]);
  piece_want.push_back(-1);
  world().scatterv(me == root ? want.data() : nullptr, piece.data(), counts, DataType::Float, root, everyone())->wait();
  EXPECT_EQ(piece, piece_want);
}

// ---- every parallelism of docs/parallelisms.md ---------------------------------------------

// linear(gelu(linear(inp [?t, h], up_w [f, h])), down_w [h, f]): buildMlp with any f.
std::unique_ptr<Fusion> mlp(int64_t h, int64_t f) {
  return parseFusion(fmt::format(R"(fusion {{
  %inp = input f32[?t, {0}]
  %up_w = input f32[{1}, {0}]
  %down_w = input f32[{0}, {1}]
  %up = linear(%inp, %up_w)
  %act = gelu(%up, approximate="tanh")
  %out = linear(%act, %down_w)
  output %out
}})",
                                 h, f));
}

TEST(Uneven, TensorParallelMlpOfSevenHiddenUnits) {
  ShardedRun run = runSharded(*mlp(6, 7), onWorld({{R}, {S(0)}, {S(1)}}), {{"t", 5}});
  expectPlan(run, {"allreduce"});
  EXPECT_EQ(run.local_outputs[0].placements, Ps{R});
}

TEST(Uneven, SequenceParallelMlpOfSevenTokens) {
  ShardedRun run = runSharded(*mlp(8, 16), onWorld({{S(0)}, {S(0)}, {S(1)}}), {{"t", 7}});
  expectPlan(run, {"allgather", "reduce_scatter"});
  EXPECT_EQ(run.local_outputs[0].placements, Ps{S(0)});
  EXPECT_EQ(run.local_outputs[0].local.shape(), (std::vector<int64_t>{rowsOf(7, worldRank()), 8}));
  if (worldSize() == 1) return;
  // This rank gathers its own rows; NCCL would pad each to the largest block (ceil(7 / n) rows).
  const int64_t largest = rowsOf(7, 0) * 8 * 4, bytes = rowsOf(7, worldRank()) * 8 * 4;
  EXPECT_EQ(run.collectives[0].bytes, bytes);
  EXPECT_EQ(run.collectives[0].padded_bytes, 7 % worldSize() == 0 ? 0 : largest);
  // The reduce-scatter sends the whole [7, 8] pending sum; padded, n blocks of the largest.
  EXPECT_EQ(run.collectives[1].bytes, 7 * 8 * 4);
  EXPECT_EQ(run.collectives[1].padded_bytes, 7 % worldSize() == 0 ? 0 : worldSize() * largest);
}

TEST(Uneven, DataParallelMlpOfSevenSamplesNeedsNoCollective) {
  ShardedRun run = runSharded(*mlp(8, 16), onWorld({{S(0)}, {R}, {R}}), {{"t", 7}});
  expectPlan(run, {});
}

MPI_TEST(Uneven, DataTimesTensorParallelMlpWithOddDimsOnA2x2Mesh, exactly(4)) {
  const DeviceMesh mesh({0, 1, 2, 3}, {2, 2});  // axis 0: data (7 samples: 4 + 3); axis 1: tensor (7 units)
  ShardedRun run = runSharded(*mlp(6, 7), {{mesh, {S(0), R}}, {mesh, {R, S(0)}}, {mesh, {R, S(1)}}}, {{"t", 7}});
  expectPlan(run, {"allreduce"});
  EXPECT_EQ(run.collectives[0].team, worldRank() < 2 ? Team({0, 1}) : Team({2, 3}));
  EXPECT_EQ(run.local_outputs[0].local.shape(), (std::vector<int64_t>{worldRank() < 2 ? 4 : 3, 6}));
}

TEST(Uneven, FsdpGathersUnevenParameterShards) {
  auto f = parseFusion(R"(fusion {
  %x = input f32[?t, 6]
  %w0 = input f32[7, 6]
  %w1 = input f32[5, 7]
  %w2 = input f32[6, 5]
  %a0 = linear(%x, %w0)
  %h0 = gelu(%a0, approximate="tanh")
  %a1 = linear(%h0, %w1)
  %h1 = gelu(%a1, approximate="tanh")
  %y = linear(%h1, %w2)
  output %y
})");
  ExecutorOptions options;
  options.pipeline.propagation.gather_parameters = true;
  ShardedRun run = runSharded(*f, onWorld({{S(0)}, {S(0)}, {S(0)}, {S(0)}}), {{"t", 7}}, options);
  expectPlan(run, {"allgather", "allgather", "allgather"});
  EXPECT_EQ(run.local_outputs[0].placements, Ps{S(0)}) << "activations keep their data-parallel sharding";
}

// q, k, v [2, heads, 7, 8] with the sequence (7) sharded: Ulysses moves them to a split of the
// heads (uneven where the mesh does not divide them) and the output back to the sequence.
TEST(Uneven, UlyssesOfSevenTokensAndUnevenHeads) {
  for (int64_t heads : {4, 3}) {
    SCOPED_TRACE(fmt::format("{} heads", heads));
    Fusion f;
    auto in = [&](const char* name) { return f.defineTensor({2, heads, 7, 8}, DataType::Float, name); };
    TensorView* a = ops::sdpa(in("q"), in("k"), in("v"), /*causal=*/true);
    applyPlacements(a, worldMesh(), {S(2)});
    f.addOutput(a);
    ExecutorOptions options;
    options.pipeline.propagation.context_parallel = ContextParallel::Ulysses;
    ShardedRun run = runSharded(f, onWorld({{S(2)}, {S(2)}, {S(2)}}), {}, options);
    expectPlan(run, {"all_to_all", "all_to_all", "all_to_all", "all_to_all"});
  }
}

// 7 tokens; 12 heads of 4, which 2, 3 and 4 ranks all divide (weights split unevenly across
// heads would cut a head in two: the reshape into heads then cannot keep the shard).
TEST(Uneven, TensorAndSequenceParallelDecoderLayerOfSevenTokens) {
  Fusion f;
  models::buildDecoderLayer(f, {.batch = 2, .seq = 7, .hidden = 48, .heads = 12});
  // x, ln1_w, ln1_b, wq, wk, wv, wo, ln2_w, ln2_b, up_w, down_w
  ShardedRun run = runSharded(
      f, onWorld({{S(1)}, {R}, {R}, {S(0)}, {S(0)}, {S(0)}, {S(1)}, {R}, {R}, {S(0)}, {S(1)}}));
  expectPlan(run, {"allgather", "reduce_scatter", "allgather", "reduce_scatter"});
  EXPECT_EQ(run.local_outputs[0].placements, Ps{S(1)});
}

TEST(Uneven, OverlapOfSevenTokensCollectiveAndRingBased) {
  const int64_t n = worldSize();
  for (auto [algorithm, chunks] : std::vector<std::pair<std::string, int64_t>>{
           {"collective", 0}, {"collective", 3}, {"ring", n}, {"ring", 2 * n}}) {
    SCOPED_TRACE(fmt::format("{} {}", algorithm, chunks));
    ExecutorOptions options;
    options.pipeline.overlap.algorithm = parseOverlapAlgorithm(algorithm);
    options.pipeline.overlap.chunks = chunks;
    ShardedRun run = runSharded(*mlp(8, 16), onWorld({{S(0)}, {S(0)}, {S(1)}}), {{"t", 7}}, options);
    expectMatchesReference(run);
    expectSameCollectives(run.reported, run.collectives);
    if (n == 1) continue;
    // Collective-based: one collective per chunk (default: one per device, at most the 4 rows of
    // the largest shard); ring: n - 1 steps of s / n sub-chunks per ring, two rings.
    const int64_t s = chunks > 0 ? chunks : std::min<int64_t>(n, rowsOf(7, 0));
    const size_t want = algorithm == "ring" ? 2 * (n - 1) * (chunks / n) : 2 * s;
    EXPECT_EQ(run.collectives.size(), want);
  }
}

// Two pipeline stages (the first and the last rank; one rank holds both on one rank) of 10
// rows in 4 microbatches: torch.chunk's 3, 3, 3 and 1.
TEST(Uneven, PipelineOfTenRowsInFourMicrobatches) {
  const int64_t last = worldSize() - 1;
  auto f = parseFusion(fmt::format(R"(fusion {{
  mesh @s0 = [0]
  mesh @s1 = [{}]
  %inp = input f32[10, 8] @s0 {{split(0, 4), parallelize(0, Stream)}}
  %w0 = input f32[8, 8] @s0 {{}}
  %w1 = input f32[8, 8] @s1 {{}}
  %u = linear(%inp, %w0)
  %a = gelu(%u, approximate="tanh")
  %b = linear(%a, %w1)
  output %b
}})",
                                   last));
  std::vector<std::pair<DeviceMesh, Ps>> layouts;
  for (const TensorView* in : f->inputs()) layouts.emplace_back(*in->mesh(), placementsOf(in));
  ShardedRun run = runSharded(*f, layouts);
  expectMatchesReference(run);
  expectSameCollectives(run.reported, run.collectives);
  if (last == 0) return;
  ASSERT_EQ(run.collectives.size(), worldRank() == 0 || worldRank() == last ? 4u : 0u);
  for (size_t i = 0; i < run.collectives.size(); ++i)  // 3, 3, 3, 1 rows of 8 f32
    EXPECT_EQ(run.collectives[i].bytes, (i < 3 ? 3 : 1) * 8 * 4) << "microbatch " << i;
}

// ---- the hard cases: empty and one-row shards, every resharding kind uneven ------------------

// 3 rows on 4 ranks leaves the last rank nothing: its GEMM has no rows, its sum no elements (0).
TEST(Uneven, EmptyAndOneRowShards) {
  for (int64_t rows : {3, 1}) {
    SCOPED_TRACE(fmt::format("{} rows", rows));
    auto f = parseFusion(fmt::format(R"(fusion {{
  %x = input f32[{}, 5]
  %w = input f32[4, 5]
  %l = linear(%x, %w)
  %y = relu(%l)
  %s = sum(%y, dims=[0])
  output %y
  output %s
}})",
                                     rows));
    ShardedRun run = runSharded(*f, onWorld({{S(0)}, {R}}));
    // The sum over the sharded rows: a pending sum, all-reduced; of one row the plan search
    // gathers the row instead (what one rank holds, 16 bytes, against the 4 sums all-reduced).
    expectPlan(run, {rows == 1 ? "allgather" : "allreduce"});
    EXPECT_EQ(run.local_outputs[0].local.shape(), (std::vector<int64_t>{rowsOf(rows, worldRank()), 4}));
  }
}

// sum over the sharded dim 0, pinned Shard(0): a local pending sum reduce-scattered into
// uneven blocks of the 5 columns (2: 3 + 2; 3: 2 + 2 + 1; 4: 2 + 2 + 1 + 0).
TEST(Uneven, PartialToShardIsAReduceScatterWithUnevenOutput) {
  Fusion f;
  TensorView* s = ops::sum(f.defineTensor({6, 5}, DataType::Float, "x"), {0});
  f.rename(s, "s");
  applyPlacements(s, worldMesh(), {S(0)});
  f.addOutput(s);
  ShardedRun run = runSharded(f, onWorld({{S(0)}}));
  expectPlan(run, {"reduce_scatter"});
  EXPECT_EQ(run.local_outputs[0].local.shape(), (std::vector<int64_t>{rowsOf(5, worldRank())}));
}

// Shard(0) -> Shard(1) with both dims uneven (7 rows, 5 columns): one all-to-all of blocks of
// different sizes each way.
TEST(Uneven, AllToAllBetweenTwoUnevenDims) {
  Fusion f;
  TensorView* y = ops::set(f.defineTensor({7, 5}, DataType::Float, "x"));
  f.rename(y, "y");
  applyPlacements(y, worldMesh(), {S(1)});
  f.addOutput(ops::neg(y));
  ShardedRun run = runSharded(f, onWorld({{S(0)}}));
  expectPlan(run, {"all_to_all"});
  EXPECT_EQ(run.local_outputs[0].local.shape(), (std::vector<int64_t>{7, rowsOf(5, worldRank())}));
}

// Replicate -> Shard(0) of 7 rows: each rank keeps its torch.chunk block, no communication.
TEST(Uneven, ReplicateToShardIsALocalSliceOfTheRanksBlock) {
  Fusion f;
  TensorView* y = ops::relu(f.defineTensor({7, 4}, DataType::Float, "x"));
  applyPlacements(y, worldMesh(), {S(0)});
  f.addOutput(y);
  ShardedRun run = runSharded(f, onWorld({{R}}));
  expectPlan(run, {});
  EXPECT_EQ(run.local_outputs[0].local.shape(), (std::vector<int64_t>{rowsOf(7, worldRank()), 4}));
}

// Nested shards of one dim on a 2x2 mesh: 5 rows cut 3 + 2 by axis 0, then 2 + 1 and 1 + 1 by
// axis 1; gathered whole by one allgather per axis, inner axis first.
MPI_TEST(Uneven, NestedUnevenShardsOnA2x2Mesh, exactly(4)) {
  const DeviceMesh mesh({0, 1, 2, 3}, {2, 2});
  Fusion f;
  TensorView* y = ops::relu(f.defineTensor({5, 3}, DataType::Float, "x"));
  applyPlacements(y, mesh, {R, R});
  f.addOutput(y);
  ShardedRun run = runSharded(f, {{mesh, {S(0), S(0)}}});
  expectPlan(run, {"allgather", "allgather"});
  EXPECT_EQ(run.collectives[0].mesh_axis, 1);
  EXPECT_EQ(run.collectives[0].bytes, (std::vector<int64_t>{2, 1, 1, 1}).at(worldRank()) * 3 * 4);
}

// From rank 0 to every rank and back: a scatter and a gather of uneven blocks.
TEST(Uneven, ScatterToAndGatherFromEveryRank) {
  const int64_t n = worldSize();
  std::vector<int64_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  auto f = parseFusion(fmt::format(R"(fusion {{
  mesh @first = [0]
  mesh @all = [{}]
  %x = input f32[7, 4] @first {{}}
  %y = set(%x) : f32[7, 4] @all {{split(0, {}), parallelize(0, DIDx)}}
  %z = relu(%y)
  %back = set(%z) : f32[7, 4] @first {{}}
  output %back
}})",
                                   fmt::join(all, ", "), n));
  ShardedRun run = runSharded(*f, {{DeviceMesh({0}), {R}}});
  expectPlan(run, {"scatter", "gather"});
}

// A reshape that merges an uneven shard into a dim whose torch.chunk blocks do not line up
// ([7, 4] -> [28]: rows 4 + 3 are 16 + 12 elements, the output's 14 + 14) is computed whole;
// one whose blocks do ([8, 4] -> [32] over 2 or 4 ranks) keeps the shard.
TEST(Uneven, ReshapeKeepsAShardOnlyWhereTheBlocksLineUp) {
  for (int64_t rows : {7, 8}) {
    SCOPED_TRACE(fmt::format("{} rows", rows));
    Fusion f;
    TensorView* x = f.defineTensor({rows, 4}, DataType::Float, "x");
    f.addOutput(ops::relu(ops::reshape(x, {rows * 4})));
    ShardedRun run = runSharded(f, onWorld({{S(0)}}));
    expectMatchesReference(run);
    expectSameCollectives(run.reported, run.collectives);
    const bool lines_up = rows % worldSize() == 0;
    EXPECT_EQ(run.local_outputs[0].placements, lines_up ? Ps{S(0)} : Ps{R});
    EXPECT_EQ(kinds(run.collectives), lines_up ? Strs{} : expect({"allgather"}));
  }
}

}  // namespace
}  // namespace meshfuse::testing
