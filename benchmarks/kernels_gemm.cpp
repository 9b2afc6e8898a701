// GEMM through the runtime vs a direct cblas_sgemm of the same shape, in the same run, one
// thread: linear y[M, N] = x[M, K] w[N, K]^T (w read transposed in place, as the runtime does) and
// matmul y = a[M, K] b[K, N]. The runtime is timed through Backend::runSegment on preallocated
// buffers and end to end through MultiDeviceExecutor (which also allocates the output).
//   build/benchmarks/kernels_gemm [M N K ITERS]
#include "kernels_common.h"
#include "meshfuse/executor.h"

using namespace meshfuse;

namespace {

struct Row {
  std::string op;
  double direct, segment, executor;
};

Row measure(const std::string& op, int64_t m, int64_t n, int64_t k, int iters) {
  const bool linear = op == "linear";
  const std::string text = linear ? fmt::format(R"(fusion {{
  mesh @one = [0]
  %a = input f32[{0}, {2}] @one {{}}
  %b = input f32[{1}, {2}] @one {{}}
  %c = linear(%a, %b)
  output %c
}})",
                                                m, n, k)
                                  : fmt::format(R"(fusion {{
  mesh @one = [0]
  %a = input f32[{0}, {2}] @one {{}}
  %b = input f32[{2}, {1}] @one {{}}
  %c = matmul(%a, %b)
  output %c
}})",
                                                m, n, k);
  bench::CompiledSegments prog(text, {});
  std::unique_ptr<Backend> backend = makeCpuBackend();
  std::map<std::string, Tensor> buf;
  buf["a"] = Tensor::random(DataType::Float, {m, k}, 1);
  buf["b"] = Tensor::random(DataType::Float, linear ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n}, 2);
  buf["c"] = Tensor::empty(DataType::Float, {m, n});
  Tensor direct_c = Tensor::empty(DataType::Float, {m, n});
  auto direct = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, linear ? CblasTrans : CblasNoTrans, m, n, k, 1.0f,
                static_cast<const float*>(buf["a"].data()), k, static_cast<const float*>(buf["b"].data()),
                linear ? k : n, 0.0f, static_cast<float*>(direct_c.data()), n);
  };
  std::unique_ptr<Communicator> comm = makeSelfCommunicator();
  MultiDeviceExecutor exec(parseFusion(text, "<benchmark>"), *comm);
  DeviceMesh one({0});
  std::vector<ShardedTensor> in = {{buf["a"], one, {Placement::replicate()}},
                                   {buf["b"], one, {Placement::replicate()}}};
  std::vector<double> t =
      bench::interleavedMedians({direct, [&] { prog.run(*backend, 0, buf); }, [&] { exec.run(in); }}, iters);
  const double t_direct = t[0], t_segment = t[1], t_exec = t[2];
  return {op, t_direct, t_segment, t_exec};
}

}  // namespace

int main(int argc, char** argv) {
  bench::singleThreaded();
  const int64_t m = argc > 1 ? std::stoll(argv[1]) : 1024, n = argc > 2 ? std::stoll(argv[2]) : 1024,
                k = argc > 3 ? std::stoll(argv[3]) : 1024;
  const int iters = argc > 4 ? std::stoi(argv[4]) : 30;
  fmt::print("# GEMM [{} x {}] x [{} x {}] through the runtime vs direct cblas_sgemm, f32, 1 thread\n", m, k, k, n);
  fmt::print("# {}\n", bench::machine());
  fmt::print("| op | direct cblas_sgemm | runtime (runSegment) | ratio | runtime (executor) | ratio |\n");
  fmt::print("|---|---|---|---|---|---|\n");
  for (const char* op : {"linear", "matmul"}) {
    Row r = measure(op, m, n, k, iters);
    fmt::print("| {} | {:.3f} ms | {:.3f} ms | {:.3f} | {:.3f} ms | {:.3f} |\n", r.op, r.direct * 1e3, r.segment * 1e3,
               r.direct / r.segment, r.executor * 1e3, r.direct / r.executor);
  }
  fmt::print("\nratio = direct time / runtime time (target >= 0.95)\n");
  return 0;
}
