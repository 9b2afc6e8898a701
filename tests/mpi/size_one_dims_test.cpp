// Size-1 dims (issue 14): a size-1 dim is sharded by a mesh axis of one device like any other
// dim, and a size-1 dim a reshape inserts or removes leaves the shard on the dim it was on.
// Numerics against single-device execution, the exact collectives and the static report, on 1,
// 2 and 4 ranks.
#include "meshfuse/ops.h"
#include "mpi_test_main.h"

namespace meshfuse::testing {
namespace {

using ::testing::IsEmpty;

std::vector<std::pair<DeviceMesh, Ps>> layouts(std::initializer_list<Ps> per_input) {
  std::vector<std::pair<DeviceMesh, Ps>> out;
  for (const Ps& p : per_input) out.emplace_back(worldMesh(), p);
  return out;
}

// A [1, n] mesh: axis 0 (DIDy) has one device, axis 1 (DIDx) every rank.
DeviceMesh flatMesh() { return DeviceMesh(worldMesh().devices(), {1, worldSize()}); }

TEST(SizeOneDims, DistributeTensorShardsASizeOneDimOnOneDevice) {
  Tensor full = Tensor::random(DataType::Float, {1, 4}, 7);
  ShardedTensor s = distributeTensor(full, DeviceMesh({0}), {S(0)}, worldRank());
  EXPECT_EQ(s.placements, Ps{S(0)});
  if (worldRank() == 0) {
    ASSERT_TRUE(s.local.defined());
    EXPECT_EQ(s.local.shape(), (std::vector<int64_t>{1, 4}));
  } else {
    EXPECT_FALSE(s.local.defined()) << "a rank outside the mesh holds nothing";
  }
  // Over several devices one row is an uneven shard (torch.chunk): rank 0 holds it, the others
  // an empty block.
  ShardedTensor w = distributeTensor(full, worldMesh(), {S(0)}, worldRank());
  EXPECT_EQ(w.local.shape(), (std::vector<int64_t>{worldRank() == 0 ? 1 : 0, 4}));
}

// x [1, 16] sharded on both axes of a [1, n] mesh (its size-1 dim on the one-device axis), z
// [8, 16] sharded on axis 1: an elementwise op keeps x's shard, and one that expands x's size-1
// dim against z's 8 rows needs it whole on axis 0, which is where it is: no collective.
TEST(SizeOneDims, ASizeOneDimShardedOnAOneDeviceMeshAxis) {
  Fusion f;
  TensorView* x = f.defineTensor({1, 16}, DataType::Float, "x");
  TensorView* z = f.defineTensor({8, 16}, DataType::Float, "z");
  f.addOutput(ops::exp(x));
  f.addOutput(ops::add(x, z));
  const DeviceMesh mesh = flatMesh();
  ShardedRun run = runSharded(f, {{mesh, {S(0), S(1)}}, {mesh, {R, S(1)}}});
  expectMatchesReference(run);
  expectSameCollectives(run.reported, run.collectives);
  EXPECT_THAT(run.collectives, IsEmpty());
  EXPECT_EQ(run.local_outputs[0].placements, (Ps{S(0), S(1)}));
  EXPECT_EQ(run.local_outputs[1].placements, (Ps{R, S(1)}));
}

// x [16, 8] Shard(0) through reshapes that insert and remove size-1 dims, before and after the
// sharded dim, and split and merge dims: no collective, the shard follows the 16 rows.
TEST(SizeOneDims, ReshapesThatInsertOrRemoveSizeOneDimsKeepTheShard) {
  Fusion f;
  TensorView* x = f.defineTensor({16, 8}, DataType::Float, "x");
  TensorView* front = ops::reshape(x, {1, 16, 8});  // [4D, 8] -> [1, 4D, 8]: Shard(1)
  TensorView* y = ops::exp(front);
  TensorView* back = ops::reshape(y, {16, 8});  // and back: Shard(0)
  TensorView* after = ops::reshape(back, {16, 1, 8});
  TensorView* split = ops::reshape(after, {4, 4, 1, 8});  // 16 -> 4 x 4: the outer 4 sharded
  TensorView* merged = ops::reshape(split, {1, 128});
  f.addOutput(front);
  f.addOutput(back);
  f.addOutput(merged);
  ShardedRun run = runSharded(f, layouts({{S(0)}}));
  expectMatchesReference(run);
  expectSameCollectives(run.reported, run.collectives);
  EXPECT_THAT(run.collectives, IsEmpty());
  EXPECT_EQ(run.local_outputs[0].placements, Ps{S(1)});
  EXPECT_EQ(run.local_outputs[1].placements, Ps{S(0)});
  EXPECT_EQ(run.local_outputs[2].placements, Ps{S(1)});
}

// Megatron's heads: [s, nh * hd] sharded on the heads -> [s, nh, hd] -> [nh, s, hd] ->
// [1, nh, s, hd] -> sdpa -> back: the heads stay sharded, no collective.
TEST(SizeOneDims, AttentionHeadsWithALeadingOneStaySharded) {
  Fusion f;
  auto heads = [&](const char* name) {
    TensorView* t = f.defineTensor({8, 32}, DataType::Float, name);
    return ops::reshape(ops::permute(ops::reshape(t, {8, 4, 8}), {1, 0, 2}), {1, 4, 8, 8});
  };
  TensorView* q = heads("q");
  TensorView* k = heads("k");
  TensorView* v = heads("v");
  TensorView* a = ops::sdpa(q, k, v, /*is_causal=*/true);
  f.addOutput(ops::reshape(ops::permute(ops::reshape(a, {4, 8, 8}), {1, 0, 2}), {8, 32}));
  ShardedRun run = runSharded(f, layouts({{S(1)}, {S(1)}, {S(1)}}));
  expectMatchesReference(run);
  expectSameCollectives(run.reported, run.collectives);
  EXPECT_THAT(run.collectives, IsEmpty());
  EXPECT_EQ(run.local_outputs[0].placements, Ps{S(1)});
}

}  // namespace
}  // namespace meshfuse::testing
