// `meshfuse train`: the CLI face of TrainingExecutor (forward, backward, in-place optimizer step).
#include "train_command.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>

#include "autodiff_commands.h"
#include "cli_common.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/training_executor.h"

namespace meshfuse::cli {
namespace {

// The loss: the output named by --loss, or else the definition's only floating-point scalar.
int64_t lossOutput(const Fusion& f, const std::string& name) {
  if (!name.empty()) return resolve(f, f.outputs(), {name}, "output").at(0);
  std::vector<int64_t> scalars;
  std::vector<std::string> described;
  for (size_t i = 0; i < f.outputs().size(); ++i) {
    const TensorView* o = f.outputs()[i];
    described.push_back(fmt::format("{} (rank {})", f.displayName(o), o->rank()));
    if (o->rank() == 0 && isFloatingPoint(o->dtype())) scalars.push_back(static_cast<int64_t>(i));
  }
  MF_USER_CHECK(scalars.size() == 1, ErrorKind::Value,
                "train: the loss must be a floating-point scalar output; {} (name it with --loss)",
                scalars.empty() ? fmt::format("the outputs are {}", fmt::join(described, ", "))
                                : fmt::format("there are {}", scalars.size()));
  return scalars[0];
}

OptimizerConfig config(const TrainCliOptions& o) {
  if (o.optimizer == "sgd") return SgdOptions{.lr = o.lr, .momentum = o.momentum, .weight_decay = o.weight_decay};
  MF_USER_CHECK(o.optimizer == "adamw", ErrorKind::Value, "train: --optimizer must be sgd or adamw, got '{}'",
                o.optimizer);
  return AdamWOptions{.lr = o.lr, .weight_decay = o.weight_decay};
}

}  // namespace

int runTrain(const Fusion& fusion, const TrainCliOptions& o, const SymbolBindings& sizes,
             const PipelineOptions& pipeline) {
  MF_USER_CHECK(o.steps >= 1, ErrorKind::Value, "train: --steps must be at least 1, got {}", o.steps);
  int64_t loss = lossOutput(fusion, o.loss);
  std::vector<int64_t> params = resolve(fusion, fusion.inputs(), o.wrt, "input");
  std::unique_ptr<Communicator> comm = makeDefaultCommunicator();
  // Every rank makes the same full tensors (same seed) and keeps its block.
  std::vector<Tensor> full = makeInputs(fusion, {}, sizes, o.seed);
  for (int64_t p : params)
    for (int64_t i = 0; i < full[p].numel(); ++i) full[p].set(i, full[p].get(i) * o.init_scale);
  std::vector<ShardedTensor> inputs = inputLayouts(fusion);
  for (size_t i = 0; i < inputs.size(); ++i)
    inputs[i] = inputs[i].placements.empty()
                    ? ShardedTensor{full[i], {}, {}}
                    : distributeTensor(full[i], inputs[i].mesh, inputs[i].placements, comm->rank());
  TrainingOptions options;
  options.executor.pipeline = pipeline;
  TrainingExecutor trainer(fusion.clone(), loss, params, config(o), *comm, options);
  std::vector<std::string> names;
  for (int64_t p : params) names.push_back(fusion.displayName(fusion.inputs()[p]));
  if (comm->rank() == 0)
    std::cout << fmt::format("training {} ({}) with {} (lr {:g}) for {} steps on {} rank(s)\n", fmt::join(names, ", "),
                             fusion.displayName(fusion.outputs()[loss]), o.optimizer, o.lr, o.steps, comm->size());
  for (int64_t s = 1; s <= o.steps; ++s) {
    double l = trainer.step(inputs);
    if (comm->rank() == 0) std::cout << fmt::format("step {}/{}  loss {:.6g}\n", s, o.steps, l) << std::flush;
  }
  return 0;
}

}  // namespace meshfuse::cli
