// gradCheck: autodiff's backward fusion against central finite differences, in f64 on the
// reference executor (include/meshfuse/grad_check.h).
#include "meshfuse/grad_check.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "meshfuse/ir/fusion.h"

namespace meshfuse {
namespace {

std::vector<double> uniform(int64_t n, std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = d(rng);
  return v;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

std::vector<ReferenceArray> randomInputs(const Fusion& fusion, const SymbolBindings& sizes, uint64_t seed,
                                         double low, double high) {
  std::mt19937_64 rng(seed);
  std::vector<ReferenceArray> out;
  for (const TensorView* in : fusion.inputs()) {
    std::vector<int64_t> shape = in->evaluateShape(sizes);
    std::vector<double> v = uniform(numel(shape), rng, low, high);
    if (!isFloatingPoint(in->dtype()))
      for (double& x : v) x = in->dtype() == DataType::Bool ? (x > (low + high) / 2 ? 1 : 0) : std::floor((x - low) / (high - low) * 4);
    out.push_back({shape, v});
  }
  return out;
}

GradCheckResult gradCheck(const Fusion& fusion, const std::vector<int64_t>& outputs, const std::vector<int64_t>& wrt,
                          const std::vector<ReferenceArray>& inputs, const GradCheckOptions& options) {
  Gradients g = differentiate(fusion, outputs, wrt, options.autodiff);
  std::mt19937_64 rng(options.seed);

  // The derived gradients: forward (with saves), then backward, fed as backward_inputs says.
  std::vector<ReferenceArray> fwd_out = evaluateReferenceF64(*g.forward, inputs);
  std::vector<std::vector<double>> seeds;
  for (int64_t o : outputs) seeds.push_back(uniform(static_cast<int64_t>(fwd_out[o].data.size()), rng, -1, 1));
  std::vector<ReferenceArray> bwd_in;
  for (const BackwardInput& b : g.backward_inputs) {
    switch (b.kind) {
      case BackwardInput::ForwardInput: bwd_in.push_back(inputs[b.index]); break;
      case BackwardInput::ForwardOutput: bwd_in.push_back(fwd_out[b.index]); break;
      case BackwardInput::Seed: bwd_in.push_back({fwd_out[outputs[b.index]].shape, seeds[b.index]}); break;
    }
  }
  std::vector<ReferenceArray> grads = evaluateReferenceF64(*g.backward, bwd_in);

  // L(x) = sum_i <seed_i, output_i(x)> on the original definition.
  auto loss = [&](const std::vector<ReferenceArray>& in) {
    std::vector<ReferenceArray> outs = evaluateReferenceF64(fusion, in);
    double l = 0;
    for (size_t i = 0; i < outputs.size(); ++i) l += dot(seeds[i], outs[outputs[i]].data);
    return l;
  };
  GradCheckResult result;
  result.pass = true;
  std::vector<ReferenceArray> x = inputs;
  for (size_t w = 0; w < wrt.size(); ++w) {
    auto& data = x[wrt[w]].data;
    GradCheckResult::Input r{wrt[w], fusion.displayName(fusion.inputs()[wrt[w]]), 0, 0, 0, true};
    MF_CHECK(grads[w].data.size() == data.size(), "gradient {} has {} elements for an input of {}", w,
             grads[w].data.size(), data.size());
    for (size_t j = 0; j < data.size(); ++j) {
      double x0 = data[j], h = options.step * std::max(1.0, std::abs(x0));
      data[j] = x0 + h;
      double lp = loss(x);
      data[j] = x0 - h;
      double lm = loss(x);
      data[j] = x0;
      double fd = (lp - lm) / (2 * h);
      double err = std::abs(grads[w].data[j] - fd);
      if (std::isnan(err)) err = INFINITY;
      r.max_abs_err = std::max(r.max_abs_err, err);
      r.max_fd = std::max(r.max_fd, std::abs(fd));
    }
    // Against the gradient's scale; the floor keeps f64 round-off (~1e-11) of all-but-zero gradients
    // from reading as a large relative error.
    r.rel_err = r.max_abs_err / std::max(r.max_fd, 1e-2);
    r.pass = r.rel_err <= options.tolerance;
    result.pass &= r.pass;
    result.inputs.push_back(r);
  }
  return result;
}

}  // namespace meshfuse
