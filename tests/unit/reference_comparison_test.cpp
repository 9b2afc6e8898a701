// compareWithReference, the check of `meshfuse run --check`: rounding noise that scales with the
// output's largest values passes, wrong programs fail.
#include <gtest/gtest.h>

#include <cmath>

#include "meshfuse/reference.h"

namespace meshfuse {
namespace {

// A reference output reaching `max`, with small elements too: values max * (k / n - 0.5) * 2.
Tensor ramp(DataType dt, int64_t n, double max) {
  std::vector<double> v;
  for (int64_t k = 0; k < n; ++k) v.push_back(roundToDtype(max * (2.0 * k / (n - 1) - 1.0), dt));
  return Tensor::fromValues(dt, {n}, v);
}

Tensor withValue(const Tensor& t, int64_t i, double value) {
  Tensor out = t.clone();
  out.set(i, value);
  return out;
}

TEST(ReferenceComparison, RoundingNoiseOfAnElementScalesWithTheLargestValue) {
  // f32, from the decoder layer on 4 ranks: an element 0.026 off by 1.3e-5 in an output reaching
  // 110 (relative error 5e-4, far above f32's own) is summation-order noise.
  Tensor ref = withValue(ramp(DataType::Float, 101, 110), 50, 0.026);
  ReferenceComparison c = compareWithReference(withValue(ref, 50, 0.026 + 1.3e-5), ref);
  EXPECT_TRUE(c.pass) << c.max_abs_err << " allowed " << c.allowed_abs;
  EXPECT_NEAR(c.max_ref, 110, 1e-4);
  EXPECT_DOUBLE_EQ(c.allowed_abs, kReferenceToleranceEps * 0x1p-23 * c.max_ref);
  // bf16 tensor parallelism: partial sums rounded to bf16 before the allreduce; 0.25 off where
  // the reference is 0.25 (relative error 1) in an output near 66.
  Tensor bref = withValue(ramp(DataType::BFloat16, 101, 66), 50, 0.25);
  EXPECT_TRUE(compareWithReference(withValue(bref, 50, 0.0), bref).pass);
  EXPECT_TRUE(compareWithReference(withValue(bref, 100, 66.5), bref).pass) << "one bf16 ulp at the top";
}

TEST(ReferenceComparison, WrongProgramsStillFail) {
  for (DataType dt : {DataType::Float, DataType::BFloat16, DataType::Half}) {
    Tensor ref = ramp(dt, 101, 60);
    // A dropped allreduce over 2 ranks: each element is one rank's partial sum, here half.
    std::vector<double> half = ref.toValues();
    for (double& x : half) x = roundToDtype(x / 2, dt);
    EXPECT_FALSE(compareWithReference(Tensor::fromValues(dt, {101}, half), ref).pass) << dtypeName(dt);
    // One element off by a quarter of the output's range (a wrong chunk boundary).
    EXPECT_FALSE(compareWithReference(withValue(ref, 10, ref.get(10) + 15), ref).pass) << dtypeName(dt);
    // Another shape.
    EXPECT_FALSE(compareWithReference(Tensor::fromValues(dt, {100}, std::vector<double>(100, 0)), ref).pass);
  }
  // In f32 the tolerance stays tight: 1e-3 of the range is an error, not noise.
  Tensor ref = ramp(DataType::Float, 101, 110);
  EXPECT_FALSE(compareWithReference(withValue(ref, 50, ref.get(50) + 0.11), ref).pass);
}

TEST(ReferenceComparison, IntegersAreExactAndNonFiniteValuesMatchOnlyThemselves) {
  Tensor ints = Tensor::fromValues(DataType::Int64, {3}, {1, 2, 1000000});
  EXPECT_TRUE(compareWithReference(ints, ints).pass);
  EXPECT_FALSE(compareWithReference(withValue(ints, 0, 2), ints).pass);
  Tensor special = Tensor::fromValues(DataType::Float, {3}, {INFINITY, NAN, 1});
  EXPECT_TRUE(compareWithReference(special, special).pass);
  EXPECT_FALSE(compareWithReference(withValue(special, 0, 1e30), special).pass);
  EXPECT_FALSE(compareWithReference(withValue(special, 1, 0), special).pass);
  EXPECT_FALSE(compareWithReference(withValue(special, 2, NAN), special).pass);
}

}  // namespace
}  // namespace meshfuse
