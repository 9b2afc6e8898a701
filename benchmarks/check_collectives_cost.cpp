// The cost of check-collectives next to compilation: for each example, the median wall time of
// compile() (the pass pipeline and host lowering, without kernel compilation, which comes on
// top at the first run) and of checkCollectives() over every rank's program (programForRank of
// each rank included). The check runs once per compiled program, before the first launch.
// Usage: check_collectives_cost SOURCE_DIR [repeats]   (prints a Markdown table)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "lower/check_collectives.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/parser.h"
#include "lower/pipeline.h"

using namespace meshfuse;
using Clock = std::chrono::steady_clock;

namespace {

template <typename F>
double medianUs(int repeats, F&& f) {
  std::vector<double> us;
  for (int i = 0; i < repeats; ++i) {
    auto start = Clock::now();
    f();
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
  return us[us.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s SOURCE_DIR [repeats]\n", argv[0]);
    return 2;
  }
  const std::string src = argv[1];
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 50;
  const std::vector<std::pair<std::string, SymbolBindings>> files = {
      {"examples/tp_mlp.mf", {{"t", 128}}},      {"examples/sp_mlp.mf", {{"t", 128}}},
      {"examples/decoder_layer.mf", {}},         {"examples/fsdp_mlp.mf", {{"t", 128}}},
      {"examples/pipeline_mlp.mf", {{"t", 128}}},
  };
  std::printf("| program | ranks | communications | compile() us | check-collectives us | ratio |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const auto& [path, sizes] : files) {
    std::ifstream in(src + "/" + path);
    std::stringstream text;
    text << in.rdbuf();
    PipelineOptions o;
    o.sizes = sizes;
    CompiledProgram program;
    double compile_us = medianUs(repeats, [&] { program = compile(parseFusion(text.str(), path), o); });
    size_t comms = 0, ranks = 0;
    double check_us = medianUs(repeats, [&] {
      CommunicationPlan plan = checkCollectives(program, sizes);
      comms = ranks = 0;
      for (int64_t r = 0; r < 64; ++r) try {
          comms += plan.of(r).size();
          ++ranks;
        } catch (const std::out_of_range&) {
        }
    });
    std::printf("| %s | %zu | %zu | %.0f | %.0f | %.3f |\n", path.c_str(), ranks, comms, compile_us, check_us,
                check_us / compile_us);
  }
  return 0;
}
