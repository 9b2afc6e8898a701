// The compilation pipeline: the one function that runs the passes in order (DESIGN.md "Data
// flow"). The CLI, the C++ API and Python all call it.
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace meshfuse {

class Fusion;

struct PipelineOptions {
  bool verify = true;                // run the verifier after every pass
  std::ostream* dump = nullptr;      // when set, print the IR after each pass here
  std::ostream* timing = nullptr;    // when set, print each pass's wall time here
};

struct FusionPass {
  std::string name;         // the CLI's --pass=NAME
  std::string description;  // one line for --help
  std::function<void(Fusion&)> run;
};

// Every fusion-to-fusion pass, in pipeline order.
const std::vector<FusionPass>& fusionPasses();
// Throws ValueError listing the known passes when `name` is unknown.
const FusionPass& findPass(std::string_view name);
// Runs the named passes in the given order, verifying (and dumping) between them.
void runPasses(Fusion& fusion, const std::vector<std::string>& names, const PipelineOptions& options = {});

}  // namespace meshfuse
