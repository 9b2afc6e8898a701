// Training through the C++ API: a GELU MLP regressing a fixed random teacher, trained with AdamW
// by TrainingExecutor (forward, backward and the in-place optimizer step).
//   build/train_mlp                    one device
//   mpirun -np 2 build/train_mlp       Megatron tensor parallelism: w1 Shard(0), w2 Shard(1)
// Every rank prints nothing but rank 0, which prints the loss per step; the run fails unless the
// loss fell by 10x. Under mpirun, rank 0 also trains the same model on one device alongside and
// checks that the sharded weights follow it step by step.
#include <cmath>
#include <cstdio>

#include "meshfuse/ir/parser.h"
#include "meshfuse/ir/placement.h"
#include "meshfuse/ops.h"
#include "meshfuse/training_executor.h"

using namespace meshfuse;

namespace {

// loss = mean((gelu(x w1^T) w2^T - y)^2)
std::unique_ptr<Fusion> mlpLoss(int64_t tokens, int64_t hidden, int64_t ffn) {
  auto f = std::make_unique<Fusion>();
  TensorView* x = f->defineTensor({tokens, hidden}, DataType::Float, "x");
  TensorView* y = f->defineTensor({tokens, hidden}, DataType::Float, "y");
  TensorView* w1 = f->defineTensor({ffn, hidden}, DataType::Float, "w1");
  TensorView* w2 = f->defineTensor({hidden, ffn}, DataType::Float, "w2");
  TensorView* err = ops::sub(ops::linear(ops::gelu(ops::linear(x, w1), "tanh"), w2), y);
  TensorView* loss = ops::mean(ops::mul(err, err), {0, 1});
  f->rename(loss, "loss");
  f->addOutput(loss);
  return f;
}

Tensor scaled(Tensor t, double s) {
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, t.get(i) * s);
  return t;
}

}  // namespace

int main() {
  try {
    const int64_t tokens = 32, hidden = 16, ffn = 64, steps = 30;
    std::unique_ptr<Communicator> comm = makeDefaultCommunicator();  // MPI under mpirun
    const int64_t n = comm->size(), r = comm->rank();
    std::vector<int64_t> ranks(n);
    for (int64_t i = 0; i < n; ++i) ranks[i] = i;
    DeviceMesh mesh(ranks);
    // The same data on every rank: inputs, a teacher's targets, the initial weights.
    Tensor x = Tensor::random(DataType::Float, {tokens, hidden}, 0);
    Tensor y = scaled(Tensor::random(DataType::Float, {tokens, hidden}, 1), 0.5);
    Tensor w1 = scaled(Tensor::random(DataType::Float, {ffn, hidden}, 2), 0.25);
    Tensor w2 = scaled(Tensor::random(DataType::Float, {hidden, ffn}, 3), 0.125);
    Tensor w1_ref = w1.clone(), w2_ref = w2.clone();
    AdamWOptions adamw{.lr = 0.01, .weight_decay = 0.0};
    TrainingExecutor trainer(mlpLoss(tokens, hidden, ffn), 0, {2, 3}, adamw, *comm);
    std::vector<ShardedTensor> inputs = {distributeTensor(x, mesh, {Placement::replicate()}, r),
                                         distributeTensor(y, mesh, {Placement::replicate()}, r),
                                         distributeTensor(w1, mesh, {Placement::shard(0)}, r),   // column-parallel
                                         distributeTensor(w2, mesh, {Placement::shard(1)}, r)};  // row-parallel
    // Rank 0's single-device twin (a world of one: its own communicator), when sharded.
    std::unique_ptr<Communicator> self = makeSelfCommunicator();
    std::unique_ptr<TrainingExecutor> twin;
    if (n > 1 && r == 0)
      twin =
          std::make_unique<TrainingExecutor>(mlpLoss(tokens, hidden, ffn), 0, std::vector<int64_t>{2, 3}, adamw, *self);
    double first = 0, last = 0, worst = 0;
    for (int64_t s = 0; s < steps; ++s) {
      last = trainer.step(inputs);  // updates this rank's blocks of w1, w2 in place
      if (s == 0) first = last;
      if (twin) {
        double ref = twin->step({{x, {}, {}}, {y, {}, {}}, {w1_ref, {}, {}}, {w2_ref, {}, {}}});
        worst = std::max(worst, std::fabs(ref - last));
      }
      if (r == 0) std::printf("step %2lld  loss %.6f\n", static_cast<long long>(s + 1), last);
    }
    if (twin) {  // rank 0's block of w1 (rows [0, ffn/n)) against the single-device weights
      for (int64_t i = 0; i < inputs[2].local.numel(); ++i)
        worst = std::max(worst, std::fabs(inputs[2].local.get(i) - w1_ref.get(i)));
      std::printf("%lld ranks: worst difference to one device (losses, w1 block) %.3g\n", static_cast<long long>(n),
                  worst);
    }
    bool ok = last < first / 10 && worst < 1e-4;
    if (r == 0) std::printf("loss %.4f -> %.4f: %s\n", first, last, ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
  } catch (const UserError& e) {
    std::fprintf(stderr, "%s: %s\n", errorKindName(e.kind()), e.message().c_str());
    return 1;
  }
}
