// The C++ API for custom trainers: forward, backward and an in-place optimizer step of a
// single-device definition, on this rank's shards (DESIGN.md "Training").
//
//   TrainingExecutor trainer(std::move(def), /*loss=*/0, /*params=*/{1, 2}, AdamWOptions{.lr = 1e-3}, *comm);
//   for (...) {
//     double loss = trainer.step({x, w1, w2});   // w1, w2: ShardedTensors, updated in place
//   }
//
// A step runs three kinds of programs, each compiled once per input layout and cached: the
// forward extended with what backward needs, the backward (autodiff's fusion through the normal
// pipeline: sharded parameters get derived gradient collectives) and one optimizer fusion per
// parameter, whose outputs are aliased to the parameter and state buffers (written in place, no
// copy, no allocation). The optimizer state (and the f32 master copy of a bf16/f16 parameter)
// is created at the first step with the parameter's local shape, mesh and placements.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "meshfuse/autodiff.h"
#include "meshfuse/executor.h"
#include "meshfuse/optimizer.h"

namespace meshfuse {

struct TrainingOptions {
  ExecutorOptions executor;
  AutodiffOptions autodiff;
};

// One parameter's optimizer state on this rank (OptimizerStep::state order; master first if any).
struct ParameterState {
  std::vector<ShardedTensor> tensors;
  std::vector<std::string> names;  // "master", "exp_avg", ...
};

struct PhaseCollective {
  std::string phase;  // "forward" | "backward" | "optimizer"
  CollectiveInfo info;
};

class TrainingExecutor {
 public:
  // `loss` indexes the definition's outputs (a floating-point scalar); `params` its inputs
  // (floating-point, distinct). Errors: ValueError for a bad loss or a parameter that is not an
  // input, DtypeError for an integer parameter or loss, ShapeError for a non-scalar loss.
  TrainingExecutor(std::unique_ptr<Fusion> definition, int64_t loss, std::vector<int64_t> params,
                   OptimizerConfig optimizer, Communicator& comm, TrainingOptions options = {});
  ~TrainingExecutor();

  // Forward, backward and the optimizer update of every parameter, in place in the parameters'
  // local blocks (`inputs` holds every input of the definition; all ranks call it). Returns the
  // loss as this rank holds it (the replicated scalar: the same on every rank).
  double step(const std::vector<ShardedTensor>& inputs);

  // The gradients of the last step, one per parameter, laid out as the parameter.
  const std::vector<ShardedTensor>& lastGradients() const { return last_grads_; }
  const ParameterState& state(size_t param) const { return states_.at(param); }
  int64_t steps() const { return steps_; }
  // The collectives of the last step, in execution order, each with the program that ran it.
  std::vector<PhaseCollective> lastCollectives() const;
  // Forward-and-backward compilations so far (one per input layout).
  int64_t compilations() const { return static_cast<int64_t>(programs_.size()); }
  const Fusion& definition() const { return *definition_; }

 private:
  struct Programs;
  Programs& programsFor(const std::vector<ShardedTensor>& inputs);
  void initState(Programs& p, const std::vector<ShardedTensor>& inputs);
  void update(Programs& p, const std::vector<ShardedTensor>& inputs);

  std::unique_ptr<Fusion> definition_;
  int64_t loss_;
  std::vector<int64_t> params_;
  OptimizerConfig optimizer_;
  Communicator& comm_;
  TrainingOptions options_;
  std::map<std::string, std::unique_ptr<Programs>> programs_;
  Programs* last_ = nullptr;
  std::vector<ParameterState> states_;
  std::vector<ShardedTensor> last_grads_;
  int64_t steps_ = 0;
};

}  // namespace meshfuse
