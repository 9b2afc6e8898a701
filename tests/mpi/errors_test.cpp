// Bad input to a multi-rank run: a typed error with a clear message on every rank, never a hang.
#include "meshfuse/ir/parser.h"
#include "meshfuse/ops.h"
#include "models.h"
#include "mpi_test_main.h"

namespace meshfuse::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::vector<ShardedTensor> mlpInputs(const DeviceMesh& mesh, int64_t t) {
  return {{Tensor(DataType::Float, {t, 16}), mesh, {R}},
          {Tensor(DataType::Float, {64 / mesh.size(), 16}), mesh, {S(0)}},
          {Tensor(DataType::Float, {16, 64 / mesh.size()}), mesh, {S(1)}}};
}

TEST(Errors, MeshLargerThanTheWorld) {
  Fusion f;
  models::buildMlp(f, 16);
  std::vector<int64_t> ids(worldSize() * 2);
  std::iota(ids.begin(), ids.end(), 0);
  MultiDeviceExecutor exec(cloneFusion(f), world());
  EXPECT_THAT(errorOf(ErrorKind::Mesh, [&] { exec.run(mlpInputs(DeviceMesh(ids), 4)); }),
              AllOf(HasSubstr(fmt::format("the world has {} ranks", worldSize())),
                    HasSubstr(fmt::format("mpirun -np {}", 2 * worldSize()))));
}

TEST(Errors, WrongNumberOfPlacements) {
  Fusion f;
  models::buildMlp(f, 16);
  MultiDeviceExecutor exec(cloneFusion(f), world());
  std::vector<ShardedTensor> in = mlpInputs(worldMesh(), 4);
  in[1].placements = {S(0), R};
  EXPECT_THAT(errorOf(ErrorKind::Placement, [&] { exec.run(in); }),
              HasSubstr("input 1: %up_w: got 2 placements [Shard(0), Replicate()] for a rank-1 mesh"));
}

TEST(Errors, WrongNumberOfInputs) {
  Fusion f;
  models::buildMlp(f, 16);
  MultiDeviceExecutor exec(cloneFusion(f), world());
  std::vector<ShardedTensor> in = mlpInputs(worldMesh(), 4);
  in.pop_back();
  EXPECT_THAT(errorOf(ErrorKind::Value, [&] { exec.run(in); }),
              HasSubstr("the fusion takes 3 inputs but 2 were given"));
}

TEST(Errors, UnevenShardIsRejectedClearly) {
  if (worldSize() == 1) GTEST_SKIP() << "every size divides into one shard";
  Fusion f;
  f.addOutput(ops::neg(f.defineTensor({worldSize() + 1, 4}, DataType::Float, "x")));
  MultiDeviceExecutor exec(cloneFusion(f), world());
  std::vector<ShardedTensor> in = {{Tensor(DataType::Float, {1, 4}), worldMesh(), {S(0)}}};
  EXPECT_THAT(errorOf(ErrorKind::Unsupported, [&] { exec.run(in); }),
              HasSubstr(fmt::format("uneven sharding not supported: %x dim 0 has size {}", worldSize() + 1)));
}

// A symbolic size has no static extent to check against: the global shape a caller gives
// (distributeTensor, DTensors) is what tells an uneven split, on every rank alike.
TEST(Errors, UnevenShardOfASymbolicSizeIsRejectedClearly) {
  if (worldSize() == 1) GTEST_SKIP() << "every size divides into one shard";
  Fusion f;
  f.addOutput(ops::neg(f.defineTensor({-1, 4}, DataType::Float, "x")));
  MultiDeviceExecutor exec(cloneFusion(f), world());
  const int64_t rows = 2 * worldSize() + 1;  // torch.chunk would give rank 0 three rows
  std::vector<ShardedTensor> in = {
      {Tensor(DataType::Float, {worldRank() == 0 ? int64_t{3} : int64_t{2}, 4}), worldMesh(), {S(0)}, {rows, 4}}};
  EXPECT_THAT(errorOf(ErrorKind::Unsupported, [&] { exec.run(in); }),
              HasSubstr(fmt::format("uneven sharding not supported: input 0 (%x) dim 0 has size {} which does not "
                                    "divide into {} shards",
                                    rows, worldSize())));
}

TEST(Errors, BlockThatDoesNotMatchTheGivenGlobalShape) {
  if (worldSize() == 1) GTEST_SKIP() << "one shard is the whole tensor";
  Fusion f;
  f.addOutput(ops::neg(f.defineTensor({-1, 4}, DataType::Float, "x")));
  MultiDeviceExecutor exec(cloneFusion(f), world());
  std::vector<ShardedTensor> in = {{Tensor(DataType::Float, {3, 4}), worldMesh(), {S(0)}, {2 * worldSize(), 4}}};
  EXPECT_THAT(errorOf(ErrorKind::Shape, [&] { exec.run(in); }),
              HasSubstr(fmt::format("input 0 (%x): the local tensor has shape [3, 4] but the global shape [{}, 4] in "
                                    "{} shards along dim 0 gives 2 there",
                                    2 * worldSize(), worldSize())));
}

TEST(Errors, LocalShapeThatDoesNotMatchThePlacement) {
  Fusion f;
  models::buildMlp(f, 16);
  MultiDeviceExecutor exec(cloneFusion(f), world());
  std::vector<ShardedTensor> in = mlpInputs(worldMesh(), 4);
  in[1].local = Tensor(DataType::Float, {64, 16});  // the full weight, not this rank's shard
  if (worldSize() == 1) GTEST_SKIP() << "the full weight is the shard";
  EXPECT_THAT(errorOf(ErrorKind::Shape, [&] { exec.run(in); }),
              AllOf(HasSubstr("input 1 (%up_w): dim 0 must be 64 globally"), HasSubstr("[64, 16]")));
}

TEST(Errors, WrongDtype) {
  Fusion f;
  models::buildMlp(f, 16);
  MultiDeviceExecutor exec(cloneFusion(f), world());
  std::vector<ShardedTensor> in = mlpInputs(worldMesh(), 4);
  in[0].local = Tensor(DataType::BFloat16, {4, 16});
  EXPECT_THAT(errorOf(ErrorKind::Dtype, [&] { exec.run(in); }),
              HasSubstr("input 0 (%inp): expected dtype f32 but got bf16"));
}

}  // namespace
}  // namespace meshfuse::testing
