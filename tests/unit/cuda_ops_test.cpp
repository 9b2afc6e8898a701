// Whole programs on the GPU: every op of the fusion IR as a single-device program through the
// executor on the CUDA backend, against the CPU backend; and the GPU communicators (NCCL at world
// size 1, host staging) on device buffers. Skipped without a device.
#include <gtest/gtest.h>

#include <cstdlib>

#include "cuda_test_helpers.h"
#include "meshfuse/executor.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/npy.h"
#include "meshfuse/ops.h"
#include "runtime/cuda.h"

namespace meshfuse {
namespace {

using cuda_testing::closeTo;
using cuda_testing::sameValues;
using cuda_testing::OpCase;
using cuda_testing::opCases;

// Runs `def` on one device of `backend` (a one-device mesh: no collectives).
std::vector<Tensor> runOnOneDevice(const Fusion& def, const std::vector<Tensor>& inputs,
                                   std::unique_ptr<Backend> backend, Communicator& comm) {
  MultiDeviceExecutor exec(def.clone(), comm, std::move(backend));
  std::vector<ShardedTensor> in;
  for (const Tensor& t : inputs) in.push_back({t, DeviceMesh({0}), {Placement::replicate()}});
  std::vector<Tensor> out;
  for (ShardedTensor& s : exec.run(in)) out.push_back(exec.backend().download(s.local));
  return out;
}

class CudaOps : public ::testing::TestWithParam<DataType> {};

TEST_P(CudaOps, EveryOpMatchesTheCpuBackend) {
  MF_REQUIRE_CUDA();
  const DataType dt = GetParam();
  std::unique_ptr<Communicator> self = makeSelfCommunicator();
  for (const OpCase& c : opCases()) {
    SCOPED_TRACE(c.name + " " + std::string(dtypeName(dt)));
    Fusion def;
    std::vector<Tensor> inputs = cuda_testing::buildCase(c, dt, def);
    std::vector<Tensor> want = runOnOneDevice(def, inputs, makeCpuBackend(), *self);
    std::vector<Tensor> got;
    try {
      got = runOnOneDevice(def, inputs, makeCudaBackend(), *self);
    } catch (const UserError& e) {
      ADD_FAILURE() << e.message();
      continue;
    }
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(closeTo(got[i], want[i], nullptr)) << "output " << i;
    // scripts/gpu-check (stage sanitize) runs the suite with and without CUDA_LAUNCH_BLOCKING=1
    // and compares the outputs it saves here byte for byte: generated kernels and their
    // reductions are deterministic, and nothing depends on the host running ahead of the GPU.
    if (const char* dir = std::getenv("MESHFUSE_TEST_OUTPUT_DIR"))
      for (size_t i = 0; i < got.size(); ++i)
        writeNpy(fmt::format("{}/{}_{}_{}.npy", dir, c.name, dtypeName(dt), i), got[i]);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaOps, ::testing::Values(DataType::Float, DataType::BFloat16, DataType::Half),
                         [](const auto& info) { return std::string(dtypeName(info.param)); });

// Every collective of the interface on device buffers, at world size 1 (each is a copy).
void expectCollectivesOnDevice(Communicator& comm, Backend& b, Streams* streams) {
  const int64_t n = 1000;
  Tensor x = Tensor::random(DataType::BFloat16, {n}, 5);
  Tensor dx = b.upload(x), dy = b.allocate(DataType::BFloat16, {n});
  auto check = [&](const char* what, std::function<std::unique_ptr<Work>()> issue) {
    SCOPED_TRACE(what);
    b.copy(dy, b.upload(Tensor(DataType::BFloat16, {n})));
    b.streams().synchronize();  // the reset ran on the main stream; the collective may use another
    if (streams != nullptr) {  // inside tasks: issue on stream 1, wait on stream 0
      std::unique_ptr<Work> w;
      streams->submit(1, TaskKind::Communication, what, [&] { w = issue(); });
      streams->submit(0, TaskKind::Wait, "wait", [&] { w->wait(); });
      streams->synchronize();
    } else {
      issue()->wait();
    }
    EXPECT_TRUE(sameValues(dy, x, &b));
  };
  const Team me = {0};
  const DataType bf = DataType::BFloat16;
  check("allgather", [&] { return comm.allgather(dx.data(), dy.data(), n, bf, me); });
  check("reduce_scatter", [&] { return comm.reduceScatter(dx.data(), dy.data(), n, bf, ReduceOp::Sum, me); });
  check("allreduce", [&] { return comm.allreduce(dx.data(), dy.data(), n, bf, ReduceOp::Sum, me); });
  check("all_to_all", [&] { return comm.allToAll(dx.data(), dy.data(), n, bf, me); });
  check("reduce", [&] { return comm.reduce(dx.data(), dy.data(), n, bf, ReduceOp::Max, 0, me); });
  check("gather", [&] { return comm.gather(dx.data(), dy.data(), n, bf, 0, me); });
  check("scatter", [&] { return comm.scatter(dx.data(), dy.data(), n, bf, 0, me); });
  check("broadcast", [&] {
    b.copy(dy, dx);
    b.streams().synchronize();
    return comm.broadcast(dy.data(), n, bf, 0, me);
  });
}

TEST(CudaCommunicators, NcclAtWorldSizeOne) {
  MF_REQUIRE_CUDA();
  std::unique_ptr<Backend> b = makeCudaBackend();
  std::unique_ptr<Communicator> nccl = makeNcclCommunicator(makeSelfCommunicator());
  EXPECT_EQ(nccl->name(), "nccl");
  expectCollectivesOnDevice(*nccl, *b, nullptr);
  expectCollectivesOnDevice(*nccl, *b, &b->streams());
}

TEST(CudaCommunicators, HostStagedOnDeviceBuffers) {
  MF_REQUIRE_CUDA();
  std::unique_ptr<Backend> b = makeCudaBackend();
  std::unique_ptr<Communicator> staged = makeHostStagedCommunicator(makeSelfCommunicator());
  expectCollectivesOnDevice(*staged, *b, nullptr);
  expectCollectivesOnDevice(*staged, *b, &b->streams());
}

TEST(CudaCommunicators, CudaCommunicatorAtWorldSizeOneIsNccl) {
  MF_REQUIRE_CUDA();
  EXPECT_EQ(makeCudaCommunicator(makeSelfCommunicator())->name(), "nccl");
}

}  // namespace
}  // namespace meshfuse
