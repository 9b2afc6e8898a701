// The tiled attention kernel (online softmax, docs/kernels.md) against the lowering it replaced
// (a materialized [s, s] score matrix between two GEMMs, selected for this benchmark with
// kir::setMaterializedAttentionForBenchmarks) and against PyTorch's CPU
// torch.nn.functional.scaled_dot_product_attention (benchmarks/attention_torch.py, in a child
// process of the same run), one thread each. Forward only, f32, batch 1.
//   build/benchmarks/attention_cpu [HEADS HEAD_SIZE ITERS SEQ...]   (default 2 64 5 512 ... 8192)
// Prints one markdown row per (sequence, causal): min / median times in ms and their ratios.
// Results: benchmarks/results/context-parallel.md.
#include <cstdlib>
#include <iostream>

#include "kernels_common.h"
#include "codegen/kernel_lower.h"
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

// The fastest and the median run: on a shared machine the minimum is the better estimate of what
// the code costs, the median of what a user sees under that load; both are reported.
struct Time {
  double min = -1, median = -1;
};
using Times = std::vector<Time>;

// Runs the functions in turn (a, b, a, b, ...) after one warm-up each, so load changes hit them alike.
Times interleaved(const std::vector<std::function<void()>>& fns, int iters) {
  for (const auto& fn : fns) fn();
  std::vector<std::vector<double>> t(fns.size());
  for (int i = 0; i < iters; ++i)
    for (size_t f = 0; f < fns.size(); ++f) {
      auto start = std::chrono::steady_clock::now();
      fns[f]();
      t[f].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  Times out;
  for (auto& v : t) {
    std::sort(v.begin(), v.end());
    out.push_back({v.front(), v[v.size() / 2]});
  }
  return out;
}

// PyTorch's times (attention_torch.py prints "min <s>" and "seconds <median>"), or -1 with `why`.
Time torchSeconds(int64_t heads, int64_t s, int64_t d, bool causal, int iters, std::string* why) {
  const std::string cmd = fmt::format("{} {}/attention_torch.py {} {} {} {} {} 2>&1", MESHFUSE_VENV_PYTHON,
                                      MESHFUSE_BENCH_DIR, heads, s, d, causal ? 1 : 0, iters);
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    *why = "could not start the Python baseline";
    return {};
  }
  std::string out;
  char buf[256];
  while (fgets(buf, sizeof buf, p) != nullptr) out += buf;
  const int rc = pclose(p);
  std::istringstream in(out);
  std::string word;
  Time t;
  while (in >> word) {
    if (word == "seconds") in >> t.median;
    if (word == "min") in >> t.min;
  }
  if (rc != 0 || t.min <= 0) {
    *why = "PyTorch baseline unavailable: " + out.substr(0, 200);
    return {};
  }
  return t;
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
  const Times t = interleaved({[&] { c.run(*tiled, 0, buffers); }, [&] { c.run(*materialized, 0, buffers); }}, iters);
  std::string why;
  const Time torch = torchSeconds(heads, s, d, causal, iters, &why);
  auto ms = [](const Time& x) { return fmt::format("{:.2f} / {:.2f}", x.min * 1e3, x.median * 1e3); };
  std::cout << fmt::format("| {} | {} | {} | {} | {} | {:.2f}x / {:.2f}x | {} |\n", s, causal ? "causal" : "full",
                           ms(t[0]), ms(t[1]), torch.min > 0 ? ms(torch) : "-", t[1].min / t[0].min,
                           t[1].median / t[0].median,
                           torch.min > 0 ? fmt::format("{:.2f}x / {:.2f}x", torch.min / t[0].min,
                                                       torch.median / t[0].median)
                                         : why);
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
  std::cout << fmt::format(
      "batch 1, {} heads, head size {}, f32, forward; min / median of {} runs (meshfuse's two interleaved)\n\n", heads,
      d, iters);
  std::cout << "| seq | mask | tiled ms | materialized ms | torch ms | materialized / tiled | torch / tiled |\n";
  std::cout << "|---|---|---|---|---|---|---|\n";
  for (int64_t s : seqs)
    for (bool causal : {false, true}) row(heads, s, d, causal, iters);
  return 0;
}
