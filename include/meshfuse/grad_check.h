// Gradient checking: the derived backward fusion (autodiff) against central finite differences
// of the forward, both evaluated by the reference executor in f64 (no rounding to the dtypes).
//
// The scalar checked is L = sum over the differentiated outputs of <seed_i, output_i> with fixed
// pseudo-random seeds, so every element of every output's Jacobian takes part.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshfuse/autodiff.h"
#include "meshfuse/reference.h"

namespace meshfuse {

struct GradCheckOptions {
  double step = 1e-5;       // h (times max(1, |x|)) of the central difference (L(x+h) - L(x-h)) / 2h
  double tolerance = 1e-6;  // the largest relative error (below) that passes
  uint64_t seed = 1;        // of the output seeds
  AutodiffOptions autodiff;
};

struct GradCheckResult {
  struct Input {
    int64_t index;        // into the fusion's inputs
    std::string name;     // its display name
    double max_abs_err;   // max_j |derived_j - fd_j|
    double max_fd;        // max_j |fd_j|
    double rel_err;       // max_abs_err / max(max_fd, 1e-2): the error against the gradient's scale
    bool pass;
  };
  std::vector<Input> inputs;  // one per wrt input
  bool pass = false;
};

// `inputs`: one array per fusion input (integer and bool inputs hold whole numbers).
GradCheckResult gradCheck(const Fusion& fusion, const std::vector<int64_t>& outputs, const std::vector<int64_t>& wrt,
                          const std::vector<ReferenceArray>& inputs, const GradCheckOptions& options = {});

// Pseudo-random values for the inputs of `fusion` with symbolic sizes bound by `sizes`: floats
// uniform in [low, high], integers in [0, 4), bools at random.
std::vector<ReferenceArray> randomInputs(const Fusion& fusion, const SymbolBindings& sizes, uint64_t seed,
                                         double low = -1, double high = 1);

}  // namespace meshfuse
