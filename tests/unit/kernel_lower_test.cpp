// Lowering segments to kernel IR: the loop structure each kind of segment gets (checked on the
// printed program), and that the CPU emitter's loops vectorize.
#include <gtest/gtest.h>

#include "meshfuse/ir/fusion.h"
#include "codegen/kernel_ir.h"
#include "meshfuse/ops.h"
#include "lower/segment.h"

namespace meshfuse {
namespace {

std::vector<int64_t> staticShape(const TensorView* tv) {
  std::vector<int64_t> s;
  for (const Extent& e : tv->shape()) s.push_back(e.value());
  return s;
}

// The programs of every kernel/GEMM segment of `f`, printed.
std::vector<std::string> lowered(const Fusion& f) {
  std::vector<std::string> out;
  for (const Segment& s : segmentFusion(f))
    out.push_back(kir::printProgram(kir::lowerSegment(f, s, staticShape, "seg")));
  return out;
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

TEST(KernelLower, RowSoftmaxIsOnePassPerRowWithItsStatisticsInRegisters) {
  Fusion f;
  f.addOutput(ops::softmax(f.defineTensor({6, 10}, DataType::Float, "x"), 1));
  std::vector<std::string> p = lowered(f);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(count(p[0], "buffer"), 2) << p[0];            // x and the output: no temporaries
  EXPECT_EQ(count(p[0], "for i0 in [0, 6)"), 1) << p[0];  // the shared row loop
  EXPECT_EQ(count(p[0], "in [0, 10)"), 3) << p[0];        // max, sum of exp, normalize
  EXPECT_NE(p[0].find("acc"), std::string::npos) << p[0];
}

TEST(KernelLower, ReducingTheOuterDimNeedsAFullTemporary) {
  Fusion f;
  TensorView* x = f.defineTensor({6, 10}, DataType::Float, "x");
  f.addOutput(ops::sub(x, ops::max(x, {0}, true)));
  std::vector<std::string> p = lowered(f);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("temp f32[10]"), std::string::npos) << p[0];  // the column maxima
}

TEST(KernelLower, LayerNormOfBf16AccumulatesInF32) {
  Fusion f;
  TensorView* x = f.defineTensor({4, 32}, DataType::BFloat16, "x");
  f.addOutput(ops::layerNorm(x, f.defineTensor({32}, DataType::BFloat16, "w")));
  std::vector<std::string> p = lowered(f);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(count(p[0], "temp"), 0) << p[0];        // the row statistics are f32 accumulators
  EXPECT_EQ(count(p[0], "round_bf16"), 0) << p[0];  // rounded once, by the bf16 store
  EXPECT_NE(p[0].find("acc"), std::string::npos) << p[0];
}

TEST(KernelLower, LinearReadsTheWeightTransposedAndAddsTheBiasInTheGemm) {
  Fusion f;
  TensorView* x = f.defineTensor({8, 16}, DataType::Float, "x");
  f.addOutput(ops::linear(x, f.defineTensor({4, 16}, DataType::Float, "w"), f.defineTensor({4}, DataType::Float, "b")));
  std::vector<std::string> p = lowered(f);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("gemm m=8 n=4 k=16: b3[+0, ld 4] = 1.0 * b0[+0, ld 16] x b1^T[+0, ld 16] + 1.0 * b3"),
            std::string::npos)
      << p[0];
  EXPECT_NE(p[0].find("loops k0_fill"), std::string::npos) << p[0];
}

TEST(KernelLower, Bf16MatmulWidensItsOperandsAndRoundsTheResult) {
  Fusion f;
  TensorView* a = f.defineTensor({2, 3, 4}, DataType::BFloat16, "a");
  f.addOutput(ops::matmul(a, f.defineTensor({2, 4, 5}, DataType::BFloat16, "b")));
  std::vector<std::string> p = lowered(f);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(count(p[0], "temp f32"), 3) << p[0];
  EXPECT_NE(p[0].find("batch [2 (strides 12, 20, 15)]"), std::string::npos) << p[0];
}

TEST(KernelLower, TransposedOperandsAreReadInPlace) {
  Fusion f;
  TensorView* q = f.defineTensor({3, 5, 4}, DataType::Float, "q");
  TensorView* k = f.defineTensor({3, 6, 4}, DataType::Float, "k");
  f.addOutput(ops::matmul(q, ops::permute(k, {0, 2, 1})));  // q @ k^T
  std::vector<std::string> p = lowered(f);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(count(p[0], "loops"), 0) << p[0];  // no copy
  EXPECT_NE(
      p[0].find("gemm m=5 n=6 k=4 batch [3 (strides 20, 24, 30)]: b2[+0, ld 6] = 1.0 * b1[+0, ld 4] x b0^T[+0, ld 4]"),
      std::string::npos)
      << p[0];
}

// Autodiff's weight gradient: matmul(permute(dy), x) where dy is the end of a pointwise chain.
// The transpose leaves the chain's kernel for the GEMM's transpose flag: the kernel stores dy
// once, row by row, and its column sum (the bias gradient) reads it back instead of computing
// the chain a second time along strided columns.
TEST(KernelLower, ATransposeFusedIntoItsProducerIsReadInPlaceToo) {
  Fusion f;
  TensorView* up = f.defineTensor({8, 16}, DataType::Float, "up");
  TensorView* x = f.defineTensor({8, 4}, DataType::Float, "x");
  TensorView* dy = ops::mul(ops::tanh(up), up);
  f.addOutput(ops::matmul(ops::permute(dy, {1, 0}), x));  // [16, 4]
  f.addOutput(ops::sum(dy, {0}));
  std::vector<std::string> p = lowered(f);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(count(p[0], "tanh"), 1) << p[0];  // the chain, once
  EXPECT_EQ(count(p[0], "(i0 * 16) + i1"), 3) << p[0];  // read and stored row by row
  EXPECT_NE(p[1].find("gemm m=16 n=4 k=8"), std::string::npos) << p[1];
  EXPECT_NE(p[1].find("b0^T[+0, ld 16]"), std::string::npos) << p[1];
}

TEST(KernelLower, SdpaIsOneTiledAttentionStep) {
  Fusion f;
  TensorView* q = f.defineTensor({1, 2, 5, 4}, DataType::Float, "q");
  TensorView* k = f.defineTensor({1, 2, 5, 4}, DataType::Float, "k");
  TensorView* v = f.defineTensor({1, 2, 5, 3}, DataType::Float, "v");
  f.addOutput(ops::sdpa(q, k, v, true));
  std::vector<std::string> p = lowered(f);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(count(p[0], "gemm"), 0) << p[0];  // no score matrix: no GEMM writes one
  EXPECT_NE(p[0].find("attention batch=2 s=5 skv=5 d=4 dv=3 scale=0.5 causal: o b3, lse - = q b0, k b1, v b2"),
            std::string::npos)
      << p[0];
}

TEST(KernelLower, SdpaAndItsLogSumExpShareOneStep) {
  Fusion f;
  TensorView* q = f.defineTensor({1, 2, 5, 4}, DataType::BFloat16, "q");
  TensorView* k = f.defineTensor({1, 2, 7, 4}, DataType::BFloat16, "k");
  TensorView* v = f.defineTensor({1, 2, 7, 3}, DataType::BFloat16, "v");
  f.addOutput(ops::sdpa(q, k, v, false, 0.25));
  f.addOutput(ops::sdpaLse(q, k, false, 0.25));
  f.addOutput(ops::sdpaLse(q, k, true, 0.25));  // other attributes: a kernel of its own
  std::vector<std::string> p = lowered(f);
  ASSERT_EQ(p.size(), 2u);
  // bf16: the output computed in f32 b5 (rounded into b3), q, k, v widened into b6..b8.
  EXPECT_NE(p[0].find("attention batch=2 s=5 skv=7 d=4 dv=3 scale=0.25 operands=bf16: o b5, lse b4 = q b6, k b7, v b8"),
            std::string::npos)
      << p[0];
  EXPECT_NE(p[1].find("attention batch=2 s=5 skv=7 d=4 dv=0 scale=0.25 causal operands=bf16: o -, lse b2 = q b3, k b4, v -"),
            std::string::npos)
      << p[1];
}

TEST(KernelLower, CpuLoopsVectorize) {
  Fusion f;
  TensorView* x = f.defineTensor({64, 256}, DataType::Float, "x");
  f.addOutput(ops::gelu(ops::add(x, 1.0), "tanh"));
  std::vector<Segment> segs = segmentFusion(f);
  std::string ir = cpuLlvmIr(kir::lowerSegment(f, segs.at(0), staticShape, "seg"));
  EXPECT_NE(ir.find("vector.body"), std::string::npos) << ir;
  EXPECT_EQ(ir.find("call float @tanh"), std::string::npos) << ir;  // the polynomial, no libm call
}

}  // namespace
}  // namespace meshfuse
