// The TensorView schedule API: split (outer/inner, static and symbolic extents), merge,
// parallelize, loopAxisOf, logicalAxisOf and resetSchedule.
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

TEST(Split, OuterSplitPutsTheFactorOutside) {
  Fusion f;
  TensorView* x = f.defineTensor({8, 12}, DataType::Float, "x");
  IterDomain* d1 = x->logical()[1];
  EXPECT_EQ(x->split(1, 4), x) << "the schedule API chains";
  EXPECT_EQ(extents(x->loop()), (Strs{"8", "4", "3"}));
  EXPECT_EQ(extents(x->logical()), (Strs{"8", "12"})) << "split leaves the logical domain alone";
  const IdTransform* t = x->loop()[1]->definition();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t, x->loop()[2]->definition());
  EXPECT_EQ(t->kind, IdTransform::Split);
  EXPECT_EQ(t->factor, 4);
  EXPECT_FALSE(t->inner_split);
  EXPECT_EQ(t->inputs, (std::vector<IterDomain*>{d1}));
  EXPECT_EQ(t->outputs, (std::vector<IterDomain*>{x->loop()[1], x->loop()[2]}));
  ASSERT_EQ(x->schedule().size(), 1u);
  EXPECT_EQ(x->schedule()[0], (ScheduleStep{ScheduleStep::Split, 1, 4, false, ParallelType::Serial}));
}

TEST(Split, InnerSplitPutsTheFactorInside) {
  Fusion f;
  TensorView* x = f.defineTensor({8, 12}, DataType::Float, "x");
  x->split(-1, 4, /*inner_split=*/true);
  EXPECT_EQ(extents(x->loop()), (Strs{"8", "3", "4"}));
  EXPECT_TRUE(x->loop()[1]->definition()->inner_split);
  EXPECT_EQ(x->schedule()[0].axis, 1) << "recorded steps hold normalized axes";
  EXPECT_TRUE(x->schedule()[0].inner_split);
}

TEST(Split, SymbolicExtentsDivide) {
  Fusion f;
  TensorView* x = f.defineTensor({Extent::symbolic("t"), 64}, DataType::Float, "x");
  x->split(0, 4);
  EXPECT_EQ(extents(x->loop()), (Strs{"4", "?t/4", "64"}));
  EXPECT_EQ(x->loop()[1]->extent(), Extent::symbolic("t", 1, 4));
  x->split(1, 2, /*inner_split=*/true);
  EXPECT_EQ(extents(x->loop()), (Strs{"4", "?t/8", "2", "64"}));
  TensorView* y = f.defineTensor({Extent::symbolic("t", 2, 1)}, DataType::Float, "y");
  y->split(0, 4, /*inner_split=*/true);
  EXPECT_EQ(extents(y->loop()), (Strs{"?t/2", "4"})) << "?t*2 / 4 = ?t/2";
}

TEST(Split, ReductionDimsSplitIntoReductionDims) {
  Fusion f;
  TensorView* x = f.defineTensor({4, 8}, DataType::Float, "x");
  TensorView* s = f.apply(OpKind::Sum, {x}, {{"dims", std::vector<int64_t>{1}}});
  s->split(1, 2);
  EXPECT_EQ(extents(s->loop()), (Strs{"4", "r2", "r4"}));
}

TEST(Split, RejectsBadFactorsAndAxes) {
  Fusion f;
  TensorView* x = f.defineTensor({6, 1}, DataType::Float, "x");
  EXPECT_THAT(userErrorMessage(ErrorKind::Value, [&] { x->split(0, 0); }), HasSubstr("factor 0 must be positive"));
  EXPECT_THAT(userErrorMessage(ErrorKind::Value, [&] { x->split(2, 2); }),
              HasSubstr("split: axis 2 is out of range for %x whose loop domain has 2 axes"));
  EXPECT_THAT(userErrorMessage(ErrorKind::Value, [&] { x->split(-3, 2); }), HasSubstr("axis -3 is out of range"));
  EXPECT_TRUE(x->schedule().empty()) << "a rejected step is not recorded";
  EXPECT_EQ(x->loop(), x->logical());
}

// A factor that does not divide the extent splits it as torch.chunk splits it: the remainder's
// extent is the leading parts' ceil (placement.h: localBlock gives each rank its own).
TEST(Split, AFactorThatDoesNotDivideSplitsAsTorchChunk) {
  Fusion f;
  TensorView* x = f.defineTensor({6, 1}, DataType::Float, "x");
  x->setDeviceMesh(DeviceMesh({0, 1, 2, 3}));
  x->split(0, 4)->parallelize(0, ParallelType::DIDx);
  EXPECT_EQ(x->loop()[0]->extent(), Extent(4));
  EXPECT_EQ(x->loop()[1]->extent(), Extent(2));
  std::vector<std::vector<int64_t>> shapes;
  for (int64_t r = 0; r < 4; ++r) shapes.push_back(localShape(x, {}, r));
  EXPECT_EQ(shapes, (std::vector<std::vector<int64_t>>{{2, 1}, {2, 1}, {2, 1}, {0, 1}}));
}

// A size-1 dim is a dim like any other to a schedule (a definition's 1 is a broadcast dim: one
// elementwise ops may expand): one device shards it.
TEST(Split, ASizeOneDimSplitsByOne) {
  Fusion f;
  TensorView* x = f.defineTensor({1, 4}, DataType::Float, "x");
  ASSERT_TRUE(x->logical()[0]->isBroadcast());
  x->setDeviceMesh(DeviceMesh({0}));
  x->split(0, 1)->parallelize(0, ParallelType::DIDx);
  EXPECT_EQ(placementsOf(x), std::vector<Placement>{Placement::shard(0)});
  EXPECT_EQ(x->loop()[0]->iterType(), IterType::Broadcast) << "its parts are size-1 dims too";
}

TEST(Merge, MergesAdjacentAxes) {
  Fusion f;
  TensorView* x = f.defineTensor({8, 12, 5}, DataType::Float, "x");
  EXPECT_EQ(x->merge(0), x);
  EXPECT_EQ(extents(x->loop()), (Strs{"96", "5"}));
  const IdTransform* t = x->loop()[0]->definition();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->kind, IdTransform::Merge);
  EXPECT_EQ(t->inputs, (std::vector<IterDomain*>{x->logical()[0], x->logical()[1]}));
  x->merge(-2);
  EXPECT_EQ(extents(x->loop()), (Strs{"480"}));
  EXPECT_EQ(x->schedule()[1], (ScheduleStep{ScheduleStep::Merge, 0, 0, false, ParallelType::Serial}));
  EXPECT_THAT(userErrorMessage(ErrorKind::Value, [&] { x->merge(0); }),
              HasSubstr("merge of %x axis 0: there is no axis 1 to merge with"));
}

TEST(Merge, SplitThenMergeRestoresASymbolicExtent) {
  Fusion f;
  TensorView* x = f.defineTensor({Extent::symbolic("t"), 64}, DataType::Float, "x");
  x->split(0, 4)->merge(0);
  EXPECT_EQ(x->loop()[0]->extent(), Extent::symbolic("t"));
  x->merge(0);
  EXPECT_EQ(extents(x->loop()), (Strs{"?t*64"}));
  TensorView* y = f.defineTensor({Extent::symbolic("a"), Extent::symbolic("b")}, DataType::Float, "y");
  EXPECT_THAT(userErrorMessage(ErrorKind::Unsupported, [&] { y->merge(0); }),
              HasSubstr("the product of two symbolic sizes ?a and ?b is not supported"));
}

TEST(Merge, ReductionAndIterationDoNotMix) {
  Fusion f;
  TensorView* x = f.defineTensor({4, 8, 16}, DataType::Float, "x");
  TensorView* s = f.apply(OpKind::Sum, {x}, {{"dims", std::vector<int64_t>{1, 2}}});
  EXPECT_THAT(userErrorMessage(ErrorKind::Value, [&] { s->merge(0); }),
              HasSubstr("cannot merge a reduction with an iteration dim"));
  s->merge(1);
  EXPECT_EQ(extents(s->loop()), (Strs{"4", "r128"}));
}

TEST(Parallelize, SetsTheParallelTypeOfALoopAxis) {
  Fusion f;
  TensorView* x = f.defineTensor({8, 12}, DataType::Float, "x");
  x->split(0, 4)->parallelize(0, ParallelType::DIDx);
  EXPECT_EQ(x->loop()[0]->parallelType(), ParallelType::DIDx);
  EXPECT_TRUE(x->loop()[0]->isDeviceDim());
  EXPECT_EQ(x->loop()[0]->toString(), "DIDx{4}");
  EXPECT_EQ(x->loop()[1]->parallelType(), ParallelType::Serial);
  x->split(2, 3)->parallelize(2, ParallelType::Stream);
  EXPECT_EQ(x->loop()[2]->toString(), "Stream{3}");
  EXPECT_FALSE(x->loop()[2]->isDeviceDim());
  EXPECT_EQ(x->schedule().back(), (ScheduleStep{ScheduleStep::Parallelize, 2, 0, false, ParallelType::Stream}));
  EXPECT_THAT(userErrorMessage(ErrorKind::Placement, [&] { x->parallelize(1, ParallelType::DIDx); }),
              HasSubstr("parallelize of %x axis 1 on DIDx: axis 0 is already DIDx"));
}

TEST(Parallelize, DidExtentMustMatchTheMeshAxis) {
  Fusion f;
  TensorView* x = f.defineTensor({8, 12}, DataType::Float, "x");
  x->setDeviceMesh(DeviceMesh({0, 1, 2, 3}, {2, 2}));
  x->split(1, 3);
  EXPECT_THAT(userErrorMessage(ErrorKind::Placement, [&] { x->parallelize(1, ParallelType::DIDx); }),
              HasSubstr("the axis has extent 3 but mesh axis 1 of [[0, 1], [2, 3]] has 2 devices"));
  x->split(0, 2)->parallelize(0, ParallelType::DIDy);
  EXPECT_EQ(x->loopAxisOf(ParallelType::DIDy), 0);
  EXPECT_THAT(userErrorMessage(ErrorKind::Placement, [&] { x->parallelize(1, ParallelType::DIDz); }),
              HasSubstr("DIDz is beyond the axes of rank-2 mesh [[0, 1], [2, 3]]"));
}

TEST(LoopAxisOf, FindsTheAxisOfAParallelType) {
  Fusion f;
  TensorView* x = f.defineTensor({8, 12}, DataType::Float, "x");
  EXPECT_EQ(x->loopAxisOf(ParallelType::DIDx), -1);
  x->split(1, 2)->parallelize(1, ParallelType::DIDx);
  x->split(0, 2)->parallelize(0, ParallelType::DIDy);
  EXPECT_EQ(x->loopAxisOf(ParallelType::DIDy), 0);
  EXPECT_EQ(x->loopAxisOf(ParallelType::DIDx), 2);
  EXPECT_EQ(x->loopAxisOf(ParallelType::DIDz), -1);
  EXPECT_EQ(x->loopAxisOf(ParallelType::Serial), 1);
}

TEST(LogicalAxisOf, FollowsSplitsBackAndStopsAtMerges) {
  Fusion f;
  TensorView* x = f.defineTensor({4, 8, 12}, DataType::Float, "x");
  TensorView* s = f.apply(OpKind::Sum, {x}, {{"dims", std::vector<int64_t>{0}}});
  // s: logical [r4, 8, 12]
  s->split(2, 3)->split(3, 2, /*inner_split=*/true);
  EXPECT_EQ(extents(s->loop()), (Strs{"r4", "8", "3", "2", "2"}));
  EXPECT_EQ(s->logicalAxisOf(0), 0) << "indices count reduction dims of the logical domain";
  EXPECT_EQ(s->logicalAxisOf(1), 1);
  EXPECT_EQ(s->logicalAxisOf(2), 2);
  EXPECT_EQ(s->logicalAxisOf(3), 2);
  EXPECT_EQ(s->logicalAxisOf(4), 2);
  s->merge(1);  // 8 * 3
  EXPECT_EQ(s->logicalAxisOf(1), -1);
  EXPECT_EQ(s->logicalAxisOf(2), 2);
}

TEST(ResetSchedule, GoesBackToTheLogicalDomain) {
  Fusion f;
  TensorView* x = f.defineTensor({8, 12}, DataType::Float, "x");
  x->split(0, 2)->parallelize(0, ParallelType::DIDx)->merge(1)->parallelize(1, ParallelType::Stream);
  x->resetSchedule();
  EXPECT_EQ(x->loop(), x->logical());
  EXPECT_TRUE(x->schedule().empty());
  EXPECT_EQ(x->loopAxisOf(ParallelType::DIDx), -1);
  EXPECT_EQ(x->loopAxisOf(ParallelType::Stream), -1);
  for (IterDomain* id : x->logical()) EXPECT_EQ(id->parallelType(), ParallelType::Serial);
  // Scheduling again works from scratch.
  x->split(1, 4);
  EXPECT_EQ(extents(x->loop()), (Strs{"8", "4", "3"}));
}

TEST(ResetSchedule, DropsALogicalParallelization) {
  Fusion f;
  TensorView* x = f.defineTensor({2, 12}, DataType::Float, "x");
  x->parallelize(0, ParallelType::DIDx);
  x->resetSchedule();
  EXPECT_EQ(x->logical()[0]->parallelType(), ParallelType::Serial);
}

TEST(ResetSchedule, DropsTheMesh) {
  // fusion.h/val.h: "Drops the loop schedule (back to the logical domain) and the mesh".
  Fusion f;
  TensorView* x = f.defineTensor({8}, DataType::Float, "x");
  x->setDeviceMesh(DeviceMesh({0, 1}))->split(0, 2)->parallelize(0, ParallelType::DIDx);
  x->resetSchedule();
  EXPECT_EQ(x->mesh(), nullptr);
  EXPECT_EQ(x->meshIndex(), -1);
}

TEST(SetDeviceMesh, PinsAndInternsMeshesByValue) {
  Fusion f;
  TensorView* x = f.defineTensor({8}, DataType::Float, "x");
  TensorView* y = f.defineTensor({8}, DataType::Float, "y");
  EXPECT_FALSE(x->pinned());
  x->setDeviceMesh(DeviceMesh({0, 1}));
  y->setDeviceMesh(DeviceMesh({0, 1}));
  EXPECT_TRUE(x->pinned());
  EXPECT_EQ(x->meshIndex(), y->meshIndex());
  EXPECT_EQ(f.numMeshes(), 1);
  EXPECT_EQ(*x->mesh(), DeviceMesh({0, 1}));
  EXPECT_EQ(f.meshName(x->meshIndex()), "m0");
  EXPECT_EQ(f.addMesh(DeviceMesh({0, 1}, {2, 1}), "tp"), 1) << "a different shape is a different mesh";
  EXPECT_EQ(f.meshName(1), "tp");
}

TEST(ApplyStep, ReplayingARecordedScheduleReproducesTheLoopDomain) {
  Fusion f;
  TensorView* x = f.defineTensor({Extent::symbolic("t"), 16, 6}, DataType::Float, "x");
  x->split(0, 4)->parallelize(0, ParallelType::DIDx)->split(2, 4, true)->merge(3)->parallelize(1, ParallelType::Stream);
  TensorView* y = f.defineTensor({Extent::symbolic("t"), 16, 6}, DataType::Float, "y");
  for (const ScheduleStep& s : x->schedule()) y->applyStep(s);
  EXPECT_EQ(y->schedule(), x->schedule());
  ASSERT_EQ(y->loop().size(), x->loop().size());
  for (size_t i = 0; i < x->loop().size(); ++i) EXPECT_EQ(y->loop()[i]->toString(), x->loop()[i]->toString());
  EXPECT_EQ(extents(y->loop()), (Strs{"4", "?t/4", "4", "24"}));
}

}  // namespace
}  // namespace meshfuse
