// Shared helpers of the GPU tests: skipping without a device, moving tensors, comparing with the
// CPU or the reference within the tolerance model of reference.h.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "meshfuse/ops.h"
#include "meshfuse/reference.h"
#include "runtime/backend.h"
#include "runtime/cuda.h"
#include "meshfuse/tensor.h"

namespace meshfuse::cuda_testing {

// In a TEST body: skips (with the driver's reason) on machines without a GPU.
#define MF_REQUIRE_CUDA()                                                                            \
  do {                                                                                               \
    if (!::meshfuse::cudaDeviceAvailable())                                                          \
      GTEST_SKIP() << ::meshfuse::cudaDeviceDescription()                                            \
                   << " -- GPU tests run on a GPU machine (scripts/gpu-check)";                      \
  } while (0)

// Within the one tolerance model of every comparison in meshfuse (reference.h,
// compareWithReference; the CLI's --check uses it too): element i passes when
// |got_i - want_i| <= 16 eps(dtype) (max_j |want_j| + |want_i|). Exact for i64 and bool.
inline ::testing::AssertionResult closeTo(const Tensor& got_any, const Tensor& want, Backend* backend) {
  Tensor got = got_any.device() == Device::Cpu ? got_any : backend->download(got_any);
  if (got.dtype() != want.dtype() || got.shape() != want.shape())
    return ::testing::AssertionFailure() << "got " << dtypeName(got.dtype()) << got.shapeString() << ", want "
                                         << dtypeName(want.dtype()) << want.shapeString();
  ReferenceComparison c = compareWithReference(got, want);
  if (c.pass) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max abs err " << c.max_abs_err << " (max rel err " << c.max_rel_err
                                       << "), allowed " << c.allowed_abs << " + " << kReferenceToleranceEps << " eps("
                                       << dtypeName(want.dtype()) << ") |ref| with max|ref| = " << c.max_ref;
}

// Bit for bit (copies, data movement): element i of `got` equals element i of `want`.
inline ::testing::AssertionResult sameValues(const Tensor& got_any, const Tensor& want, Backend* backend) {
  Tensor got = got_any.device() == Device::Cpu ? got_any : backend->download(got_any);
  if (got.dtype() != want.dtype() || got.shape() != want.shape())
    return ::testing::AssertionFailure() << "got " << dtypeName(got.dtype()) << got.shapeString() << ", want "
                                         << dtypeName(want.dtype()) << want.shapeString();
  if (got.nbytes() == 0 || std::memcmp(got.data(), want.data(), got.nbytes()) == 0)
    return ::testing::AssertionSuccess();
  for (int64_t i = 0; i < got.numel(); ++i)
    if (got.get(i) != want.get(i) && !(std::isnan(got.get(i)) && std::isnan(want.get(i))))
      return ::testing::AssertionFailure() << "element " << i << ": got " << got.get(i) << ", want " << want.get(i);
  return ::testing::AssertionFailure() << "the bytes differ (NaN payloads)";
}

// One program per op of the IR (plus an MLP block), with odd sizes so that vectorized loops have
// tails: what the GPU tests and the emitter tests run.
struct OpCase {
  std::string name;
  std::vector<std::vector<int64_t>> shapes;
  std::function<TensorView*(std::vector<TensorView*>)> build;
  bool positive = false;  // inputs must be > 0 (log, sqrt, pow)
  // Inputs that are i64 indices instead, by input position: values in [first, second) (a range
  // reaching outside a table's rows checks the out-of-range rule).
  std::map<size_t, std::pair<int64_t, int64_t>> indices = {};
};

inline std::vector<OpCase> opCases() {
  using T = std::vector<TensorView*>;
  const std::vector<int64_t> m = {33, 130};  // odd sizes: tails of vectorized loops
  std::vector<OpCase> c = {
      {"neg", {m}, [](T t) { return ops::neg(t[0]); }},
      {"abs", {m}, [](T t) { return ops::abs(t[0]); }},
      {"exp", {m}, [](T t) { return ops::exp(t[0]); }},
      {"log", {m}, [](T t) { return ops::log(t[0]); }, true},
      {"sqrt", {m}, [](T t) { return ops::sqrt(t[0]); }, true},
      {"rsqrt", {m}, [](T t) { return ops::rsqrt(t[0]); }, true},
      {"reciprocal", {m}, [](T t) { return ops::reciprocal(t[0]); }, true},
      {"tanh", {m}, [](T t) { return ops::tanh(t[0]); }},
      {"sigmoid", {m}, [](T t) { return ops::sigmoid(t[0]); }},
      {"relu", {m}, [](T t) { return ops::relu(t[0]); }},
      {"silu", {m}, [](T t) { return ops::silu(t[0]); }},
      {"gelu", {m}, [](T t) { return ops::gelu(t[0]); }},
      {"gelu_tanh", {m}, [](T t) { return ops::gelu(t[0], "tanh"); }},
      {"add_broadcast", {m, {1, 130}}, [](T t) { return ops::add(t[0], t[1]); }},
      {"sub_scalar", {m}, [](T t) { return ops::sub(3.0, t[0]); }},
      {"mul", {m, m}, [](T t) { return ops::mul(t[0], t[1]); }},
      {"div", {m, m}, [](T t) { return ops::div(t[0], t[1]); }, true},
      {"pow", {m}, [](T t) { return ops::pow(t[0], 1.5); }, true},
      {"maximum", {m, m}, [](T t) { return ops::maximum(t[0], t[1]); }},
      {"minimum", {m, m}, [](T t) { return ops::minimum(t[0], t[1]); }},
      {"where_gt", {m, m}, [](T t) { return ops::where(ops::gt(t[0], t[1]), t[0], t[1]); }},
      {"cast_f32", {m}, [](T t) { return ops::cast(t[0], DataType::Float); }},
      {"sum", {{4, 33, 130}}, [](T t) { return ops::sum(t[0], {2}); }},
      {"sum_outer", {{4, 33, 130}}, [](T t) { return ops::sum(t[0], {0}); }},
      // Reductions the emitter spreads in other ways: over the outer dim of a tall matrix
      // (columns mode), over a middle dim (loops interchanged in each row), over everything
      // (partial results of a grid, then combined).
      {"sum_outer_tall", {{600, 70}}, [](T t) { return ops::sum(t[0], {0}); }},
      {"sum_middle", {{4, 50, 33}}, [](T t) { return ops::sum(t[0], {1}); }},
      {"sum_all", {{100, 90}}, [](T t) { return ops::sum(t[0], {0, 1}); }},
      {"max_all", {{100, 90}}, [](T t) { return ops::max(t[0], {0, 1}); }},
      {"mean_outer_keepdim", {{300, 17}}, [](T t) { return ops::mean(t[0], {0}, true); }},
      {"cast_i64", {m}, [](T t) { return ops::cast(ops::mul(t[0], 100.0), DataType::Int64); }},
      {"max", {m}, [](T t) { return ops::max(t[0], {1}); }},
      {"mean", {m}, [](T t) { return ops::mean(t[0], {1}, true); }},
      {"broadcast_in_dim", {{130}}, [](T t) { return ops::broadcastInDim(t[0], {33, 130}, {1}); }},
      {"reshape", {m}, [](T t) { return ops::reshape(t[0], {130, 33}); }},
      {"permute", {{4, 33, 130}}, [](T t) { return ops::permute(t[0], {2, 0, 1}); }},
      {"slice", {m}, [](T t) { return ops::slice(t[0], {1, 5}, {30, 129}); }},
      {"cat", {m, {33, 7}}, [](T t) { return ops::cat({t[0], t[1]}, 1); }},
      {"softmax", {m}, [](T t) { return ops::softmax(t[0], 1); }},
      {"softmax_dim0", {m}, [](T t) { return ops::softmax(t[0], 0); }},
      {"layer_norm", {m, {130}, {130}}, [](T t) { return ops::layerNorm(t[0], t[1], t[2]); }},
      {"rms_norm", {m, {130}}, [](T t) { return ops::rmsNorm(t[0], t[1]); }},
      {"linear", {m, {64, 130}, {64}}, [](T t) { return ops::linear(t[0], t[1], t[2]); }},
      {"matmul", {{2, 33, 130}, {2, 130, 17}}, [](T t) { return ops::matmul(t[0], t[1]); }},
      {"sdpa", {{2, 4, 40, 32}, {2, 4, 40, 32}, {2, 4, 40, 32}}, [](T t) { return ops::sdpa(t[0], t[1], t[2]); }},
      {"sdpa_causal", {{2, 4, 40, 32}, {2, 4, 40, 32}, {2, 4, 40, 32}},
       [](T t) { return ops::sdpa(t[0], t[1], t[2], true); }},
      // Sequences that are no multiple of the attention kernel's tiles, more keys than queries,
      // a value head size unlike the query's; and the log-sum-exp alone.
      {"sdpa_uneven_causal", {{1, 2, 37, 24}, {1, 2, 70, 24}, {1, 2, 70, 16}},
       [](T t) { return ops::sdpa(t[0], t[1], t[2], true); }},
      {"sdpa_lse_causal", {{1, 2, 37, 24}, {1, 2, 70, 24}}, [](T t) { return ops::sdpaLse(t[0], t[1], true); }},
      // Training ops: a gather, a scatter-add (repeated and out-of-range rows), a class-index map,
      // the loss in each reduction.
      {"log_softmax", {m}, [](T t) { return ops::logSoftmax(t[0], 1); }},
      {"embedding", {{50, 130}, {4, 33}}, [](T t) { return ops::embedding(t[0], t[1]); }, false, {{1, {-2, 53}}}},
      {"embedding_grouped", {{2, 20, 130}, {2, 33}}, [](T t) { return ops::embedding(t[0], t[1]); }, false,
       {{1, {-1, 21}}}},
      {"embedding_backward", {{4, 33, 130}, {4, 33}}, [](T t) { return ops::embeddingBackward(t[0], t[1], 50); },
       false, {{1, {-1, 51}}}},
      {"embedding_backward_grouped", {{2, 33, 130}, {2, 33}},
       [](T t) { return ops::embeddingBackward(t[0], t[1], 20, true); }, false, {{1, {0, 20}}}},
      {"one_hot", {{4, 33}}, [](T t) { return ops::oneHot(t[0], 37); }, false, {{0, {-1, 38}}}},
      {"cross_entropy", {m, {33}}, [](T t) { return ops::crossEntropy(t[0], t[1]); }, false, {{1, {0, 130}}}},
      {"cross_entropy_sum_ignore", {m, {33}}, [](T t) { return ops::crossEntropy(t[0], t[1], 3, "sum"); }, false,
       {{1, {0, 8}}}},
      {"cross_entropy_none", {{4, 37, 9}, {4, 9}}, [](T t) { return ops::crossEntropy(t[0], t[1], -100, "none"); },
       false, {{1, {0, 37}}}},
      {"mlp_block", {{64, 128}, {256, 128}, {128, 256}},
       [](T t) { return ops::add(ops::linear(ops::gelu(ops::linear(t[0], t[1]), "tanh"), t[2]), t[0]); }},
  };
  return c;
}

// An i64 tensor of `shape` with pseudo-random values in [lo, hi) (each value appears, repeats
// included, when there are enough elements).
inline Tensor indexTensor(const std::vector<int64_t>& shape, int64_t lo, int64_t hi, uint64_t seed) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<double> v(static_cast<size_t>(n));
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (double& e : v) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    e = static_cast<double>(lo + static_cast<int64_t>(x % static_cast<uint64_t>(hi - lo)));
  }
  return Tensor::fromValues(DataType::Int64, shape, v);
}

// Builds case `c` in `def` with inputs of dtype `dt` (indices i64); returns its seeded inputs.
inline std::vector<Tensor> buildCase(const OpCase& c, DataType dt, Fusion& def) {
  std::vector<TensorView*> tvs;
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < c.shapes.size(); ++i) {
    std::vector<Extent> shape(c.shapes[i].begin(), c.shapes[i].end());
    if (auto r = c.indices.find(i); r != c.indices.end()) {
      tvs.push_back(def.defineTensor(shape, DataType::Int64, "in" + std::to_string(i)));
      inputs.push_back(indexTensor(c.shapes[i], r->second.first, r->second.second, 11 + i));
      continue;
    }
    tvs.push_back(def.defineTensor(shape, dt, "in" + std::to_string(i)));
    Tensor t = Tensor::random(dt, c.shapes[i], 11 + i);
    if (c.positive)
      for (int64_t j = 0; j < t.numel(); ++j) t.set(j, 0.25 + std::fabs(t.get(j)));
    inputs.push_back(t);
  }
  def.addOutput(c.build(tvs));
  return inputs;
}

}  // namespace meshfuse::cuda_testing
