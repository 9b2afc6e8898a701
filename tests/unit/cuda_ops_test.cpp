// Whole programs on the GPU: every op of the fusion IR as a single-device program through the
// executor on the CUDA backend, against the CPU backend; and the GPU communicators (NCCL at world
// size 1, host staging) on device buffers. Skipped without a device.
#include <gtest/gtest.h>

#include <functional>

#include "cuda_test_helpers.h"
#include "meshfuse/executor.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/ops.h"
#include "meshfuse/runtime/cuda.h"

namespace meshfuse {
namespace {

using cuda_testing::closeTo;

struct OpCase {
  std::string name;
  std::vector<std::vector<int64_t>> shapes;
  std::function<TensorView*(std::vector<TensorView*>)> build;
  bool positive = false;  // inputs must be > 0 (log, sqrt, pow)
};

std::vector<OpCase> opCases() {
  using T = std::vector<TensorView*>;
  const std::vector<int64_t> m = {33, 130};  // odd sizes: tails of vectorized loops
  std::vector<OpCase> c = {
      {"neg", {m}, [](T t) { return ops::neg(t[0]); }},
      {"abs", {m}, [](T t) { return ops::abs(t[0]); }},
      {"exp", {m}, [](T t) { return ops::exp(t[0]); }},
      {"log", {m}, [](T t) { return ops::log(t[0]); }, true},
      {"sqrt", {m}, [](T t) { return ops::sqrt(t[0]); }, true},
      {"rsqrt", {m}, [](T t) { return ops::rsqrt(t[0]); }, true},
      {"reciprocal", {m}, [](T t) { return ops::reciprocal(t[0]); }, true},
      {"tanh", {m}, [](T t) { return ops::tanh(t[0]); }},
      {"sigmoid", {m}, [](T t) { return ops::sigmoid(t[0]); }},
      {"relu", {m}, [](T t) { return ops::relu(t[0]); }},
      {"silu", {m}, [](T t) { return ops::silu(t[0]); }},
      {"gelu", {m}, [](T t) { return ops::gelu(t[0]); }},
      {"gelu_tanh", {m}, [](T t) { return ops::gelu(t[0], "tanh"); }},
      {"add_broadcast", {m, {1, 130}}, [](T t) { return ops::add(t[0], t[1]); }},
      {"sub_scalar", {m}, [](T t) { return ops::sub(3.0, t[0]); }},
      {"mul", {m, m}, [](T t) { return ops::mul(t[0], t[1]); }},
      {"div", {m, m}, [](T t) { return ops::div(t[0], t[1]); }, true},
      {"pow", {m}, [](T t) { return ops::pow(t[0], 1.5); }, true},
      {"maximum", {m, m}, [](T t) { return ops::maximum(t[0], t[1]); }},
      {"minimum", {m, m}, [](T t) { return ops::minimum(t[0], t[1]); }},
      {"where_gt", {m, m}, [](T t) { return ops::where(ops::gt(t[0], t[1]), t[0], t[1]); }},
      {"cast_f32", {m}, [](T t) { return ops::cast(t[0], DataType::Float); }},
      {"sum", {{4, 33, 130}}, [](T t) { return ops::sum(t[0], {2}); }},
      {"sum_outer", {{4, 33, 130}}, [](T t) { return ops::sum(t[0], {0}); }},
      {"max", {m}, [](T t) { return ops::max(t[0], {1}); }},
      {"mean", {m}, [](T t) { return ops::mean(t[0], {1}, true); }},
      {"broadcast_in_dim", {{130}}, [](T t) { return ops::broadcastInDim(t[0], {33, 130}, {1}); }},
      {"reshape", {m}, [](T t) { return ops::reshape(t[0], {130, 33}); }},
      {"permute", {{4, 33, 130}}, [](T t) { return ops::permute(t[0], {2, 0, 1}); }},
      {"slice", {m}, [](T t) { return ops::slice(t[0], {1, 5}, {30, 129}); }},
      {"cat", {m, {33, 7}}, [](T t) { return ops::cat({t[0], t[1]}, 1); }},
      {"softmax", {m}, [](T t) { return ops::softmax(t[0], 1); }},
      {"softmax_dim0", {m}, [](T t) { return ops::softmax(t[0], 0); }},
      {"layer_norm", {m, {130}, {130}}, [](T t) { return ops::layerNorm(t[0], t[1], t[2]); }},
      {"rms_norm", {m, {130}}, [](T t) { return ops::rmsNorm(t[0], t[1]); }},
      {"linear", {m, {64, 130}, {64}}, [](T t) { return ops::linear(t[0], t[1], t[2]); }},
      {"matmul", {{2, 33, 130}, {2, 130, 17}}, [](T t) { return ops::matmul(t[0], t[1]); }},
      {"sdpa", {{2, 4, 40, 32}, {2, 4, 40, 32}, {2, 4, 40, 32}}, [](T t) { return ops::sdpa(t[0], t[1], t[2]); }},
      {"sdpa_causal", {{2, 4, 40, 32}, {2, 4, 40, 32}, {2, 4, 40, 32}},
       [](T t) { return ops::sdpa(t[0], t[1], t[2], true); }},
      {"mlp_block", {{64, 128}, {256, 128}, {128, 256}},
       [](T t) { return ops::add(ops::linear(ops::gelu(ops::linear(t[0], t[1]), "tanh"), t[2]), t[0]); }},
  };
  return c;
}

// Runs `def` on one device of `backend` (a one-device mesh: no collectives).
std::vector<Tensor> runOnOneDevice(const Fusion& def, const std::vector<Tensor>& inputs,
                                   std::unique_ptr<Backend> backend, Communicator& comm) {
  MultiDeviceExecutor exec(cloneFusion(def), comm, std::move(backend));
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
    std::vector<TensorView*> tvs;
    std::vector<Tensor> inputs;
    for (size_t i = 0; i < c.shapes.size(); ++i) {
      std::vector<Extent> shape(c.shapes[i].begin(), c.shapes[i].end());
      tvs.push_back(def.defineTensor(shape, dt, fmt::format("in{}", i)));
      Tensor t = Tensor::random(dt, c.shapes[i], 11 + i);
      if (c.positive)
        for (int64_t j = 0; j < t.numel(); ++j) t.set(j, 0.25 + std::fabs(t.get(j)));
      inputs.push_back(t);
    }
    def.addOutput(c.build(tvs));
    std::vector<Tensor> want = runOnOneDevice(def, inputs, makeCpuBackend(), *self);
    std::vector<Tensor> got;
    try {
      got = runOnOneDevice(def, inputs, makeCudaBackend(), *self);
    } catch (const UserError& e) {
      ADD_FAILURE() << e.message();
      continue;
    }
    ASSERT_EQ(got.size(), want.size());
    cuda_testing::Tolerance tol = cuda_testing::toleranceFor(want[0].dtype());
    if (c.name.starts_with("sdpa") || c.name == "mlp_block") {  // long f32 chains in a different order
      tol.atol *= 4;
      tol.rtol *= 4;
    }
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(closeTo(got[i], want[i], nullptr, tol)) << "output " << i;
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
    EXPECT_TRUE(closeTo(dy, x, &b, {0, 0}));
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
