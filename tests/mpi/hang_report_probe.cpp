// A real hung collective, through the C++ API: a tensor-parallel MLP runs once on every rank;
// in the second run the last rank does not arrive (it sleeps past MESHFUSE_COMM_TIMEOUT). Every
// other rank's watchdog must report where it is blocked (the allreduce, its position in the
// team's sequence) and which peer has not arrived, with the node that peer should be at
// (hang_report_names_positions checks the text).
#include <chrono>
#include <cstdio>
#include <thread>

#include "meshfuse/executor.h"
#include "runtime/environment.h"
#include "models.h"
#include "lower/pipeline.h"

using namespace meshfuse;

int main() {
  std::unique_ptr<Communicator> comm = makeDefaultCommunicator();
  const int64_t n = comm->size(), r = comm->rank();
  auto def = std::make_unique<Fusion>();
  models::buildMlp(*def, 32);
  std::vector<int64_t> ranks(n);
  for (int64_t i = 0; i < n; ++i) ranks[i] = i;
  DeviceMesh mesh(ranks);
  std::vector<ShardedTensor> inputs = {
      distributeTensor(Tensor::random(DataType::Float, {16, 32}, 0), mesh, {Placement::replicate()}, r),
      distributeTensor(Tensor::random(DataType::Float, {128, 32}, 1), mesh, {Placement::shard(0)}, r),
      distributeTensor(Tensor::random(DataType::Float, {32, 128}, 2), mesh, {Placement::shard(1)}, r)};
  MultiDeviceExecutor exec(std::move(def), *comm);
  exec.run(inputs);
  std::printf("rank %lld: first run done\n", static_cast<long long>(r));
  std::fflush(stdout);
  if (r == n - 1) {  // the straggler: long past the others' watchdog
    std::this_thread::sleep_for(std::chrono::duration<double>(readRuntimeEnvironment().comm_timeout_s * 4 + 5));
    return 0;
  }
  exec.run(inputs);
  std::printf("rank %lld: second run finished (it should have hung)\n", static_cast<long long>(r));
  return 0;
}
