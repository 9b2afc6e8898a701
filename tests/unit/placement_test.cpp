// DeviceMesh geometry and the DTensor placements <-> IterDomains rule (applyPlacements,
// placementsOf, shardFactors, localShape) on 1-D, 2-D and 3-D meshes.
#include <gmock/gmock-matchers.h>
#include <gtest/gtest.h>

#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/placement.h"
#include "test_helpers.h"

namespace meshfuse {
namespace {

using ::testing::HasSubstr;
using testing_helpers::extents;
using testing_helpers::userErrorMessage;
using Strs = std::vector<std::string>;
using Ints = std::vector<int64_t>;
using Ps = std::vector<Placement>;
const Placement R = Placement::replicate();
const Placement P = Placement::partial();
Placement S(int64_t d) { return Placement::shard(d); }

Strs loopStrings(const TensorView* tv) {
  Strs out;
  for (const IterDomain* id : tv->loop()) out.push_back(id->toString());
  return out;
}

// ---- DeviceMesh -------------------------------------------------------------------------

TEST(DeviceMesh, OneDimensional) {
  DeviceMesh m({0, 1, 2, 3});
  EXPECT_EQ(m.shape(), (Ints{4}));
  EXPECT_EQ(m.rank(), 1);
  EXPECT_EQ(m.size(), 4);
  EXPECT_EQ(m.size(0), 4);
  EXPECT_TRUE(m.contains(3));
  EXPECT_FALSE(m.contains(4));
  EXPECT_EQ(m.coordinates(2), (Ints{2}));
  EXPECT_EQ(m.team(2, 0), (Ints{0, 1, 2, 3}));
  EXPECT_EQ(m.indexAlong(3, 0), 3);
  EXPECT_EQ(m.parallelTypeOfAxis(0), ParallelType::DIDx);
  EXPECT_EQ(m.axisOfParallelType(ParallelType::DIDx), 0);
  EXPECT_TRUE(m.hasAxisFor(ParallelType::DIDx));
  EXPECT_FALSE(m.hasAxisFor(ParallelType::DIDy));
  EXPECT_FALSE(m.hasAxisFor(ParallelType::Stream));
  EXPECT_EQ(m.toString(), "[0, 1, 2, 3]");
  EXPECT_THAT(userErrorMessage(ErrorKind::Placement, [&] { m.axisOfParallelType(ParallelType::DIDy); }),
              HasSubstr("DIDy is beyond the axes of rank-1 mesh [0, 1, 2, 3]"));
  EXPECT_THAT(userErrorMessage(ErrorKind::Mesh, [&] { m.coordinates(9); }),
              HasSubstr("device 9 is not in mesh [0, 1, 2, 3]"));
}

TEST(DeviceMesh, TwoDimensionalLastAxisIsDIDx) {
  DeviceMesh m({0, 1, 2, 3}, {2, 2});
  EXPECT_EQ(m.rank(), 2);
  EXPECT_EQ(m.parallelTypeOfAxis(0), ParallelType::DIDy);
  EXPECT_EQ(m.parallelTypeOfAxis(1), ParallelType::DIDx);
  EXPECT_EQ(m.axisOfParallelType(ParallelType::DIDy), 0);
  EXPECT_EQ(m.coordinates(2), (Ints{1, 0}));
  EXPECT_EQ(m.coordinates(1), (Ints{0, 1}));
  EXPECT_EQ(m.team(2, 0), (Ints{0, 2}));
  EXPECT_EQ(m.team(2, 1), (Ints{2, 3}));
  EXPECT_EQ(m.indexAlong(3, 0), 1);
  EXPECT_EQ(m.indexAlong(2, 1), 0);
  EXPECT_EQ(m.toString(), "[[0, 1], [2, 3]]");
  EXPECT_NE(m, DeviceMesh({0, 1, 2, 3}));
  EXPECT_EQ(m, DeviceMesh({0, 1, 2, 3}, {2, 2}));
}

TEST(DeviceMesh, DeviceIdsNeedNotBeInOrder) {
  DeviceMesh m({3, 1, 7, 5}, {2, 2});
  EXPECT_EQ(m.coordinates(7), (Ints{1, 0}));
  EXPECT_EQ(m.team(7, 1), (Ints{7, 5}));
  EXPECT_EQ(m.team(7, 0), (Ints{3, 7}));
  EXPECT_EQ(m.indexAlong(1, 1), 1);
  EXPECT_EQ(m.toString(), "[[3, 1], [7, 5]]");
}

TEST(DeviceMesh, ThreeDimensional) {
  DeviceMesh m({0, 1, 2, 3, 4, 5, 6, 7}, {2, 2, 2});
  EXPECT_EQ(m.parallelTypeOfAxis(0), ParallelType::DIDz);
  EXPECT_EQ(m.parallelTypeOfAxis(1), ParallelType::DIDy);
  EXPECT_EQ(m.parallelTypeOfAxis(2), ParallelType::DIDx);
  EXPECT_EQ(m.coordinates(5), (Ints{1, 0, 1}));
  EXPECT_EQ(m.team(5, 0), (Ints{1, 5}));
  EXPECT_EQ(m.team(5, 1), (Ints{5, 7}));
  EXPECT_EQ(m.team(5, 2), (Ints{4, 5}));
  EXPECT_EQ(m.toString(), "[[[0, 1], [2, 3]], [[4, 5], [6, 7]]]");
  DeviceMesh tall({0, 1, 2, 3, 4, 5}, {3, 2, 1});
  EXPECT_EQ(tall.toString(), "[[[0], [1]], [[2], [3]], [[4], [5]]]");
  EXPECT_EQ(tall.team(3, 0), (Ints{1, 3, 5}));
}

TEST(Placement, ToString) {
  EXPECT_EQ(S(0).toString(), "Shard(0)");
  EXPECT_EQ(S(-1).toString(), "Shard(-1)");
  EXPECT_EQ(R.toString(), "Replicate()");
  EXPECT_EQ(P.toString(), "Partial()");
  EXPECT_EQ(placementsToString({S(1), R, P}), "[Shard(1), Replicate(), Partial()]");
}

// ---- applyPlacements / placementsOf -----------------------------------------------------

struct PlacementCase : ::testing::Test {
  Fusion f;
  const DeviceMesh mesh1{{0, 1, 2, 3}};
  const DeviceMesh mesh2{{0, 1, 2, 3}, {2, 2}};
  const DeviceMesh mesh3{{0, 1, 2, 3, 4, 5, 6, 7}, {2, 2, 2}};
};

TEST_F(PlacementCase, ShardOnA1DMesh) {
  TensorView* x = f.defineTensor({8, 16}, DataType::Float, "x");
  applyPlacements(x, mesh1, {S(0)});
  EXPECT_EQ(loopStrings(x), (Strs{"DIDx{4}", "2", "16"}));
  EXPECT_EQ(extents(x->logical()), (Strs{"8", "16"}));
  EXPECT_EQ(*x->mesh(), mesh1);
  EXPECT_TRUE(x->pinned());
  EXPECT_EQ(placementsOf(x), (Ps{S(0)}));
  EXPECT_EQ(shardFactors(x), (Ints{4, 1}));
  EXPECT_EQ(localShape(x, {}, 0), (Ints{2, 16}));
}

TEST_F(PlacementCase, NegativeShardDimCountsFromTheEnd) {
  TensorView* x = f.defineTensor({8, 16}, DataType::Float, "x");
  applyPlacements(x, mesh1, {S(-1)});
  EXPECT_EQ(loopStrings(x), (Strs{"8", "DIDx{4}", "4"}));
  EXPECT_EQ(placementsOf(x), (Ps{S(1)})) << "placementsOf gives the normalized dim";
  EXPECT_EQ(localShape(x, {}, 0), (Ints{8, 4}));
}

TEST_F(PlacementCase, ReplicateLeavesTheDomainUnsplit) {
  TensorView* x = f.defineTensor({8, 16}, DataType::Float, "x");
  applyPlacements(x, mesh1, {R});
  EXPECT_EQ(x->loop(), x->logical());
  EXPECT_EQ(*x->mesh(), mesh1);
  EXPECT_EQ(placementsOf(x), (Ps{R}));
  EXPECT_EQ(shardFactors(x), (Ints{1, 1}));
  EXPECT_EQ(localShape(x, {}, 0), (Ints{8, 16}));
}

TEST_F(PlacementCase, PartialAddsAReductionDimOnTheMeshAxis) {
  TensorView* x = f.defineTensor({8, 16}, DataType::Float, "x");
  applyPlacements(x, mesh1, {P});
  EXPECT_EQ(extents(x->logical()), (Strs{"8", "16", "r4"}));
  EXPECT_EQ(loopStrings(x), (Strs{"8", "16", "DIDx{r4}"}));
  EXPECT_EQ(x->rank(), 2) << "the pending-sum dim is not part of the shape";
  EXPECT_EQ(placementsOf(x), (Ps{P}));
  EXPECT_EQ(localShape(x, {}, 0), (Ints{8, 16}));
}

TEST_F(PlacementCase, TwoDimsOnA2DMesh) {
  TensorView* x = f.defineTensor({8, 6}, DataType::Float, "x");
  applyPlacements(x, mesh2, {S(0), S(1)});
  EXPECT_EQ(loopStrings(x), (Strs{"DIDy{2}", "4", "DIDx{2}", "3"}));
  EXPECT_EQ(placementsOf(x), (Ps{S(0), S(1)}));
  EXPECT_EQ(shardFactors(x), (Ints{2, 2}));
  EXPECT_EQ(localShape(x, {}, 0), (Ints{4, 3}));
}

TEST_F(PlacementCase, OneDimOnBothAxesSplitsInMeshAxisOrder) {
  TensorView* x = f.defineTensor({8, 6}, DataType::Float, "x");
  applyPlacements(x, mesh2, {S(0), S(0)});
  // Mesh axis 0 (DIDy) is outermost, as torch's Shard(0) on both axes.
  EXPECT_EQ(loopStrings(x), (Strs{"DIDy{2}", "DIDx{2}", "2", "6"}));
  EXPECT_EQ(x->logicalAxisOf(0), 0);
  EXPECT_EQ(x->logicalAxisOf(1), 0);
  EXPECT_EQ(placementsOf(x), (Ps{S(0), S(0)}));
  EXPECT_EQ(shardFactors(x), (Ints{4, 1}));
  EXPECT_EQ(localShape(x, {}, 0), (Ints{2, 6}));
}

TEST_F(PlacementCase, ReplicatePartialAndShardMixOnA2DMesh) {
  TensorView* a = f.defineTensor({8, 6}, DataType::Float, "a");
  applyPlacements(a, mesh2, {R, S(1)});
  EXPECT_EQ(loopStrings(a), (Strs{"8", "DIDx{2}", "3"}));
  EXPECT_EQ(placementsOf(a), (Ps{R, S(1)}));

  TensorView* b = f.defineTensor({8, 6}, DataType::Float, "b");
  applyPlacements(b, mesh2, {P, S(0)});
  EXPECT_EQ(extents(b->logical()), (Strs{"8", "6", "r2"}));
  EXPECT_EQ(loopStrings(b), (Strs{"DIDx{2}", "4", "6", "DIDy{r2}"}));
  EXPECT_EQ(placementsOf(b), (Ps{P, S(0)}));
  EXPECT_EQ(localShape(b, {}, 0), (Ints{4, 6}));

  TensorView* c = f.defineTensor({8, 6}, DataType::Float, "c");
  applyPlacements(c, mesh2, {S(-1), P});
  EXPECT_EQ(loopStrings(c), (Strs{"8", "DIDy{2}", "3", "DIDx{r2}"}));
  EXPECT_EQ(placementsOf(c), (Ps{S(1), P}));
}

TEST_F(PlacementCase, ThreeDimensionalMesh) {
  TensorView* x = f.defineTensor({8, 6, 4}, DataType::Float, "x");
  applyPlacements(x, mesh3, {S(0), R, S(2)});
  EXPECT_EQ(loopStrings(x), (Strs{"DIDz{2}", "4", "6", "DIDx{2}", "2"}));
  EXPECT_EQ(placementsOf(x), (Ps{S(0), R, S(2)}));
  EXPECT_EQ(localShape(x, {}, 0), (Ints{4, 6, 2}));

  TensorView* y = f.defineTensor({8, 8, 4}, DataType::Float, "y");
  applyPlacements(y, mesh3, {P, S(1), S(1)});
  EXPECT_EQ(loopStrings(y), (Strs{"8", "DIDy{2}", "DIDx{2}", "2", "4", "DIDz{r2}"}));
  EXPECT_EQ(placementsOf(y), (Ps{P, S(1), S(1)}));
  EXPECT_EQ(shardFactors(y), (Ints{1, 4, 1}));
  EXPECT_EQ(localShape(y, {}, 0), (Ints{8, 2, 4}));
}

TEST_F(PlacementCase, SymbolicDimsAreSplitWhenBound) {
  TensorView* x = f.defineTensor({Extent::symbolic("t"), 64}, DataType::Float, "x");
  applyPlacements(x, mesh1, {S(0)});
  EXPECT_EQ(loopStrings(x), (Strs{"DIDx{4}", "?t/4", "64"}));
  EXPECT_EQ(localShape(x, {{"t", 8}}, 0), (Ints{2, 64}));
  // 6 rows over 4 ranks: torch.chunk's 2, 2, 2 and an empty fourth shard.
  for (int64_t r = 0; r < 4; ++r) EXPECT_EQ(localShape(x, {{"t", 6}}, r), (Ints{r < 3 ? 2 : 0, 64}));
  EXPECT_THAT(userErrorMessage(ErrorKind::Shape, [&] { localShape(x, {}, 0); }),
              HasSubstr("symbolic size ?t is not bound"));
}

// ---- uneven shards: torch.chunk's blocks, as DTensor's Shard -----------------------------

TEST(ChunkSpan, FollowsTorchChunk) {
  // torch.chunk (checked against torch 2.x): leading chunks ceil(n / D), trailing ones less; a
  // chunk past the end is empty (torch.chunk returns fewer chunks, DTensor an empty shard).
  auto sizes = [](int64_t n, int64_t d) {
    Ints out;
    for (int64_t i = 0; i < d; ++i) out.push_back(chunkSpan(n, d, i).size);
    return out;
  };
  EXPECT_EQ(sizes(5, 4), (Ints{2, 2, 1, 0}));
  EXPECT_EQ(sizes(7, 2), (Ints{4, 3}));
  EXPECT_EQ(sizes(7, 4), (Ints{2, 2, 2, 1}));
  EXPECT_EQ(sizes(10, 3), (Ints{4, 4, 2}));
  EXPECT_EQ(sizes(10, 4), (Ints{3, 3, 3, 1}));
  EXPECT_EQ(sizes(3, 4), (Ints{1, 1, 1, 0}));
  EXPECT_EQ(sizes(1, 4), (Ints{1, 0, 0, 0}));
  EXPECT_EQ(sizes(0, 3), (Ints{0, 0, 0}));
  EXPECT_EQ(chunkSpan(5, 4, 3), (Span{5, 0}));  // an empty chunk starts at the end
  EXPECT_EQ(chunkSpan(10, 3, 2), (Span{8, 2}));
}

TEST_F(PlacementCase, UnevenShardsAreTorchChunkBlocks) {
  TensorView* x = f.defineTensor({7, 5}, DataType::Float, "x");
  applyPlacements(x, mesh1, {S(0)});
  EXPECT_EQ(loopStrings(x), (Strs{"DIDx{4}", "2", "5"})) << "the printed extent is the leading ranks' ceil";
  std::vector<Ints> shapes;
  for (int64_t r = 0; r < 4; ++r) shapes.push_back(localShape(x, {}, r));
  EXPECT_EQ(shapes, (std::vector<Ints>{{2, 5}, {2, 5}, {2, 5}, {1, 5}}));
  EXPECT_EQ(localBlock(x, {}, 3), (std::vector<Span>{{6, 1}, {0, 5}}));
  EXPECT_EQ(localShape(x, {}, -1), (Ints{2, 5})) << "rank -1: the largest block";
}

TEST_F(PlacementCase, UnevenShardsOfOneDimNestInMeshAxisOrder) {
  // torch's [Shard(1), Shard(1)] on a 2x2 mesh of 5 columns: axis 0 cuts 3 + 2, axis 1 cuts
  // each of those again: 2 + 1 and 1 + 1 (DTensor's compute_local_shape_and_global_offset).
  TensorView* x = f.defineTensor({2, 5}, DataType::Float, "x");
  applyPlacements(x, mesh2, {S(1), S(1)});
  std::vector<std::vector<Span>> blocks;
  for (int64_t r = 0; r < 4; ++r) blocks.push_back(localBlock(x, {}, r));
  EXPECT_EQ(blocks, (std::vector<std::vector<Span>>{
                        {{0, 2}, {0, 2}}, {{0, 2}, {2, 1}}, {{0, 2}, {3, 1}}, {{0, 2}, {4, 1}}}));
  // Three rows on four ranks (two axes): the last rank's block is empty.
  TensorView* y = f.defineTensor({3, 2}, DataType::Float, "y");
  applyPlacements(y, mesh2, {S(0), S(0)});
  EXPECT_EQ(localShape(y, {}, 3), (Ints{0, 2}));
  EXPECT_EQ(localBlock(y, {}, 2), (std::vector<Span>{{2, 1}, {0, 2}}));
}

TEST_F(PlacementCase, ShardOfAGemmOutputIgnoresItsReductionDim) {
  TensorView* x = f.defineTensor({Extent::symbolic("t"), 64}, DataType::Float, "x");
  TensorView* w = f.defineTensor({256, 64}, DataType::Float, "w");
  TensorView* y = f.apply(OpKind::Linear, {x, w});
  applyPlacements(y, mesh1, {S(-1)});  // the last of [t, n]: n, not the r64
  EXPECT_EQ(loopStrings(y), (Strs{"?t", "DIDx{4}", "64", "r64"}));
  EXPECT_EQ(placementsOf(y), (Ps{S(1)}));
  EXPECT_EQ(localShape(y, {{"t", 3}}, 0), (Ints{3, 64}));
}

TEST_F(PlacementCase, PlacementsOfAHandWrittenSchedule) {
  TensorView* x = f.defineTensor({8, 6}, DataType::Float, "x");
  x->setDeviceMesh(mesh2)->split(1, 2)->parallelize(1, ParallelType::DIDx);
  EXPECT_EQ(placementsOf(x), (Ps{R, S(1)}));
  x->split(0, 2)->parallelize(0, ParallelType::DIDy);
  EXPECT_EQ(placementsOf(x), (Ps{S(0), S(1)}));

  // A DID on a split of a gemm's reduction dim is a pending sum: Partial.
  TensorView* a = f.defineTensor({4, 64}, DataType::Float, "a");
  TensorView* w = f.defineTensor({16, 64}, DataType::Float, "w");
  TensorView* y = f.apply(OpKind::Linear, {a, w});
  y->setDeviceMesh(DeviceMesh({0, 1}))->split(2, 2)->parallelize(2, ParallelType::DIDx);
  EXPECT_EQ(placementsOf(y), (Ps{P}));
  EXPECT_EQ(localShape(y, {}, 0), (Ints{4, 16}));

  // Round trip: the placements read back re-create the same loop domain.
  TensorView* z = f.defineTensor({8, 6}, DataType::Float, "z");
  applyPlacements(z, mesh2, placementsOf(x));
  EXPECT_EQ(loopStrings(z), loopStrings(x));
}

TEST_F(PlacementCase, DidOnAMergedAxisIsNoPlacement) {
  TensorView* x = f.defineTensor({2, 4}, DataType::Float, "x");
  x->setDeviceMesh(DeviceMesh({0, 1}))->merge(0)->split(0, 2)->parallelize(0, ParallelType::DIDx);
  EXPECT_THAT(userErrorMessage(ErrorKind::Placement, [&] { placementsOf(x); }),
              HasSubstr("%x: its DIDx axis derives from a merge of several dims"));
  EXPECT_THAT(userErrorMessage(ErrorKind::Unsupported, [&] { shardFactors(x); }),
              HasSubstr("DID parallelization of a merged axis"));
}

TEST_F(PlacementCase, ApplyingAgainReplacesTheSchedule) {
  TensorView* x = f.defineTensor({8, 16}, DataType::Float, "x");
  applyPlacements(x, mesh1, {S(0)});
  applyPlacements(x, mesh2, {S(1), R});
  EXPECT_EQ(*x->mesh(), mesh2);
  EXPECT_EQ(loopStrings(x), (Strs{"8", "DIDy{2}", "8"}));
  EXPECT_EQ(placementsOf(x), (Ps{S(1), R}));
  EXPECT_EQ(x->schedule().size(), 2u);
}

TEST_F(PlacementCase, ReplacingAPartialPlacementDropsItsReductionDim) {
  // applyPlacements "replaces its loop schedule": a Partial() applied earlier must not leave its
  // reduction dim behind, or the tensor keeps printing (and lowering) as a pending sum.
  TensorView* x = f.defineTensor({8}, DataType::Float, "x");
  applyPlacements(x, mesh1, {P});
  applyPlacements(x, mesh1, {R});
  EXPECT_EQ(extents(x->logical()), (Strs{"8"}));
  applyPlacements(x, mesh1, {P});
  EXPECT_EQ(extents(x->logical()), (Strs{"8", "r4"})) << "only one pending-sum dim per mesh axis";
}

TEST_F(PlacementCase, RejectsBadPlacements) {
  TensorView* x = f.defineTensor({6, 16}, DataType::Float, "x");
  EXPECT_THAT(userErrorMessage(ErrorKind::Placement, [&] { applyPlacements(x, mesh2, {S(0)}); }),
              HasSubstr("%x: got 1 placements [Shard(0)] for a rank-2 mesh [[0, 1], [2, 3]]"));
  EXPECT_THAT(userErrorMessage(ErrorKind::Placement, [&] { applyPlacements(x, mesh1, {S(2)}); }),
              HasSubstr("placement Shard(2) on mesh axis 0 names a dim that %x of rank 2 does not have"));
  EXPECT_THAT(userErrorMessage(ErrorKind::Placement, [&] { applyPlacements(x, mesh1, {S(-3)}); }),
              HasSubstr("Shard(-3)"));
}

TEST_F(PlacementCase, RejectsBadStreamSplits) {
  // fuzz/regressions/compile_plan/stream_split_of_a_missing_dim: a dim the tensor does not have
  // (a full reduction has none) was a std::out_of_range; a merged-away dim an internal error.
  TensorView* x = f.defineTensor({8, 4}, DataType::Float, "x");
  EXPECT_THAT(userErrorMessage(ErrorKind::Value, [&] { applyStreamSplit(x, {2, 2}); }),
              HasSubstr("%x: a Stream split of dim 2, but it has 2 dims (not counting reduction dims)"));
  EXPECT_THAT(userErrorMessage(ErrorKind::Value, [&] { applyStreamSplit(x, {-1, 2}); }),
              HasSubstr("%x: a Stream split of dim -1"));
  x->merge(0);
  EXPECT_THAT(userErrorMessage(ErrorKind::Unsupported, [&] { applyStreamSplit(x, {1, 2}); }),
              HasSubstr("%x: a Stream split of dim 1, which its schedule merged into another dim"));
}

}  // namespace
}  // namespace meshfuse
