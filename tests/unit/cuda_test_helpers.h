// Shared helpers of the GPU tests: skipping without a device, moving tensors, comparing with the
// CPU within dtype-appropriate tolerances.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "meshfuse/runtime/backend.h"
#include "meshfuse/runtime/cuda.h"
#include "meshfuse/tensor.h"

namespace meshfuse::cuda_testing {

// In a TEST body: skips (with the driver's reason) on machines without a GPU.
#define MF_REQUIRE_CUDA()                                                                            \
  do {                                                                                               \
    if (!::meshfuse::cudaDeviceAvailable())                                                          \
      GTEST_SKIP() << ::meshfuse::cudaDeviceDescription()                                            \
                   << " -- GPU tests run on a GPU machine (scripts/gpu-check)";                      \
  } while (0)

// |got - want| <= atol + rtol * |want|: f32 to accumulation-order noise (no TF32), 16-bit types
// to about one unit in the last place of their storage.
struct Tolerance {
  double atol, rtol;
};
inline Tolerance toleranceFor(DataType dt) {
  switch (dt) {
    case DataType::BFloat16: return {2e-2, 1.6e-2};
    case DataType::Half: return {2e-3, 2e-3};
    case DataType::Float: return {1e-5, 1e-5};
    default: return {0, 0};
  }
}

inline ::testing::AssertionResult closeTo(const Tensor& got_any, const Tensor& want, Backend* backend,
                                          Tolerance tol) {
  Tensor got = got_any.device() == Device::Cpu ? got_any : backend->download(got_any);
  if (got.dtype() != want.dtype() || got.shape() != want.shape())
    return ::testing::AssertionFailure() << "got " << dtypeName(got.dtype()) << got.shapeString() << ", want "
                                         << dtypeName(want.dtype()) << want.shapeString();
  double worst = 0;
  int64_t worst_i = -1;
  for (int64_t i = 0; i < got.numel(); ++i) {
    double g = got.get(i), w = want.get(i);
    double excess = std::fabs(g - w) - (tol.atol + tol.rtol * std::fabs(w));
    if ((std::isnan(g) != std::isnan(w)) || excess > worst) {
      worst = std::isnan(g) != std::isnan(w) ? INFINITY : excess;
      worst_i = i;
    }
  }
  if (worst_i < 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << worst_i << ": got " << got.get(worst_i) << ", want "
                                       << want.get(worst_i) << " (atol " << tol.atol << ", rtol " << tol.rtol << ")";
}

inline ::testing::AssertionResult closeTo(const Tensor& got, const Tensor& want, Backend* backend) {
  return closeTo(got, want, backend, toleranceFor(want.dtype()));
}

}  // namespace meshfuse::cuda_testing
