// The tiled attention kernel (online softmax, docs/kernels.md) against the lowering it replaced
// (a materialized [s, s] score matrix between two GEMMs, selected for this benchmark with
// kir::setMaterializedAttentionForBenchmarks) and against PyTorch's CPU
// torch.nn.functional.scaled_dot_product_attention (benchmarks/attention_torch.py, in a child
// process of the same run), one thread each. Forward only, f32, batch 1.
//   build/benchmarks/attention_cpu [HEADS HEAD_SIZE ITERS SEQ...]   (default 2 64 5 512 ... 8192)
// Prints one markdown row per (sequence, causal): medians in ms and the ratios.
// Results: benchmarks/results/context-parallel.md.
#include <cstdlib>
#include <iostream>

#include "kernels_common.h"
#include "lower/kernel_lower.h"
#include "meshfuse/ir/printer.h"
#include "meshfuse/ops.h"

using namespace meshfuse;

namespace {

std::string sdpaText(int64_t heads, int64_t s, int64_t d, bool causal) {
  Fusion f;
  TensorView* q = f.defineTensor({1, heads, s, d}, DataType::Float, "q");
  TensorView* k = f.defineTensor({1, heads, s, d}, DataType::Float, "k");
  TensorView* v = f.defineTensor({1, heads, s, d}, DataType::Float, "v");
  TensorView* o = ops::sdpa(q, k, v, causal);
  f.addOutput(o);
  f.rename(o, "o");
  return printFusion(f);
}

// PyTorch's median seconds (attention_torch.py prints "seconds <median>"), or -1 with `why`.
double torchSeconds(int64_t heads, int64_t s, int64_t d, bool causal, int iters, std::string* why) {
  const std::string cmd = fmt::format("{} {}/attention_torch.py {} {} {} {} {} 2>&1", MESHFUSE_VENV_PYTHON,
                                      MESHFUSE_BENCH_DIR, heads, s, d, causal ? 1 : 0, iters);
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    *why = "could not start the Python baseline";
    return -1;
  }
  std::string out;
  char buf[256];
  while (fgets(buf, sizeof buf, p) != nullptr) out += buf;
  const int rc = pclose(p);
  std::istringstream in(out);
  std::string word;
  double seconds = -1;
  while (in >> word)
    if (word == "seconds") in >> seconds;
  if (rc != 0 || seconds <= 0) *why = "PyTorch baseline unavailable: " + out.substr(0, 200);
  return rc == 0 ? seconds : -1;
}

void row(int64_t heads, int64_t s, int64_t d, bool causal, int iters) {
  bench::CompiledSegments c(sdpaText(heads, s, d, causal), {});
  std::map<std::string, Tensor> buffers;
  for (const char* n : {"q", "k", "v"}) buffers[n] = Tensor::random(DataType::Float, {1, heads, s, d}, n[0]);
  buffers["o"] = Tensor::empty(DataType::Float, {1, heads, s, d});
  std::unique_ptr<Backend> tiled = makeCpuBackend(), materialized = makeCpuBackend();
  // Each backend lowers (and caches) the segment on its first run: the switch picks the lowering.
  kir::setMaterializedAttentionForBenchmarks(false);
  c.run(*tiled, 0, buffers);
  kir::setMaterializedAttentionForBenchmarks(true);
  c.run(*materialized, 0, buffers);
  kir::setMaterializedAttentionForBenchmarks(false);
  std::vector<double> t = bench::interleavedMedians(
      {[&] { c.run(*tiled, 0, buffers); }, [&] { c.run(*materialized, 0, buffers); }}, iters);
  std::string why;
  const double torch = torchSeconds(heads, s, d, causal, iters, &why);
  std::cout << fmt::format("| {} | {} | {:.2f} | {:.2f} | {} | {:.2f}x | {} |\n", s, causal ? "causal" : "full",
                           t[0] * 1e3, t[1] * 1e3, torch > 0 ? fmt::format("{:.2f}", torch * 1e3) : "-",
                           t[1] / t[0], torch > 0 ? fmt::format("{:.2f}x", torch / t[0]) : why);
  std::cout.flush();
}

}  // namespace

int main(int argc, char** argv) {
  bench::singleThreaded();
  const int64_t heads = argc > 1 ? std::atoll(argv[1]) : 2, d = argc > 2 ? std::atoll(argv[2]) : 64;
  const int iters = argc > 3 ? std::atoi(argv[3]) : 5;
  std::vector<int64_t> seqs;
  for (int i = 4; i < argc; ++i) seqs.push_back(std::atoll(argv[i]));
  if (seqs.empty()) seqs = {512, 1024, 2048, 4096, 8192};
  std::cout << bench::machine() << "\n";
  std::cout << fmt::format("batch 1, {} heads, head size {}, f32, forward; medians of {} interleaved runs\n\n", heads,
                           d, iters);
  std::cout << "| seq | mask | tiled ms | materialized ms | torch ms | materialized / tiled | torch / tiled |\n";
  std::cout << "|---|---|---|---|---|---|---|\n";
  for (int64_t s : seqs)
    for (bool causal : {false, true}) row(heads, s, d, causal, iters);
  return 0;
}
