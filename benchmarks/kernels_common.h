// Shared by the generated-kernel benchmarks (benchmarks/kernels_*.cpp): timing, running one
// segment of a compiled fusion directly on the backend, the PyTorch baseline (run by
// benchmarks/kernels_torch.py in a child process of the same benchmark run) and the machine
// description that goes with every result.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/ir/placement.h"
#include "lower/pipeline.h"
#include "runtime/backend.h"

namespace meshfuse::bench {

// Median wall times of several functions run in turn (a, b, c, a, b, c, ...), so that a busy
// neighbour or a clock change hits them alike: the machine is shared.
inline std::vector<double> interleavedMedians(const std::vector<std::function<void()>>& fns, int iters) {
  for (const auto& fn : fns) fn();  // warm up
  std::vector<std::vector<double>> t(fns.size());
  for (int i = 0; i < iters; ++i)
    for (size_t f = 0; f < fns.size(); ++f) {
      auto start = std::chrono::steady_clock::now();
      fns[f]();
      t[f].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  std::vector<double> out;
  for (auto& v : t) {
    std::sort(v.begin(), v.end());
    out.push_back(v[v.size() / 2]);
  }
  return out;
}

// Median wall time of `fn` in seconds, after `warmup` untimed calls.
inline double medianSeconds(const std::function<void()>& fn, int iters, int warmup = 1) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    auto start = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// "AMD EPYC, 2 cores" (from /proc/cpuinfo).
inline std::string machine() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "unknown CPU";
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  return model + ", " + std::to_string(std::thread::hardware_concurrency()) + " cores, no GPU used; OpenBLAS " +
         openblas_get_corename() + " kernels";
}

// One thread everywhere: the ratios are single-core.
inline void singleThreaded() { openblas_set_num_threads(1); }

// The PyTorch CPU eager baseline of `what` (kernels_torch.py prints "seconds <median>"), or a
// negative value with `why` set when torch cannot be imported.
inline double torchSeconds(const std::string& what, std::string* why) {
  const std::string cmd =
      std::string(MESHFUSE_VENV_PYTHON) + " " + MESHFUSE_BENCH_DIR + "/kernels_torch.py " + what + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    *why = "could not start " + std::string(MESHFUSE_VENV_PYTHON);
    return -1;
  }
  std::string out;
  char buf[256];
  while (fgets(buf, sizeof buf, p) != nullptr) out += buf;
  int rc = pclose(p);
  std::istringstream s(out);
  std::string word;
  double seconds = -1;
  while (s >> word)
    if (word == "seconds") s >> seconds;
  if (rc != 0 || seconds <= 0) {
    *why = "PyTorch baseline unavailable: " + out.substr(0, 200);
    return -1;
  }
  return seconds;
}

// A fusion read from text and compiled for one device; run(i) launches its segment i on the
// backend with caller-owned buffers (no allocation: the time is the kernel's and the
// dispatch's).
class CompiledSegments {
 public:
  CompiledSegments(const std::string& text, SymbolBindings sizes) : sizes_(std::move(sizes)) {
    program_ = compile(parseFusion(text, "<benchmark>"));
    host_ = programForRank(program_, 0);
  }
  const std::vector<Segment>& segments() const { return *host_.segments; }
  std::vector<int64_t> shape(const TensorView* tv) const { return localShape(tv, sizes_, 0); }
  const TensorView* tensor(const std::string& name) const { return program_.fusion->findTensor(name); }

  // Runs segment `i` reading/writing `buffers` (by TensorView name, without the '%').
  void run(Backend& backend, size_t i, std::map<std::string, Tensor>& buffers) const {
    const Segment& seg = segments().at(i);
    std::vector<const Tensor*> in;
    std::vector<Tensor*> out;
    auto name = [this](const TensorView* tv) { return program_.fusion->displayName(tv).substr(1); };  // no '%'
    for (const TensorView* tv : seg.inputs) in.push_back(&buffers.at(name(tv)));
    for (const TensorView* tv : seg.outputs) out.push_back(&buffers.at(name(tv)));
    backend.runSegment(seg, in, out, [this](const TensorView* tv) { return shape(tv); });
  }

 private:
  SymbolBindings sizes_;
  CompiledProgram program_;
  HostProgram host_;
};

}  // namespace meshfuse::bench
