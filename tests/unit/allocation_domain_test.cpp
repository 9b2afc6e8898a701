// TensorView::allocation(): the logical domain with exactly the splits that lead to DID axes
// applied (DID-split dims are allocated at their local extent), Stream splits left out (the whole
// batch stays allocated while the loop walks its microbatches), reduction/Partial dims kept.
#include <gtest/gtest.h>

#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/ir/placement.h"
#include "test_helpers.h"

namespace meshfuse {
namespace {

using Strings = std::vector<std::string>;

// "DIDx{4}", "Stream{4}", "?t/4", "r2" ...
Strings describe(const std::vector<IterDomain*>& ids) {
  Strings out;
  for (const IterDomain* id : ids) {
    std::string e = (id->isReduction() ? "r" : "") + id->extent().toString();
    bool parallel = id->parallelType() != ParallelType::Serial;
    out.push_back(parallel ? fmt::format("{}{{{}}}", parallelTypeName(id->parallelType()), e) : e);
  }
  return out;
}

Strings text(const std::vector<Extent>& extents) {
  Strings out;
  for (const Extent& e : extents) out.push_back(e.toString());
  return out;
}

TensorView* input(Fusion& f, std::vector<Extent> shape) { return f.defineTensor(shape, DataType::Float, "x"); }

TEST(AllocationDomain, UnscheduledIsTheLogicalDomain) {
  Fusion f;
  TensorView* x = input(f, {Extent::symbolic("t"), 64});
  EXPECT_EQ(x->allocation(), x->logical());
  EXPECT_EQ(text(x->allocatedShape()), (Strings{"?t", "64"}));
}

TEST(AllocationDomain, ShardOnAOneDimensionalMesh) {
  Fusion f;
  TensorView* x = input(f, {Extent::symbolic("t"), 64});
  applyPlacements(x, DeviceMesh({0, 1, 2, 3}), {Placement::shard(1)});
  EXPECT_EQ(describe(x->allocation()), (Strings{"?t", "DIDx{4}", "16"}));
  EXPECT_EQ(text(x->allocatedShape()), (Strings{"?t", "16"}));
}

TEST(AllocationDomain, ShardsOnATwoDimensionalMesh) {
  DeviceMesh grid({0, 1, 2, 3}, {2, 2});  // axis 0 is DIDy, axis 1 DIDx
  Fusion f;
  TensorView* x = input(f, {Extent::symbolic("t"), 64});
  applyPlacements(x, grid, {Placement::shard(0), Placement::shard(1)});
  EXPECT_EQ(describe(x->allocation()), (Strings{"DIDy{2}", "?t/2", "DIDx{2}", "32"}));
  EXPECT_EQ(text(x->allocatedShape()), (Strings{"?t/2", "32"}));
  // Both mesh axes on one dim: nested splits, the remainder is a quarter.
  TensorView* y = f.defineTensor({8, 64}, DataType::Float, "y");
  applyPlacements(y, grid, {Placement::shard(1), Placement::shard(1)});
  EXPECT_EQ(describe(y->allocation()), (Strings{"8", "DIDy{2}", "DIDx{2}", "16"}));
  EXPECT_EQ(text(y->allocatedShape()), (Strings{"8", "16"}));
  // Replicated on one axis: only the other axis splits.
  TensorView* z = f.defineTensor({8, 64}, DataType::Float, "z");
  applyPlacements(z, grid, {Placement::replicate(), Placement::shard(0)});
  EXPECT_EQ(describe(z->allocation()), (Strings{"DIDx{2}", "4", "64"}));
}

TEST(AllocationDomain, AStreamSplitIsOnlyInTheLoopDomain) {
  std::unique_ptr<Fusion> f = parseFusion(R"(fusion {
  mesh @m = [0, 1]
  %x = input f32[?t, 64] @m {split(0, 2), parallelize(0, DIDx), split(1, 4), parallelize(1, Stream)}
  %y = input f32[?t, 64] @m {split(0, 4), parallelize(0, Stream)}
  output %x, %y
}
)");
  TensorView* x = f->findTensor("%x");
  EXPECT_EQ(describe(x->loop()), (Strings{"DIDx{2}", "Stream{4}", "?t/8", "64"}));
  EXPECT_EQ(describe(x->allocation()), (Strings{"DIDx{2}", "?t/2", "64"}));
  EXPECT_EQ(text(x->allocatedShape()), (Strings{"?t/2", "64"}));
  TensorView* y = f->findTensor("%y");
  EXPECT_EQ(y->allocation(), y->logical()) << "microbatches of a replicated tensor: all of it stays allocated";
  // A DID split nested inside a Stream split needs the Stream split to say which part is whose;
  // each device still allocates half of the dim.
  std::unique_ptr<Fusion> g = parseFusion(R"(fusion {
  mesh @m = [0, 1]
  %z = input f32[?t, 64] @m {split(0, 4), parallelize(0, Stream), split(1, 2), parallelize(1, DIDx)}
  output %z
}
)");
  TensorView* z = g->findTensor("%z");
  EXPECT_EQ(describe(z->allocation()), (Strings{"Stream{4}", "DIDx{2}", "?t/8", "64"}));
  EXPECT_EQ(text(z->allocatedShape()), (Strings{"?t/2", "64"}));
}

TEST(AllocationDomain, PartialDimsAreNotAllocated) {
  std::unique_ptr<Fusion> f = parseFusion(R"(fusion {
  mesh @m = [0, 1]
  %p = input f32[?t, 64, r2] @m {parallelize(2, DIDx)}
  %x = input f32[?t, 64] @m {split(1, 2), parallelize(1, DIDx)}
  %w = input f32[32, 64] @m {split(1, 2), parallelize(1, DIDx)}
  %y = linear(%x, %w) : f32[?t, 32, r64] @m {split(2, 2), parallelize(2, DIDx)}
  output %p, %y
}
)");
  TensorView* p = f->findTensor("%p");
  EXPECT_EQ(describe(p->allocation()), (Strings{"?t", "64", "DIDx{r2}"}));
  EXPECT_EQ(text(p->allocatedShape()), (Strings{"?t", "64"}));
  // Partial from a sharded contraction: the reduction dim is split across devices.
  TensorView* y = f->findTensor("%y");
  EXPECT_EQ(placementsOf(y), (std::vector<Placement>{Placement::partial()}));
  EXPECT_EQ(describe(y->allocation()), (Strings{"?t", "32", "DIDx{r2}", "r32"}));
  EXPECT_EQ(text(y->allocatedShape()), (Strings{"?t", "32"}));
}

TEST(AllocationDomain, AllocatedShapeIsTheLocalShape) {
  Fusion f;
  DeviceMesh grid({0, 1, 2, 3, 4, 5}, {3, 2});
  TensorView* x = input(f, {Extent::symbolic("t"), 12, 10});
  applyPlacements(x, grid, {Placement::shard(1), Placement::shard(2)});
  const SymbolBindings b = {{"t", 5}};
  std::vector<int64_t> evaluated;
  for (const Extent& e : x->allocatedShape()) evaluated.push_back(e.evaluate(b));
  EXPECT_EQ(evaluated, localShape(x, b, 0));
  EXPECT_EQ(evaluated, (std::vector<int64_t>{5, 4, 5}));
}

}  // namespace
}  // namespace meshfuse
