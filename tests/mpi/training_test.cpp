// Sharded training (TrainingExecutor) on every world size the suite runs: data parallelism
// (batch Shard(0), weights replicated) and Megatron tensor parallelism (w1 Shard(0), w2 Shard(1))
// give the same losses and weights, step by step, as training the definition on one device.
#include <algorithm>
#include <cmath>

#include "meshfuse/ops.h"
#include "meshfuse/training_executor.h"
#include "mpi_test_main.h"

namespace meshfuse::testing {
namespace {

// loss = mean((gelu(x w1^T + b1) w2^T - y)^2)
std::unique_ptr<Fusion> mlpLoss() {
  auto f = std::make_unique<Fusion>();
  TensorView* x = f->defineTensor({8, 8}, DataType::Float, "x");
  TensorView* y = f->defineTensor({8, 8}, DataType::Float, "y");
  TensorView* w1 = f->defineTensor({16, 8}, DataType::Float, "w1");
  TensorView* b1 = f->defineTensor({16}, DataType::Float, "b1");
  TensorView* w2 = f->defineTensor({8, 16}, DataType::Float, "w2");
  TensorView* err = ops::sub(ops::linear(ops::gelu(ops::linear(x, w1, b1), "tanh"), w2), y);
  f->addOutput(ops::mean(ops::mul(err, err), {0, 1}));
  return f;
}

// Trains `steps` steps sharded by `placements` and on one device (a self communicator) from the
// same data; compares every loss and, at the end, this rank's blocks of the weights. Returns the
// collectives of the last sharded step.
std::vector<PhaseCollective> trainBoth(const std::vector<Ps>& placements, const OptimizerConfig& opt, int steps) {
  std::vector<Tensor> full;
  std::vector<std::vector<int64_t>> shapes = {{8, 8}, {8, 8}, {16, 8}, {16}, {8, 16}};
  for (size_t i = 0; i < shapes.size(); ++i) full.push_back(Tensor::random(DataType::Float, shapes[i], 10 + i));
  std::vector<ShardedTensor> sharded, single;
  for (size_t i = 0; i < full.size(); ++i) {
    sharded.push_back(distributeTensor(full[i], worldMesh(), placements[i], worldRank()));
    single.push_back({full[i].clone(), DeviceMesh({0}), {R}});
  }
  const std::vector<int64_t> params = {2, 3, 4};
  TrainingExecutor trainer(mlpLoss(), 0, params, opt, world());
  std::unique_ptr<Communicator> self = makeSelfCommunicator();
  TrainingExecutor twin(mlpLoss(), 0, params, opt, *self);
  for (int s = 0; s < steps; ++s) {
    double loss = trainer.step(sharded), ref = twin.step(single);
    EXPECT_NEAR(loss, ref, 1e-5 * std::max(1.0, std::fabs(ref))) << "step " << s;
  }
  for (int64_t p : params) {  // this rank's block of the single-device weights
    ShardedTensor expected = distributeTensor(single[p].local, worldMesh(), placements[p], worldRank());
    for (int64_t i = 0; i < expected.local.numel(); ++i)
      EXPECT_NEAR(sharded[p].local.get(i), expected.local.get(i), 1e-5) << "parameter " << p << " element " << i;
  }
  return trainer.lastCollectives();
}

int64_t countOf(const std::vector<PhaseCollective>& cs, const std::string& phase, CommKind kind) {
  return std::count_if(cs.begin(), cs.end(),
                       [&](const PhaseCollective& c) { return c.phase == phase && c.info.kind == kind; });
}

TEST(Training, DataParallelAdamWMatchesOneDevice) {
  std::vector<PhaseCollective> cs =
      trainBoth({{S(0)}, {S(0)}, {R}, {R}, {R}}, AdamWOptions{.lr = 0.01, .weight_decay = 0.1}, 4);
  if (worldSize() > 1) {  // one allreduce per weight gradient; the optimizer communicates nothing
    EXPECT_EQ(countOf(cs, "backward", CommKind::Allreduce), 3);
    EXPECT_EQ(countOf(cs, "optimizer", CommKind::Allreduce), 0);
  }
}

TEST(Training, MegatronTensorParallelSgdMatchesOneDevice) {
  std::vector<PhaseCollective> cs =
      trainBoth({{R}, {R}, {S(0)}, {S(0)}, {S(1)}}, SgdOptions{.lr = 0.05, .momentum = 0.9, .nesterov = true}, 4);
  for (const PhaseCollective& c : cs) EXPECT_NE(c.phase, "optimizer") << "state is placed like its parameter";
}

}  // namespace
}  // namespace meshfuse::testing
