// GPT-style MLP block forward on one rank, one thread: out = linear(gelu_tanh(linear(x, up_w,
// up_b)), down_w, down_b) + x through MultiDeviceExecutor (GEMMs with the bias in the GEMM, the
// activation and the residual add as generated kernels) vs PyTorch CPU eager of the same block
// (benchmarks/kernels_torch.py, torch.set_num_threads(1)), in the same run, for several sizes.
//   build/benchmarks/kernels_mlp [ITERS]
#include "kernels_common.h"
#include "meshfuse/executor.h"

using namespace meshfuse;

int main(int argc, char** argv) {
  bench::singleThreaded();
  const int iters = argc > 1 ? std::stoi(argv[1]) : 10;
  fmt::print("# GPT MLP block forward (linear+bias, gelu tanh, linear+bias, residual), f32, 1 thread\n");
  fmt::print("# {}\n", bench::machine());
  fmt::print("| tokens x hidden | meshfuse | PyTorch eager | speedup |\n|---|---|---|---|\n");
  const std::vector<std::pair<int64_t, int64_t>> sizes = {{32, 64}, {128, 256}, {512, 256}, {512, 768}, {2048, 1024}};
  for (auto [t, h] : sizes) {
    const std::string text = fmt::format(R"(fusion {{
  mesh @one = [0]
  %x = input f32[?t, {0}] @one {{}}
  %up_w = input f32[{1}, {0}] @one {{}}
  %up_b = input f32[{1}] @one {{}}
  %down_w = input f32[{0}, {1}] @one {{}}
  %down_b = input f32[{0}] @one {{}}
  %up = linear(%x, %up_w, bias=%up_b)
  %act = gelu(%up, approximate="tanh")
  %down = linear(%act, %down_w, bias=%down_b)
  %out = add(%down, %x)
  output %out
}})",
                                         h, 4 * h);
    std::unique_ptr<Communicator> comm = makeSelfCommunicator();
    MultiDeviceExecutor exec(parseFusion(text, "<benchmark>"), *comm);
    DeviceMesh one({0});
    auto in = [&](std::vector<int64_t> s, uint64_t seed) {
      return ShardedTensor{Tensor::random(DataType::Float, s, seed), one, {Placement::replicate()}};
    };
    std::vector<ShardedTensor> inputs = {in({t, h}, 1), in({4 * h, h}, 2), in({4 * h}, 3), in({h, 4 * h}, 4),
                                         in({h}, 5)};
    const int n = t * h >= 512 * 768 ? std::max(3, iters / 2) : iters * 20;
    const double ours = bench::medianSeconds([&] { exec.run(inputs); }, n, 3);
    std::string why;
    const double torch = bench::torchSeconds(fmt::format("mlp {} {} {}", t, h, n), &why);
    if (torch > 0) {
      fmt::print("| {} x {} | {:.3f} ms | {:.3f} ms | {:.2f}x |\n", t, h, ours * 1e3, torch * 1e3, torch / ours);
    } else {
      fmt::print("| {} x {} | {:.3f} ms | not measured ({}) | |\n", t, h, ours * 1e3, why);
    }
  }
  fmt::print("\nspeedup = PyTorch time / meshfuse time (target >= 1.3)\n");
  return 0;
}
