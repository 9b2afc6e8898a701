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
  MultiDeviceExecutor exec(f.clone(), world());
  EXPECT_THAT(errorOf(ErrorKind::Mesh, [&] { exec.run(mlpInputs(DeviceMesh(ids), 4)); }),
              AllOf(HasSubstr(fmt::format("the world has {} ranks", worldSize())),
                    HasSubstr(fmt::format("mpirun -np {}", 2 * worldSize()))));
}

TEST(Errors, WrongNumberOfPlacements) {
  Fusion f;
  models::buildMlp(f, 16);
  MultiDeviceExecutor exec(f.clone(), world());
  std::vector<ShardedTensor> in = mlpInputs(worldMesh(), 4);
  in[1].placements = {S(0), R};
  EXPECT_THAT(errorOf(ErrorKind::Placement, [&] { exec.run(in); }),
              HasSubstr("input 1: %up_w: got 2 placements [Shard(0), Replicate()] for a rank-1 mesh"));
}

TEST(Errors, WrongNumberOfInputs) {
  Fusion f;
  models::buildMlp(f, 16);
  MultiDeviceExecutor exec(f.clone(), world());
  std::vector<ShardedTensor> in = mlpInputs(worldMesh(), 4);
  in.pop_back();
  EXPECT_THAT(errorOf(ErrorKind::Value, [&] { exec.run(in); }),
              HasSubstr("the fusion takes 3 inputs but 2 were given"));
}

// n + 1 rows over n ranks are torch.chunk's 2, 2, ..., 1, 0 blocks: ranks given one row each,
// without the global shape, all raise the same error (the ranks first agree on what they were
// given, a static size being the definition's), which names the blocks that are not theirs.
MPI_TEST(Errors, BlockThatIsNotTheRanksUnevenBlockOfAStaticSize, atLeast(2, "every size divides into one shard")) {
  Fusion f;
  f.addOutput(ops::neg(f.defineTensor({worldSize() + 1, 4}, DataType::Float, "x")));
  MultiDeviceExecutor exec(f.clone(), world());
  std::vector<ShardedTensor> in = {{Tensor(DataType::Float, {1, 4}), worldMesh(), {S(0)}}};
  EXPECT_THAT(errorOf(ErrorKind::Value, [&] { exec.run(in); }),
              AllOf(HasSubstr(fmt::format("MultiDeviceExecutor: the ranks disagree: input 0 (%x) global shape is [{}, 4]",
                                          worldSize() + 1)),
                    HasSubstr("with local shape [1, 4] (not [2, 4])")));
}

// With the global shape given (distributeTensor, DTensors), uneven blocks are torch.chunk's; one
// rank given another block makes every rank raise the same error (the ranks first agree on what
// they were given), naming that rank's block and the one it should hold.
MPI_TEST(Errors, BlockThatIsNotTheRanksUnevenBlockIsOneErrorOnEveryRank, atLeast(2, "one rank agrees with itself")) {
  Fusion f;
  f.addOutput(ops::neg(f.defineTensor({-1, 4}, DataType::Float, "x")));
  const int64_t rows = 2 * worldSize() + 1, last = worldSize() - 1;
  auto block = [&](int64_t r) { return chunkSpan(rows, worldSize(), r).size; };
  std::vector<ShardedTensor> in = {{Tensor(DataType::Float, {block(worldRank()), 4}), worldMesh(), {S(0)}, {rows, 4}}};
  EXPECT_EQ(MultiDeviceExecutor(f.clone(), world()).run(in).size(), 1u);  // torch.chunk's blocks run
  // (A fresh executor: the ranks agree on a signature the first time they see it.)
  MultiDeviceExecutor exec(f.clone(), world());
  if (worldRank() == last) in[0].local = Tensor(DataType::Float, {block(last) + 1, 4});
  EXPECT_THAT(errorOf(ErrorKind::Value, [&] { exec.run(in); }),
              HasSubstr(fmt::format("input 0 (%x) global shape is [{}, 4] with local shape [{}, 4] (not [{}, 4]) on "
                                    "rank {}",
                                    rows, block(last) + 1, block(last), last)));
}

MPI_TEST(Errors, BlockThatDoesNotMatchTheGivenGlobalShape, atLeast(2, "one shard is the whole tensor")) {
  Fusion f;
  f.addOutput(ops::neg(f.defineTensor({-1, 4}, DataType::Float, "x")));
  MultiDeviceExecutor exec(f.clone(), world());
  std::vector<ShardedTensor> in = {{Tensor(DataType::Float, {3, 4}), worldMesh(), {S(0)}, {2 * worldSize(), 4}}};
  EXPECT_THAT(errorOf(ErrorKind::Shape, [&] { exec.run(in); }),
              HasSubstr(fmt::format("input 0 (%x): the local tensor has shape [3, 4] but the global shape [{}, 4] in "
                                    "{} shards along dim 0 gives 2 there",
                                    2 * worldSize(), worldSize())));
}

MPI_TEST(Errors, LocalShapeThatDoesNotMatchThePlacement, atLeast(2, "the full weight is the shard")) {
  Fusion f;
  models::buildMlp(f, 16);
  MultiDeviceExecutor exec(f.clone(), world());
  std::vector<ShardedTensor> in = mlpInputs(worldMesh(), 4);
  in[1].local = Tensor(DataType::Float, {64, 16});  // the full weight, not this rank's shard
  EXPECT_THAT(errorOf(ErrorKind::Shape, [&] { exec.run(in); }),
              AllOf(HasSubstr("input 1 (%up_w): dim 0 must be 64 globally"), HasSubstr("[64, 16]")));
}

TEST(Errors, WrongDtype) {
  Fusion f;
  models::buildMlp(f, 16);
  MultiDeviceExecutor exec(f.clone(), world());
  std::vector<ShardedTensor> in = mlpInputs(worldMesh(), 4);
  in[0].local = Tensor(DataType::BFloat16, {4, 16});
  EXPECT_THAT(errorOf(ErrorKind::Dtype, [&] { exec.run(in); }),
              HasSubstr("input 0 (%inp): expected dtype f32 but got bf16"));
}

// ---- Inputs that differ across ranks where they must agree (ExecutorOptions::check_inputs) -----

// "LABEL is ODD on rank LAST but USUAL on ranks 0, .., LAST-1": the last rank was given ODD.
std::string disagreement(const std::string& label, const std::string& odd, const std::string& usual) {
  const int64_t last = worldSize() - 1;
  std::vector<int64_t> others(last);
  std::iota(others.begin(), others.end(), 0);
  return fmt::format("MultiDeviceExecutor: the ranks disagree: {} is {} on rank {} but {} on rank{} {}", label, odd,
                     last, usual, others.size() == 1 ? "" : "s", fmt::join(others, ", "));
}

bool lastRank() { return worldRank() == worldSize() - 1; }

MPI_TEST(Errors, DtypeThatDiffersOnOneRank, atLeast(2, "one rank agrees with itself")) {
  Fusion f;
  models::buildMlp(f, 16);
  MultiDeviceExecutor exec(f.clone(), world());
  std::vector<ShardedTensor> in = mlpInputs(worldMesh(), 4);
  if (lastRank()) in[0].local = Tensor(DataType::BFloat16, {4, 16});
  // Every rank, the one given bf16 too, throws this before any collective (without the check the
  // last rank would throw a DtypeError while the others wait in the allreduce until the watchdog).
  EXPECT_EQ(errorOf(ErrorKind::Value, [&] { exec.run(in); }), disagreement("input 0 (%inp) dtype", "bf16", "f32"));
  EXPECT_EQ(exec.run(mlpInputs(worldMesh(), 4)).size(), 1u);  // the executor still works
}

MPI_TEST(Errors, PlacementsThatDifferOnOneRank, atLeast(2, "one rank agrees with itself")) {
  Fusion f;
  models::buildMlp(f, 16);
  MultiDeviceExecutor exec(f.clone(), world());
  std::vector<ShardedTensor> in = mlpInputs(worldMesh(), 4);
  if (lastRank()) in[0] = {Tensor(DataType::Float, {4 / worldSize(), 16}), worldMesh(), {S(0)}};  // global [4, 16]
  const std::string mesh = worldMesh().toString();
  EXPECT_EQ(errorOf(ErrorKind::Value, [&] { exec.run(in); }),
            disagreement("input 0 (%inp) placements", "[Shard(0)] on mesh " + mesh, "[Replicate()] on mesh " + mesh));
}

MPI_TEST(Errors, MeshesThatDifferOnOneRank, atLeast(2, "one rank agrees with itself")) {
  Fusion f;
  models::buildMlp(f, 16);
  MultiDeviceExecutor exec(f.clone(), world());
  std::vector<ShardedTensor> in = mlpInputs(worldMesh(), 4);
  std::vector<int64_t> reversed = worldMesh().devices();
  std::reverse(reversed.begin(), reversed.end());
  if (lastRank()) in[1].mesh = DeviceMesh(reversed);
  EXPECT_EQ(errorOf(ErrorKind::Value, [&] { exec.run(in); }),
            disagreement("input 1 (%up_w) placements", "[Shard(0)] on mesh " + DeviceMesh(reversed).toString(),
                         "[Shard(0)] on mesh " + worldMesh().toString()));
}

MPI_TEST(Errors, GlobalShapesThatDifferOnOneRank, atLeast(2, "one rank agrees with itself")) {
  Fusion f;
  models::buildMlp(f, 16);
  MultiDeviceExecutor exec(f.clone(), world());
  std::vector<ShardedTensor> in = mlpInputs(worldMesh(), lastRank() ? 8 : 4);  // ?t = 8 on the last rank
  EXPECT_EQ(errorOf(ErrorKind::Value, [&] { exec.run(in); }),
            disagreement("input 0 (%inp) global shape", "[8, 16]", "[4, 16]"));
}

// The check runs on the first run of each input signature: ranks that all move on to new inputs
// are checked again. (A rank that alone changes its inputs while the others repeat agreed ones is
// not caught: only it checks, as with Python's check_inputs="first".)
MPI_TEST(Errors, EachNewSignatureIsCheckedAgain, atLeast(2, "one rank agrees with itself")) {
  Fusion f;
  models::buildMlp(f, 16);
  MultiDeviceExecutor exec(f.clone(), world());
  exec.run(mlpInputs(worldMesh(), 4));
  exec.run(mlpInputs(worldMesh(), 4));
  std::vector<ShardedTensor> in = mlpInputs(worldMesh(), 8);
  if (lastRank()) in[2].local = Tensor(DataType::Half, {16, 64 / worldSize()});
  EXPECT_EQ(errorOf(ErrorKind::Value, [&] { exec.run(in); }), disagreement("input 2 (%down_w) dtype", "f16", "f32"));
  EXPECT_EQ(exec.run(mlpInputs(worldMesh(), 8)).size(), 1u);
}

// ---- A tensor larger than the machine's memory -------------------------------------------------

// The outer product of 2^20 rows (sharded) and 2^20 columns: 4 TiB of f32 split over the ranks,
// from 8 MiB of inputs. Refused before anything runs, on every rank, naming the tensor, its dtype,
// shape and bytes (memory.h); nothing that large is ever touched.
TEST(Errors, TensorLargerThanMemory) {
  Fusion f;
  TensorView* a = f.defineTensor({-1, 1}, DataType::Float, "a");
  TensorView* b = f.defineTensor({1, -1}, DataType::Float, "b");
  f.addOutput(ops::relu(ops::matmul(a, b)));
  MultiDeviceExecutor exec(f.clone(), world());
  const int64_t rows = int64_t{1} << 20, cols = int64_t{1} << 20;
  std::vector<ShardedTensor> in = {{Tensor(DataType::Float, {rows, 1}), worldMesh(), {S(0)}},
                                   {Tensor(DataType::Float, {1, cols}), worldMesh(), {R}}};
  std::vector<int64_t> ranks = worldMesh().devices();
  EXPECT_THAT(errorOf(ErrorKind::Runtime, [&] { exec.run(in); }),
              AllOf(::testing::StartsWith(fmt::format(
                        "cannot allocate %0 on rank{} {}, a f32 tensor of shape [{}, {}]: {} bytes (4 TiB), more than "
                        "the ",
                        ranks.size() == 1 ? "" : "s", fmt::join(ranks, ", "), rows, cols, rows * cols * 4)),
                    ::testing::ContainsRegex("of (host memory|memory of GPU)")));
}

}  // namespace
}  // namespace meshfuse::testing
