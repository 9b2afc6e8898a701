// The README's example: a single-device MLP definition run tensor-parallel through the C++ API.
//   mpirun -np 4 build/tp_mlp_api
// Every rank passes its own blocks (here random) and gets the full result back (Replicate), after
// exactly one allreduce; rank 0 checks it against single-device execution of the definition.
#include <cmath>
#include <cstdio>

#include "meshfuse/executor.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/ir/placement.h"
#include "meshfuse/ops.h"
#include "meshfuse/reference.h"

using namespace meshfuse;

int main() {
  try {
    auto def = std::make_unique<Fusion>();  // single-device definition
    TensorView* inp = def->defineTensor({-1, 64}, DataType::Float, "inp");  // [tokens, hidden]
    TensorView* up_w = def->defineTensor({256, 64}, DataType::Float, "up_w");
    TensorView* down_w = def->defineTensor({64, 256}, DataType::Float, "down_w");
    def->addOutput(ops::linear(ops::gelu(ops::linear(inp, up_w), "tanh"), down_w));
    std::unique_ptr<Fusion> reference_def = def->clone();

    std::unique_ptr<Communicator> comm = makeDefaultCommunicator();  // MPI under mpirun
    const int64_t n = comm->size(), r = comm->rank();
    std::vector<int64_t> ranks(n);
    for (int64_t i = 0; i < n; ++i) ranks[i] = i;
    DeviceMesh mesh(ranks);
    // The full tensors (the same seeds on every rank), and this rank's blocks of them.
    Tensor x = Tensor::random(DataType::Float, {128, 64}, 0), w1 = Tensor::random(DataType::Float, {256, 64}, 1),
           w2 = Tensor::random(DataType::Float, {64, 256}, 2);
    MultiDeviceExecutor exec(std::move(def), *comm);
    std::vector<ShardedTensor> out = exec.run({distributeTensor(x, mesh, {Placement::replicate()}, r),
                                               distributeTensor(w1, mesh, {Placement::shard(0)}, r),    // column-parallel
                                               distributeTensor(w2, mesh, {Placement::shard(1)}, r)});  // row-parallel

    if (r == 0) {
      Tensor expected = evaluateReference(*reference_def, {x, w1, w2}).at(0);
      double worst = 0;
      for (int64_t i = 0; i < expected.numel(); ++i) worst = std::max(worst, std::fabs(out[0].local.get(i) - expected.get(i)));
      std::printf("%lld ranks, %zu collective(s) (%s); output %s %s; max abs error vs one device %.3g\n",
                  static_cast<long long>(n), exec.lastCollectives().size(),
                  exec.lastCollectives().empty() ? "none" : commKindName(exec.lastCollectives()[0].kind),
                  out[0].local.shapeString().c_str(), placementsToString(out[0].placements).c_str(), worst);
      return worst < 1e-3 ? 0 : 1;
    }
  } catch (const UserError& e) {
    std::fprintf(stderr, "%s: %s\n", errorKindName(e.kind()), e.message().c_str());
    return 1;
  }
  return 0;
}
