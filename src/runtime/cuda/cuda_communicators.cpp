// Choosing the communicator for a CUDA backend (cuda.h: makeCudaCommunicator).
#include <unistd.h>

#include <set>

#include "meshfuse/error.h"
#include "runtime/cuda.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/cuda/nvrtc_compiler.h"

namespace meshfuse {

std::unique_ptr<Communicator> makeCudaCommunicator(std::unique_ptr<Communicator> world) {
  const int device = cuda::requireDevice(-1);
  if (world->size() == 1) return makeNcclCommunicator(std::move(world));
  // NCCL needs a GPU per rank: ranks that share a (host, GPU) pair use host staging instead.
  // Every rank takes the same decision from the same gathered keys.
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  int64_t key = static_cast<int64_t>(cuda::hash64(std::string(host) + "/" + cuda::deviceProperties(device).uuid));
  std::vector<int64_t> keys(static_cast<size_t>(world->size()));
  Team everyone(keys.size());
  for (size_t i = 0; i < everyone.size(); ++i) everyone[i] = static_cast<int64_t>(i);
  world->allgather(&key, keys.data(), 1, DataType::Int64, everyone)->wait();
  const bool own_gpus = std::set<int64_t>(keys.begin(), keys.end()).size() == keys.size();
  return own_gpus ? makeNcclCommunicator(std::move(world)) : makeHostStagedCommunicator(std::move(world));
}

}  // namespace meshfuse
