// Values moving between meshes of different shapes (pipeline stages, data on one rank, results
// collected on one rank): broadcast, scatter, gather and reduce, alone and combined, on however
// many ranks mpirun started. Each test checks the numbers against single-device execution AND
// the exact collectives every rank executes (kind, team, root); a test whose meshes name more
// ranks than the world has skips.
#include <cmath>

#include "meshfuse/ir/parser.h"
#include "mpi_test_main.h"
#include "lower/pipeline.h"

namespace meshfuse::testing {
namespace {

using Strs = std::vector<std::string>;

// "[0, 1, ..., n-1]": a 1-D mesh over the first n ranks, in .mf syntax.
std::string firstRanks(int64_t n) {
  std::vector<int64_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  return fmt::format("[{}]", fmt::join(ids, ", "));
}

struct StagedRun {
  std::vector<Tensor> reference;  // single-device outputs
  std::vector<Tensor> gathered;   // every output assembled from the ranks of its mesh
  std::vector<CollectiveInfo> collectives;
  std::shared_ptr<Fusion> compiled;
};

// Runs the .mf program `text` (its inputs carry their meshes and placements) with seeded random
// inputs; every rank assembles every output from the blocks of the ranks that hold it.
StagedRun runStaged(const std::string& text) {
  std::unique_ptr<Fusion> def = parseFusion(text, "stages_test.mf");
  std::vector<ShardedTensor> inputs = inputLayouts(*def);
  std::vector<Tensor> full;
  for (size_t i = 0; i < def->inputs().size(); ++i) {
    std::vector<int64_t> shape;
    for (const Extent& e : def->inputs()[i]->shape()) shape.push_back(e.value());
    full.push_back(Tensor::random(DataType::Float, shape, 31 + i));
    inputs[i].global_shape = shape;
    if (inputs[i].mesh.contains(worldRank())) inputs[i].local = shardForRank(def->inputs()[i], full[i], worldRank());
  }
  StagedRun run;
  run.reference = evaluateReference(*def, full);
  MultiDeviceExecutor exec(def->clone(), world());
  run.compiled = exec.plan(inputs).fusion;
  std::vector<ShardedTensor> outs = exec.run(inputs);
  run.collectives = exec.lastCollectives();
  // The static report (`meshfuse collectives`, plan()) says what the run did, rank by rank.
  expectSameCollectives(collectives(exec.programFor(inputs), {}), run.collectives);
  for (size_t i = 0; i < outs.size(); ++i) {
    const TensorView* tv = run.compiled->outputs()[i];
    run.gathered.push_back(assembleGlobal(tv, everyRanksBlock(outs[i].local, tv->rank(), tv->dtype())));
  }
  return run;
}

void expectMatches(const StagedRun& run) {
  ASSERT_EQ(run.gathered.size(), run.reference.size());
  for (size_t i = 0; i < run.reference.size(); ++i) {
    const Tensor &a = run.gathered[i], &b = run.reference[i];
    ASSERT_EQ(a.shape(), b.shape()) << "output " << i;
    for (int64_t k = 0; k < b.numel(); ++k)
      ASSERT_NEAR(a.get(k), b.get(k), 1e-4 + 1e-4 * std::fabs(b.get(k))) << "output " << i << " element " << k;
  }
}

// "gather team [0, 1] root 1": what a collective is, among whom, rooted where.
Strs described(const std::vector<CollectiveInfo>& cs) {
  Strs out;
  for (const CollectiveInfo& c : cs) {
    std::string s = fmt::format("{} team [{}]", commKindName(c.kind), fmt::join(c.team, ", "));
    if (c.root >= 0) s += fmt::format(" root {}", c.root);
    out.push_back(s);
  }
  return out;
}

// The collectives this rank should have executed: `per_rank[r]` for rank r, none beyond.
Strs expectedFor(const std::vector<Strs>& per_rank) {
  return worldRank() < static_cast<int64_t>(per_rank.size()) ? per_rank[worldRank()] : Strs{};
}

MPI_TEST(Stages, GatherToARankInsideTheSourceMesh, atLeast(2)) {
  StagedRun run = runStaged(R"(fusion {
  mesh @a = [0, 1]
  mesh @b = [1]
  %x = input f32[8, 12] @a {split(0, 2), parallelize(0, DIDx)}
  %y = set(%x) : f32[8, 12] @b {}
  %z = relu(%y)
  output %z
})");
  expectMatches(run);
  EXPECT_EQ(described(run.collectives), expectedFor({{"gather team [0, 1] root 1"}, {"gather team [0, 1] root 1"}}));
}

MPI_TEST(Stages, GatherToARankOutsideTheSourceMeshGathersThenSends, atLeast(3)) {
  StagedRun run = runStaged(R"(fusion {
  mesh @a = [0, 1]
  mesh @b = [2]
  %x = input f32[8, 12] @a {split(1, 2), parallelize(1, DIDx)}
  %y = set(%x) : f32[8, 12] @b {}
  %z = relu(%y)
  output %z
})");
  expectMatches(run);
  // Gathered to the source mesh's first device, which sends it on (a send/recv is reported by
  // both its ranks); the gathered dim 1 was moved outermost for the gather.
  EXPECT_EQ(described(run.collectives), expectedFor({{"gather team [0, 1] root 0", "send_recv team [0, 2]"},
                                                     {"gather team [0, 1] root 0"},
                                                     {"send_recv team [0, 2]"}}));
  int64_t permutes = 0;
  for (const Expr* e : run.compiled->exprs()) permutes += e->kind() == OpKind::Permute;
  EXPECT_EQ(permutes, 2);
}

MPI_TEST(Stages, GatherFromA2x2MeshGathersItsInnerAxisFirst, atLeast(4)) {
  StagedRun run = runStaged(R"(fusion {
  mesh @a = [[0, 1], [2, 3]]
  mesh @b = [0]
  %x = input f32[8, 12] @a {split(0, 2), parallelize(0, DIDy), split(2, 2), parallelize(2, DIDx)}
  %y = set(%x) : f32[8, 12] @b {}
  output %y
})");
  expectMatches(run);
  // Dim 1 is all-gathered along the rows of the mesh, then dim 0 gathered to 0 down its column.
  EXPECT_EQ(described(run.collectives), expectedFor({{"allgather team [0, 1]", "gather team [0, 2] root 0"},
                                                     {"allgather team [0, 1]"},
                                                     {"allgather team [2, 3]", "gather team [0, 2] root 0"},
                                                     {"allgather team [2, 3]"}}));
}

TEST(Stages, ReduceOfAPendingSumToOneRank) {
  const int64_t n = worldSize();
  StagedRun run = runStaged(fmt::format(R"(fusion {{
  mesh @all = {}
  mesh @first = [0]
  %a = input f32[8, 24] @all {{split(1, {}), parallelize(1, DIDx)}}
  %b = input f32[24, 12] @all {{split(0, {}), parallelize(0, DIDx)}}
  %q = matmul(%a, %b)
  %y = set(%q) : f32[8, 12] @first {{}}
  output %y
}})",
                                        firstRanks(n), n, n));
  expectMatches(run);
  Strs reduce = {fmt::format("reduce team {} root 0", firstRanks(n))};
  EXPECT_EQ(described(run.collectives), n > 1 ? reduce : Strs{}) << "no collective among one device";
}

TEST(Stages, BroadcastFromRank0ToEveryRank) {
  const int64_t n = worldSize();
  StagedRun run = runStaged(fmt::format(R"(fusion {{
  mesh @first = [0]
  mesh @all = {}
  %x = input f32[8, 12] @first {{}}
  %y = set(%x) : f32[8, 12] @all {{}}
  %z = relu(%y)
  output %z
}})",
                                        firstRanks(n)));
  expectMatches(run);
  EXPECT_EQ(described(run.collectives), n > 1 ? Strs{fmt::format("broadcast team {} root 0", firstRanks(n))} : Strs{});
}

MPI_TEST(Stages, BroadcastToAMeshWithoutTheRootSendsFirst, atLeast(3)) {
  StagedRun run = runStaged(R"(fusion {
  mesh @first = [0]
  mesh @rest = [1, 2]
  %x = input f32[8, 12] @first {}
  %y = set(%x) : f32[8, 12] @rest {}
  %z = relu(%y)
  output %z
})");
  expectMatches(run);
  EXPECT_EQ(described(run.collectives), expectedFor({{"send_recv team [0, 1]"},
                                                     {"send_recv team [0, 1]", "broadcast team [1, 2] root 1"},
                                                     {"broadcast team [1, 2] root 1"}}));
}

// A replicated value needs no collective to reach one device: a copy where that device holds it,
// else one send from its mesh's first device.
MPI_TEST(Stages, ReplicatedValueIsCopiedOrSentToOneDevice, atLeast(3)) {
  StagedRun run = runStaged(R"(fusion {
  mesh @src = [0, 1]
  mesh @inside = [1]
  mesh @outside = [2]
  %x = input f32[8, 12] @src {}
  %y = set(%x) : f32[8, 12] @inside {}
  %z = set(%x) : f32[8, 12] @outside {}
  output %y
  output %z
})");
  expectMatches(run);
  EXPECT_EQ(described(run.collectives), expectedFor({{"send_recv team [0, 2]"}, {}, {"send_recv team [0, 2]"}}));
}

// x [12, 24] on rank 0, scattered over every rank along `dim`.
StagedRun scatterAlong(int64_t dim) {
  const int64_t n = worldSize();
  return runStaged(fmt::format(R"(fusion {{
  mesh @first = [0]
  mesh @all = {}
  %x = input f32[12, 24] @first {{}}
  %y = set(%x) : f32[12, 24] @all {{split({}, {}), parallelize({}, DIDx)}}
  %z = relu(%y)
  output %z
}})",
                               firstRanks(n), dim, n, dim));
}

TEST(Stages, ScatterFromRank0AlongTheOutermostDim) {
  StagedRun run = scatterAlong(0);
  expectMatches(run);
  const int64_t n = worldSize();
  EXPECT_EQ(described(run.collectives), n > 1 ? Strs{fmt::format("scatter team {} root 0", firstRanks(n))} : Strs{});
}

TEST(Stages, ScatterFromRank0AlongAnInnerDimMovesItOutermost) {
  StagedRun run = scatterAlong(1);
  expectMatches(run);
  const int64_t n = worldSize();
  EXPECT_EQ(described(run.collectives), n > 1 ? Strs{fmt::format("scatter team {} root 0", firstRanks(n))} : Strs{});
  if (n == 1) return;
  // layout-for-communication: dim 1 is made outermost on rank 0 and restored on every rank.
  int64_t permutes = 0;
  for (const Expr* e : run.compiled->exprs()) permutes += e->kind() == OpKind::Permute;
  EXPECT_EQ(permutes, 2);
}

MPI_TEST(Stages, BroadcastToA2x2MeshThenSlicesLocally, atLeast(4)) {
  StagedRun run = runStaged(R"(fusion {
  mesh @first = [0]
  mesh @grid = [[0, 1], [2, 3]]
  %x = input f32[8, 12] @first {}
  %y = set(%x) : f32[8, 12] @grid {split(0, 2), parallelize(0, DIDy), split(2, 2), parallelize(2, DIDx)}
  %z = relu(%y)
  output %z
})");
  expectMatches(run);
  // Replicate -> Shard needs no communication: the two slices are local.
  EXPECT_EQ(described(run.collectives), Strs{"broadcast team [0, 1, 2, 3] root 0"});
}

// The input is loaded on rank 0, the MLP runs tensor-parallel on every rank, and rank 0 collects
// the activation (gathered along its sharded dim 1) and the loss (a pending sum, reduced).
TEST(Stages, DataOnRank0ModelOnEveryRankResultsOnRank0) {
  const int64_t n = worldSize();
  StagedRun run = runStaged(fmt::format(R"(fusion {{
  mesh @host = [0]
  mesh @tp = {}
  %x = input f32[8, 16] @host {{}}
  %up_w = input f32[24, 16] @tp {{split(0, {}), parallelize(0, DIDx)}}
  %down_w = input f32[16, 24] @tp {{split(1, {}), parallelize(1, DIDx)}}
  %up = linear(%x, %up_w)
  %act = gelu(%up, approximate="tanh")
  %act0 = set(%act) : f32[8, 24] @host {{}}
  %y = linear(%act, %down_w)
  %loss = sum(%y, dims=[1])
  %loss0 = set(%loss) : f32[8] @host {{}}
  output %act0
  output %loss0
}})",
                                        firstRanks(n), n, n));
  expectMatches(run);
  if (n == 1) {
    EXPECT_EQ(described(run.collectives), Strs{});
    return;
  }
  const std::string team = firstRanks(n);
  EXPECT_EQ(described(run.collectives),
            (Strs{fmt::format("broadcast team {} root 0", team), fmt::format("gather team {} root 0", team),
                  fmt::format("reduce team {} root 0", team)}));
  // Only the root sends a broadcast; everyone sends its block of a gather.
  EXPECT_EQ(run.collectives[0].bytes, worldRank() == 0 ? 8 * 16 * 4 : 0);
  EXPECT_EQ(run.collectives[1].bytes, 8 * 24 / n * 4);
}

// A GPipe pipeline whose second stage is tensor-parallel: each microbatch goes from rank 0 to
// the second stage's first device, which broadcasts it over the stage.
MPI_TEST(Stages, PipelineIntoATensorParallelStage, atLeast(3)) {
  StagedRun run = runStaged(R"(fusion {
  mesh @s0 = [0]
  mesh @s1 = [1, 2]
  %inp = input f32[32, 16] @s0 {split(0, 4), parallelize(0, Stream)}
  %up0 = input f32[16, 16] @s0 {}
  %up1 = input f32[64, 16] @s1 {split(0, 2), parallelize(0, DIDx)}
  %down1 = input f32[16, 64] @s1 {split(1, 2), parallelize(1, DIDx)}
  %a0 = linear(%inp, %up0)
  %b0 = gelu(%a0, approximate="tanh")
  %a1 = linear(%b0, %up1)
  %b1 = gelu(%a1, approximate="tanh")
  %out1 = linear(%b1, %down1)
  output %out1
})");
  expectMatches(run);
  Strs stage1;
  for (int i = 0; i < 4; ++i) stage1.insert(stage1.end(), {"broadcast team [1, 2] root 1", "allreduce team [1, 2]"});
  Strs receiver = Strs(4, "send_recv team [0, 1]");  // its receives are all posted before the loop
  receiver.insert(receiver.end(), stage1.begin(), stage1.end());
  EXPECT_EQ(described(run.collectives), expectedFor({Strs(4, "send_recv team [0, 1]"), receiver, stage1}));
}

MPI_TEST(Stages, MovingBetweenTwoMultiDeviceMeshesOfDifferentShapesIsUnsupported, atLeast(3)) {
  try {
    runStaged(R"(fusion {
  mesh @two = [0, 1]
  mesh @three = [0, 1, 2]
  %x = input f32[6, 12] @two {split(0, 2), parallelize(0, DIDx)}
  %y = set(%x) : f32[6, 12] @three {split(0, 3), parallelize(0, DIDx)}
  output %y
})");
    FAIL() << "expected an UnsupportedError";
  } catch (const UserError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
    EXPECT_THAT(
        e.what(),
        ::testing::HasSubstr("%x (for %y): cannot move from [Shard(0)] on mesh [0, 1] to [Shard(0)] on mesh [0, 1, 2]: "
                             "between meshes of different shapes a value moves only to or from a single device"));
  }
}

}  // namespace
}  // namespace meshfuse::testing
