// `meshfuse dump --stage=backward` and `meshfuse grad-check` (docs/training.md).
#pragma once

#include <string>
#include <vector>

#include "meshfuse/grad_check.h"
#include "lower/pipeline.h"

namespace meshfuse::cli {

struct AutodiffCliOptions {
  std::vector<std::string> wrt;      // input names (or indices); empty: every floating-point input
  std::vector<std::string> outputs;  // output names (or indices); empty: every floating-point output
  bool save_all = false;             // SavePolicy::All instead of the default
};

// Indices of `names` among `list` (a display name, with or without '%', or an index); every
// floating-point entry when `names` is empty. `what` is "input" (option --wrt) or "output".
std::vector<int64_t> resolve(const Fusion& f, const std::vector<TensorView*>& list, const std::vector<std::string>& names,
                             const char* what);

// The forward fusion with its saves and the backward fusion, as .mf text separated by a
// '# -----' line (so `meshfuse print --split-input-file` reads them back), each headed by comments.
// A definition with meshes is differentiated after propagate-shardings (with `pipeline`'s options).
std::string dumpBackward(const Fusion& fusion, const AutodiffCliOptions& o, const PipelineOptions& pipeline);

// Prints the worst relative error per wrt input; returns whether every input passed.
bool runGradCheck(const Fusion& fusion, const AutodiffCliOptions& o, const SymbolBindings& sizes,
                  const GradCheckOptions& check, double low, double high, uint64_t seed);

}  // namespace meshfuse::cli
