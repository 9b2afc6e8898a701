// Fused pointwise chain: out = gelu_tanh(x + bias) + residual over ROWS x COLS floats (default
// 8192 x 8192 = 64M), one fused generated kernel. Ratios measured in the same run, one thread:
//   vs memcpy   bytes the kernel moves per second (2 reads + 1 write) over memcpy's (1 + 1) on
//               buffers of the same size
//   vs PyTorch  CPU eager time of the same chain (benchmarks/kernels_torch.py) over ours
// The kernel is timed through Backend::runSegment on preallocated buffers (what the host-IR
// evaluator calls), and end to end through MultiDeviceExecutor (which also allocates the output).
//   build/benchmarks/kernels_pointwise [ROWS COLS ITERS]
#include <cmath>
#include <cstring>

#include "kernels_common.h"
#include "meshfuse/executor.h"

using namespace meshfuse;

int main(int argc, char** argv) {
  bench::singleThreaded();
  const int64_t rows = argc > 1 ? std::stoll(argv[1]) : 8192, cols = argc > 2 ? std::stoll(argv[2]) : 8192;
  const int iters = argc > 3 ? std::stoi(argv[3]) : 10;
  const std::string text = fmt::format(R"(fusion {{
  mesh @one = [0]
  %x = input f32[?t, {0}] @one {{}}
  %bias = input f32[{0}] @one {{}}
  %res = input f32[?t, {0}] @one {{}}
  %b = broadcast_in_dim(%bias, shape=[1, {0}], broadcast_dims=[1])
  %y = add(%x, %b)
  %g = gelu(%y, approximate="tanh")
  %out = add(%g, %res)
  output %out
}})",
                                       cols);
  bench::CompiledSegments prog(text, {{"t", rows}});
  MF_CHECK(prog.segments().size() == 1, "the chain should be one kernel");
  std::unique_ptr<Backend> backend = makeCpuBackend();
  std::map<std::string, Tensor> buf;
  for (const char* name : {"x", "res"}) buf[name] = Tensor::random(DataType::Float, {rows, cols}, name[0]);
  buf["bias"] = Tensor::random(DataType::Float, {cols}, 3);
  buf["out"] = Tensor::empty(DataType::Float, {rows, cols});
  Tensor copy = Tensor::empty(DataType::Float, {rows, cols});
  const double bytes = static_cast<double>(rows * cols * 4);

  std::vector<double> t = bench::interleavedMedians(
      {[&] { prog.run(*backend, 0, buf); }, [&] { std::memcpy(copy.data(), buf["x"].data(), copy.nbytes()); }}, iters);
  const double kernel = t[0], memcpy_s = t[1];
  // A spot check of the result (the differential tests check kernels thoroughly).
  const float* o = static_cast<const float*>(buf["out"].data());
  for (int64_t i : {int64_t{0}, rows * cols / 2 + 7, rows * cols - 1}) {
    double x = buf["x"].get(i) + buf["bias"].get(i % cols);
    double want = 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))) + buf["res"].get(i);
    MF_CHECK(std::fabs(o[i] - want) < 1e-5, "wrong result at {}: {} vs {}", i, o[i], want);
  }

  std::unique_ptr<Communicator> comm = makeSelfCommunicator();
  MultiDeviceExecutor exec(parseFusion(text, "<benchmark>"), *comm);
  DeviceMesh one({0});
  std::vector<ShardedTensor> in = {{buf["x"], one, {Placement::replicate()}},
                                   {buf["bias"], one, {Placement::replicate()}},
                                   {buf["res"], one, {Placement::replicate()}}};
  const double end_to_end = bench::medianSeconds([&] { exec.run(in); }, iters);

  std::string why;
  const double torch = bench::torchSeconds(fmt::format("pointwise {} {} {}", rows, cols, iters), &why);

  const double bw = 3 * bytes / kernel, memcpy_bw = 2 * bytes / memcpy_s;
  fmt::print("# fused pointwise chain gelu_tanh(x + bias) + residual, [{}, {}] f32 ({} M floats), 1 thread\n", rows,
             cols, rows * cols / (1 << 20));
  fmt::print("# {}\n", bench::machine());
  fmt::print("| measurement | time | bandwidth |\n|---|---|---|\n");
  fmt::print("| memcpy (1 read + 1 write) | {:.2f} ms | {:.2f} GB/s |\n", memcpy_s * 1e3, memcpy_bw / 1e9);
  fmt::print("| generated kernel via runSegment (2 reads + 1 write) | {:.2f} ms | {:.2f} GB/s |\n", kernel * 1e3,
             bw / 1e9);
  fmt::print("| generated kernel via MultiDeviceExecutor (allocates the output) | {:.2f} ms | {:.2f} GB/s |\n",
             end_to_end * 1e3, 3 * bytes / end_to_end / 1e9);
  if (torch > 0) fmt::print("| PyTorch eager (3 ops) | {:.2f} ms | |\n", torch * 1e3);
  fmt::print("\nratio kernel bandwidth / memcpy bandwidth: {:.2f} (target >= 0.8)\n", bw / memcpy_bw);
  if (torch > 0) {
    fmt::print("speedup over PyTorch eager: {:.2f}x via runSegment, {:.2f}x end to end (target >= 3)\n", torch / kernel,
               torch / end_to_end);
  } else {
    fmt::print("PyTorch baseline not measured: {}\n", why);
  }
  return 0;
}
