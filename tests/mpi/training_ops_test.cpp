// The training ops sharded over every rank (1, 2, 4) against one device: embedding with its table
// vocab-parallel (rows), hidden-parallel (columns) or replicated under batch-sharded indices;
// cross_entropy with batch-sharded logits ("mean": a sum over a count, "sum") and vocab-sharded
// logits (gathered); the scatter-add of embedding_backward under a sharded batch.
#include "meshfuse/ops.h"
#include "mpi_test_main.h"

namespace meshfuse::testing {
namespace {

using ::testing::IsEmpty;
using Strs = std::vector<std::string>;

Strs expect(Strs kinds) { return worldSize() > 1 ? kinds : Strs{}; }

std::vector<std::pair<DeviceMesh, Ps>> layouts(std::initializer_list<Ps> per_input) {
  std::vector<std::pair<DeviceMesh, Ps>> out;
  for (const Ps& p : per_input) out.emplace_back(worldMesh(), p);
  return out;
}

// Class or row indices from runSharded's random i64 inputs (in [-8, 8)): abs gives [0, 8], so a
// table or class count of 8 sees a few out-of-range 8s and a count of 9 none.
TensorView* indices(Fusion& f, std::vector<Extent> shape, const char* name) {
  return ops::abs(f.defineTensor(shape, DataType::Int64, name));
}

TEST(TrainingOps, VocabParallelEmbeddingIsOneAllreduce) {
  Fusion f;
  TensorView* w = f.defineTensor({8, 6}, DataType::Float, "w");
  f.addOutput(ops::embedding(w, indices(f, {4, 5}, "i")));
  ShardedRun run = runSharded(f, layouts({{S(0)}, {R}}));
  expectMatchesReference(run);
  EXPECT_EQ(kinds(run.collectives), expect({"allreduce"}));
}

TEST(TrainingOps, HiddenParallelAndBatchShardedEmbeddingsAreLocal) {
  Fusion f;
  TensorView* w = f.defineTensor({8, 8}, DataType::Float, "w");
  TensorView* y = ops::embedding(w, indices(f, {4, 5}, "i"));
  f.addOutput(y);
  ShardedRun hidden = runSharded(f, layouts({{S(1)}, {R}}));
  expectMatchesReference(hidden);
  EXPECT_THAT(hidden.collectives, IsEmpty());
  ShardedRun batch = runSharded(f, layouts({{R}, {S(0)}}));
  expectMatchesReference(batch);
  EXPECT_THAT(batch.collectives, IsEmpty());
}

TEST(TrainingOps, DataParallelCrossEntropy) {
  for (const char* reduction : {"mean", "sum"}) {
    SCOPED_TRACE(reduction);
    Fusion f;
    TensorView* x = f.defineTensor({8, 9}, DataType::Float, "x");
    // ignore_index 0: shards count different numbers of targets; the mean is the global one.
    f.addOutput(ops::crossEntropy(x, indices(f, {8}, "t"), 0, reduction));
    ShardedRun run = runSharded(f, layouts({{S(0)}, {S(0)}}));
    expectMatchesReference(run);
    EXPECT_EQ(kinds(run.collectives),
              expect(std::string(reduction) == "mean" ? Strs{"allreduce", "allreduce"} : Strs{"allreduce"}));
  }
}

TEST(TrainingOps, VocabShardedLogitsAreGathered) {
  Fusion f;
  TensorView* x = f.defineTensor({4, 8}, DataType::Float, "x");
  f.addOutput(ops::crossEntropy(x, indices(f, {4}, "t"), -100, "none"));
  ShardedRun run = runSharded(f, layouts({{S(1)}, {R}}));
  expectMatchesReference(run);
  EXPECT_EQ(kinds(run.collectives), expect({"allgather"}));
}

TEST(TrainingOps, LogSoftmaxAndOneHotShardOnTheBatch) {
  Fusion f;
  TensorView* x = f.defineTensor({8, 5}, DataType::Float, "x");
  TensorView* oh = ops::cast(ops::oneHot(indices(f, {8}, "t"), 5), DataType::Float);
  f.addOutput(ops::mul(ops::logSoftmax(x, 1), oh));
  ShardedRun run = runSharded(f, layouts({{S(0)}, {S(0)}}));
  expectMatchesReference(run);
  EXPECT_THAT(run.collectives, IsEmpty());
}

TEST(TrainingOps, EmbeddingBackwardOfAShardedBatchIsAPendingSum) {
  Fusion f;
  TensorView* g = f.defineTensor({8, 3, 6}, DataType::Float, "g");
  f.addOutput(ops::embeddingBackward(g, indices(f, {8, 3}, "i"), 8));
  ShardedRun run = runSharded(f, layouts({{S(0)}, {S(0)}}));
  expectMatchesReference(run);
  EXPECT_EQ(kinds(run.collectives), expect({"allreduce"}));
}

}  // namespace
}  // namespace meshfuse::testing
