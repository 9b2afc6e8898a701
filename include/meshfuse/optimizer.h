// Optimizer steps as fusions that update parameters and their state in place (DESIGN.md
// "Training"): one ordinary fusion of pointwise ops per parameter shape, so propagation places
// the state like the parameter, every backend runs it, and no kernel is special.
//
//   OptimizerStep s = buildOptimizerStep(AdamWOptions{.lr = 1e-3}, {{{64, 16}, DataType::BFloat16}});
//   // s.fusion inputs:  param (bf16), master (f32), grad, exp_avg, exp_avg_sq (per parameter),
//   //                   then s.scalars
//   // s.fusion outputs: the new param, master, exp_avg, exp_avg_sq, each aliased to its input
//   std::vector<double> h = optimizerScalars(config, /*step=*/1);   // the scalar inputs' values
//
// The step count, learning rate and bias corrections enter as scalar (rank-0) inputs, so a step
// compiles once. The semantics are torch.optim.SGD's (dampening 0) and
// torch.optim.AdamW's (amsgrad off), formula for formula; a bf16/f16 parameter keeps an f32
// master copy and f32 state, and is the master rounded after each step.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "meshfuse/ir/fusion.h"

namespace meshfuse {

struct SgdOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double weight_decay = 0.0;  // added to the gradient (L2), as torch.optim.SGD
  bool nesterov = false;      // needs momentum > 0
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;           // may be 0
  double weight_decay = 0.01;  // decoupled: p *= 1 - lr * weight_decay
};

using OptimizerConfig = std::variant<SgdOptions, AdamWOptions>;

// Checks the hyper-parameters as torch does (ValueError naming the bad one).
void checkOptimizerConfig(const OptimizerConfig& config);
std::string optimizerName(const OptimizerConfig& config);  // "sgd" | "adamw"

// The fused update of a group of parameters: one fusion, so one program per step.
struct OptimizerStep {
  struct Param {
    bool has_master = false;   // input first_input + 1 is the f32 master copy of the parameter
    int64_t first_input = 0;   // inputs: param, master (if any), grad, state... (OptimizerStep::state)
    int64_t first_output = 0;  // outputs: param, master (if any), state..., each aliased to its input
    int64_t gradInput() const { return first_input + (has_master ? 2 : 1); }
    int64_t stateInput(size_t k) const { return gradInput() + 1 + static_cast<int64_t>(k); }
  };
  std::unique_ptr<Fusion> fusion;
  std::vector<Param> params;
  std::vector<std::string> state;    // per-parameter state tensors (f32, zero before the first step)
  std::vector<std::string> scalars;  // the scalar inputs (rank 0, f32), last, in optimizerScalars order
  int64_t scalarInput(size_t k) const { return numParamInputs() + static_cast<int64_t>(k); }
  int64_t numParamInputs() const;
};

struct ParamType {
  std::vector<Extent> shape;
  DataType dtype = DataType::Float;  // floating-point; the gradient has the same dtype
};

// The fused update of parameters of these shapes and dtypes (a DtypeError naming the parameter
// for a non-floating-point one). bf16/f16 parameters get an f32 master copy.
OptimizerStep buildOptimizerStep(const OptimizerConfig& config, const std::vector<ParamType>& params);

// The scalar inputs' values for step `step` (1 for the first step), in OptimizerStep::scalars order.
std::vector<double> optimizerScalars(const OptimizerConfig& config, int64_t step);

}  // namespace meshfuse
