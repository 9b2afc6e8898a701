// `meshfuse train` (docs/training.md): TrainingExecutor on seeded random data.
#pragma once

#include <string>
#include <vector>

#include "meshfuse/ir/extent.h"

namespace meshfuse {
class Fusion;
struct PipelineOptions;
}

namespace meshfuse::cli {

struct TrainCliOptions {
  int64_t steps = 10;
  std::string optimizer = "adamw";  // sgd | adamw
  double lr = 1e-3;
  double momentum = 0.0;         // sgd
  double weight_decay = 0.0;     // sgd (L2) and adamw (decoupled)
  std::vector<std::string> wrt;  // parameters by name or index; empty: every floating-point input
  std::string loss;              // the loss output (name or index); empty: the only scalar f.p. output
  uint64_t seed = 0;
  double init_scale = 0.1;  // parameters start uniform in [-scale, scale); data in [-1, 1)
};

// Trains `fusion` (its inputs' placements shard it over the MPI ranks) for o.steps steps on one
// fixed random batch, printing "step i/N  loss L" per step on rank 0, compiled with `pipeline`'s
// options (--cp, --overlap, --fsdp, ...). Returns the exit status.
int runTrain(const Fusion& fusion, const TrainCliOptions& o, const SymbolBindings& sizes,
             const PipelineOptions& pipeline);

}  // namespace meshfuse::cli
