// Random op chains (fixed seeds) for differential tests of generated kernels against the reference
// executor: the CPU backend's (kernel_differential_test.cpp) and the CUDA emitter's under host
// emulation (cuda_emitter_test.cpp).
#pragma once

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "meshfuse/ir/fusion.h"
#include "meshfuse/ops.h"
#include "meshfuse/tensor.h"

namespace meshfuse::testing_helpers {

// A chain of ops on a value of one random shape; every step keeps that shape (so steps compose)
// and keeps values in a tame range (no overflow, no division by ~0), so that a mismatch means a
// kernel bug rather than ill-conditioning.
class ChainBuilder {
 public:
  ChainBuilder(Fusion& f, DataType dt, uint64_t seed) : f_(f), dt_(dt), rng_(seed) {
    const int64_t rank = pick(1, 4);
    for (int64_t d = 0; d < rank; ++d) shape_.push_back(pick(1, rank <= 2 ? 33 : 9));
  }

  std::vector<Tensor> build() {
    TensorView* cur = input(shape_);
    const int64_t steps = pick(2, 7);
    for (int64_t s = 0; s < steps; ++s) {
      cur = step(cur);
      if (s + 1 < steps && pick(0, 5) == 0) f_.addOutput(cur);  // an intermediate output: a multi-output kernel
    }
    f_.addOutput(cur);
    return inputs_;
  }

 private:
  int64_t pick(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }

  TensorView* input(std::vector<int64_t> shape) {
    std::vector<Extent> s(shape.begin(), shape.end());
    inputs_.push_back(Tensor::random(dt_, shape, rng_()));
    return f_.defineTensor(s, dt_, "in" + std::to_string(inputs_.size() - 1));
  }
  // An input whose shape is the chain's with some dims 1 (it broadcasts).
  TensorView* broadcastInput() {
    std::vector<int64_t> s = shape_;
    for (int64_t& d : s)
      if (pick(0, 2) == 0) d = 1;
    return input(s);
  }
  std::vector<int64_t> someDims() {
    std::vector<int64_t> dims;
    for (int64_t d = 0; d < rank(); ++d)
      if (pick(0, 1)) dims.push_back(d);
    if (dims.empty()) dims.push_back(pick(0, rank() - 1));
    return dims;
  }

  TensorView* step(TensorView* x) {
    switch (pick(0, 12)) {
      case 0: {  // a unary op of the activation family
        switch (pick(0, 6)) {
          case 0: return ops::tanh(x);
          case 1: return ops::sigmoid(x);
          case 2: return ops::gelu(x, pick(0, 1) ? "tanh" : "none");
          case 3: return ops::silu(x);
          case 4: return ops::relu(x);
          case 5: return ops::neg(x);
          default: return ops::abs(x);
        }
      }
      case 1: return ops::exp(ops::neg(ops::abs(x)));
      case 2: return ops::log(ops::add(ops::abs(x), 1.0));
      case 3: {  // a binary op with a broadcast input, an earlier value or a scalar
        ops::Operand y = pick(0, 2) == 0 ? ops::Operand(0.75) : ops::Operand(broadcastInput());
        switch (pick(0, 4)) {
          case 0: return ops::add(x, y);
          case 1: return ops::sub(y, x);
          case 2: return ops::mul(x, y);
          case 3: return ops::maximum(x, y);
          default: return ops::minimum(y, x);
        }
      }
      case 4: return ops::div(x, ops::add(ops::abs(broadcastInput()), 1.0));
      case 5: return ops::where(ops::gt(x, broadcastInput()), x, ops::mul(x, 0.5));
      case 6: {  // x - reduce(x) over some dims, broadcast back
        std::vector<int64_t> dims = someDims();
        switch (pick(0, 2)) {
          case 0: return ops::sub(x, ops::mean(x, dims, true));
          case 1: return ops::sub(x, ops::max(x, dims, true));
          default: return ops::mul(x, ops::rsqrt(ops::add(ops::sum(ops::mul(x, x), dims, true), 1.0)));
        }
      }
      case 7: return ops::softmax(x, pick(0, rank() - 1));
      case 8: {  // normalizations over the last dim (of a value that varies along it)
        TensorView* v = ops::add(x, input(shape_));
        return pick(0, 1) ? ops::layerNorm(v, input({shape_.back()}), input({shape_.back()}))
                          : ops::rmsNorm(v, input({shape_.back()}));
      }
      case 9: {  // a permutation and its inverse around an op
        std::vector<int64_t> perm(rank());
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng_);
        std::vector<int64_t> inv(rank());
        for (int64_t d = 0; d < rank(); ++d) inv[perm[d]] = d;
        return ops::permute(ops::sigmoid(ops::permute(x, perm)), inv);
      }
      case 10: {  // flatten and restore
        int64_t n = 1;
        for (int64_t s : shape_) n *= s;
        return ops::reshape(ops::mul(ops::reshape(x, {n}), 1.5), shape_);
      }
      case 11: {  // split along a dim and concatenate back
        int64_t d = pick(0, rank() - 1);
        if (shape_[d] < 2) return ops::tanh(x);
        int64_t cut = pick(1, shape_[d] - 1);
        std::vector<int64_t> zero(rank(), 0), end = shape_, start = zero;
        end[d] = cut;
        start[d] = cut;
        return ops::cat({ops::slice(x, zero, end), ops::neg(ops::slice(x, start, shape_))}, d);
      }
      default:  // a round trip through the other float dtype
        return ops::cast(ops::cast(x, dt_ == DataType::Float ? DataType::BFloat16 : DataType::Float), dt_);
    }
  }

  Fusion& f_;
  DataType dt_;
  std::mt19937_64 rng_;
  std::vector<int64_t> shape_;
  std::vector<Tensor> inputs_;
};

}  // namespace meshfuse::testing_helpers
