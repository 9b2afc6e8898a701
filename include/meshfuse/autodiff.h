// Reverse-mode automatic differentiation of a Fusion (DESIGN.md "Training").
//
//   Gradients g = differentiate(fusion, /*outputs=*/{0}, /*wrt=*/{1, 2});
//   // g.forward:  the fusion's outputs, then the tensors backward needs (saved)
//   // g.backward: inputs = g.backward_inputs (saved tensors, then one seed per differentiated
//   //             output); outputs = one gradient per wrt input, with its shape and dtype
//
// Both are ordinary fusions: propagation, decomposition, overlap and lowering treat the backward
// like any program, so gradient collectives are derived. Placements: a backward input takes its
// forward tensor's mesh and placements (a seed its output's, Partial read as Replicate), and each
// gradient output is pinned to its input's, when the forward tensors have them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "meshfuse/ir/fusion.h"

namespace meshfuse {

// What the forward keeps for backward. Either way a tensor backward needs that is not kept is
// recomputed in the backward fusion from kept ones (the dumps show which).
enum class SavePolicy {
  GemmAndAttention,  // default: keep GEMM (linear, matmul) and sdpa outputs; recompute the rest
  All,               // keep every intermediate backward reads
};

struct AutodiffOptions {
  SavePolicy policy = SavePolicy::GemmAndAttention;
};

// Where a backward input comes from.
struct BackwardInput {
  enum Kind { ForwardInput, ForwardOutput, Seed } kind;
  int64_t index;       // into the forward fusion's inputs / outputs, or into `outputs` (seeds)
  std::string reason;  // "input", "GEMM output (linear)", "seed of output 0", ...
};

struct Gradients {
  std::unique_ptr<Fusion> forward;   // original outputs first, then the saved intermediates
  std::unique_ptr<Fusion> backward;  // gradients of the wrt inputs, in wrt order
  int64_t num_original_outputs = 0;
  std::vector<BackwardInput> backward_inputs;  // one per backward input, in order
  std::vector<std::string> recomputed;         // backward ops that recompute forward values ("%5 = gelu")
};

// Differentiates outputs `outputs` (indices into fusion.outputs()) with respect to inputs `wrt`
// (indices into fusion.inputs()). Throws DtypeError naming the input when a wrt input (or an
// output) is not floating-point, ValueError on a bad or repeated index.
Gradients differentiate(const Fusion& fusion, const std::vector<int64_t>& outputs, const std::vector<int64_t>& wrt,
                        const AutodiffOptions& options = {});

// The gradient rule of every op (grad_rules.def), in op-table order: {op name, rule, formula}.
// An op has no rule only if the build is broken (the list is checked at compile time).
struct GradientRuleInfo {
  std::string_view op;
  std::string_view rule;  // "none": the op's output has no gradient (bool)
  std::string_view formula;
};
const std::vector<GradientRuleInfo>& gradientRules();

// "# saved for backward: ...\n# recomputed in backward: ...\n": the policy's decisions, as .mf
// comments (what `meshfuse dump --stage=backward` prints above the two fusions).
std::string describeSaves(const Gradients& g);

}  // namespace meshfuse
