// The tiled attention kernel (kir::Attention; src/runtime/cpu/attention_kernel.cpp on the CPU):
// its exp against libm, sdpa and sdpa_lse through the CPU backend against the reference executor
// and against a direct f64 computation, at sequence lengths that are no multiple of the tiles,
// and the memory it needs (no [s, skv] buffer).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "meshfuse/executor.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/ir/printer.h"
#include "codegen/kernel_ir.h"
#include "meshfuse/ops.h"
#include "meshfuse/reference.h"
#include "lower/segment.h"
#include "codegen/kernel_lower.h"
#include "runtime/cpu/attention_kernel.h"
#include "runtime/backend.h"

namespace meshfuse {
namespace {

std::vector<Tensor> runOnCpu(const Fusion& f, const std::vector<Tensor>& inputs) {
  std::unique_ptr<Communicator> comm = makeSelfCommunicator();
  MultiDeviceExecutor exec(f.clone(), *comm, makeCpuBackend());
  std::vector<ShardedTensor> in;
  for (const Tensor& t : inputs) in.push_back({t, DeviceMesh({0}), {Placement::replicate()}});
  std::vector<Tensor> out;
  for (ShardedTensor& s : exec.run(in)) out.push_back(s.local);
  return out;
}

TEST(TiledAttention, ExpMatchesLibm) {
  std::vector<float> x;
  for (double v = -87.0; v <= 0.0; v += 1e-3) x.push_back(static_cast<float>(v));
  std::vector<float> y = x;
  cpu::expShiftedInPlace(y.data(), static_cast<int64_t>(y.size()), 0.0f);
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(static_cast<double>(x[i]));
    worst = std::max(worst, std::fabs(y[i] - want) / want);
  }
  EXPECT_LT(worst, 3e-7);
  // The shift, then the special values: below -87 (and -inf, a masked score) exactly 0, NaN kept.
  std::vector<float> s = {3.0f, -90.0f, -std::numeric_limits<float>::infinity(), std::nanf(""), 1.0f};
  cpu::expShiftedInPlace(s.data(), static_cast<int64_t>(s.size()), 1.0f);
  EXPECT_NEAR(s[0], std::exp(2.0), 3e-7 * std::exp(2.0));
  EXPECT_EQ(s[1], 0.0f);
  EXPECT_EQ(s[2], 0.0f);
  EXPECT_TRUE(std::isnan(s[3]));
  EXPECT_EQ(s[4], 1.0f);
}

struct Shape {
  int64_t b, h, s, skv, d, dv;
};

// The log-sum-exp of q k^T scale (masked), computed directly in f64 from the inputs.
std::vector<double> directLse(const Tensor& q, const Tensor& k, const Shape& sh, bool causal, double scale) {
  std::vector<double> out;
  for (int64_t g = 0; g < sh.b * sh.h; ++g)
    for (int64_t i = 0; i < sh.s; ++i) {
      double sum = 0;
      for (int64_t j = 0; j < sh.skv && !(causal && j > i); ++j) {
        double dot = 0;
        for (int64_t c = 0; c < sh.d; ++c) dot += q.get((g * sh.s + i) * sh.d + c) * k.get((g * sh.skv + j) * sh.d + c);
        sum += std::exp(dot * scale);
      }
      out.push_back(std::log(sum));
    }
  return out;
}

class TiledAttentionCpu : public ::testing::TestWithParam<std::tuple<DataType, bool>> {};

// sdpa and sdpa_lse (one segment: one kernel returns both) against the reference, and the
// log-sum-exp against the direct computation; sizes around and across the 64 x 128 tiles.
TEST_P(TiledAttentionCpu, MatchesTheReference) {
  const auto [dt, causal] = GetParam();
  for (const Shape& sh : {Shape{1, 2, 1, 1, 8, 8}, Shape{1, 1, 64, 128, 16, 16}, Shape{2, 1, 200, 150, 32, 24},
                          Shape{1, 2, 130, 300, 8, 40}, Shape{1, 1, 257, 257, 64, 64}}) {
    SCOPED_TRACE(fmt::format("[{}, {}] q {} kv {} d {} dv {}", sh.b, sh.h, sh.s, sh.skv, sh.d, sh.dv));
    Fusion f;
    TensorView* q = f.defineTensor({sh.b, sh.h, sh.s, sh.d}, dt, "q");
    TensorView* k = f.defineTensor({sh.b, sh.h, sh.skv, sh.d}, dt, "k");
    TensorView* v = f.defineTensor({sh.b, sh.h, sh.skv, sh.dv}, dt, "v");
    f.addOutput(ops::sdpa(q, k, v, causal));
    f.addOutput(ops::sdpaLse(q, k, causal));
    std::vector<Tensor> in;
    for (const std::vector<int64_t>& s :
         {std::vector<int64_t>{sh.b, sh.h, sh.s, sh.d}, {sh.b, sh.h, sh.skv, sh.d}, {sh.b, sh.h, sh.skv, sh.dv}})
      in.push_back(Tensor::random(dt, s, 7 + in.size()));
    std::vector<Tensor> got = runOnCpu(f, in);
    std::vector<Tensor> want = evaluateReference(f, in);
    ASSERT_EQ(got.size(), 2u);
    for (size_t o = 0; o < 2; ++o) {
      ReferenceComparison r = compareWithReference(got[o], want[o]);
      EXPECT_TRUE(r.pass) << "output " << o << ": max abs error " << r.max_abs_err << ", allowed " << r.allowed_abs;
    }
    const std::vector<double> lse = directLse(in[0], in[1], sh, causal, 1 / std::sqrt(double(sh.d)));
    ASSERT_EQ(got[1].dtype(), DataType::Float);
    for (size_t i = 0; i < lse.size(); ++i)
      ASSERT_NEAR(got[1].get(static_cast<int64_t>(i)), lse[i], 1e-5 * (1 + std::fabs(lse[i]))) << "row " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(DtypesAndMasks, TiledAttentionCpu,
                         ::testing::Combine(::testing::Values(DataType::Float, DataType::BFloat16),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(dtypeName(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_causal" : "_full");
                         });

// The lowering the benchmark compares against (a materialized score matrix) still computes sdpa.
TEST(TiledAttention, TheMaterializedLoweringForBenchmarksStillMatches) {
  Fusion f;
  TensorView* q = f.defineTensor({1, 2, 70, 16}, DataType::Float, "q");
  TensorView* k = f.defineTensor({1, 2, 90, 16}, DataType::Float, "k");
  f.addOutput(ops::sdpa(q, k, k, true));
  std::vector<Tensor> in = {Tensor::random(DataType::Float, {1, 2, 70, 16}, 1),
                            Tensor::random(DataType::Float, {1, 2, 90, 16}, 2)};
  struct Restore {  // the switch is process-wide: back to the tiled kernel even if this fails
    ~Restore() { kir::setMaterializedAttentionForBenchmarks(false); }
  } restore;
  kir::setMaterializedAttentionForBenchmarks(true);
  std::vector<Segment> segs = segmentFusion(f);
  const std::string program = kir::printProgram(kir::lowerSegment(
      f, segs.at(0), [](const TensorView* tv) { return tv->evaluateShape({}); }, "materialized"));
  std::vector<Tensor> got = runOnCpu(f, in);
  EXPECT_EQ(program.find("attention batch"), std::string::npos) << program;
  EXPECT_NE(program.find("buffer b3 temp f32[2, 70, 90]"), std::string::npos) << program;  // the score matrix
  EXPECT_TRUE(compareWithReference(got.at(0), evaluateReference(f, in).at(0)).pass);
}

// No buffer of the lowered program holds a score matrix: at sequence 8192 every temporary is a
// widened operand or output (O(s d)), where the materialized lowering needed 2 x 8192^2 floats.
TEST(TiledAttention, NoSequenceSquaredBuffer) {
  const int64_t s = 8192, d = 64;
  Fusion f;
  TensorView* q = f.defineTensor({1, 2, s, d}, DataType::BFloat16, "q");
  f.addOutput(ops::sdpa(q, q, q, true));
  std::vector<Segment> segs = segmentFusion(f);
  ASSERT_EQ(segs.size(), 1u);
  kir::Program p = kir::lowerSegment(
      f, segs[0], [](const TensorView* tv) { return tv->evaluateShape({}); }, "attention");
  int64_t temp_elements = 0;
  for (const kir::Buffer& b : p.buffers) {
    EXPECT_LE(b.numel(), 2 * s * d) << kir::printProgram(p);
    if (b.role == kir::Buffer::Temp) temp_elements += b.numel();
  }
  EXPECT_EQ(temp_elements, 2 * (2 * s * d));  // q widened once (k, v are the same tensor), the f32 output
}

TEST(TiledAttention, LogSumExpOpChecksItsOperands) {
  Fusion f;
  TensorView* q = f.defineTensor({1, 2, 8, 4}, DataType::Float, "q");
  TensorView* k = f.defineTensor({1, 2, 8, 5}, DataType::Float, "k");
  try {
    ops::sdpaLse(q, k);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Shape);
    EXPECT_NE(std::string(e.what()).find("embedding dim (e)"), std::string::npos) << e.what();
  }
  try {
    ops::sdpaLse(q, q, false, 0.0);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()),
              "sdpa_lse: scale 0 would zero every attention score; leave it unset for 1/sqrt(head size)");
  }
}

// The text form: sdpa_lse prints and parses like any op, its f32 type is checked against an
// annotation, and its operands are checked as sdpa's are.
TEST(TiledAttention, LogSumExpOpInText) {
  const std::string head =
      "fusion {\n  %q = input bf16[1, 2, 5, 4]\n  %k = input bf16[1, 2, 7, 4]\n  %v = input bf16[1, 2, 7, 3]\n";
  std::unique_ptr<Fusion> ok = parseFusion(head + "  %l = sdpa_lse(%q, %k, is_causal=true) : f32[1, 2, 5]\n  output %l\n}\n",
                                           "ok.mf");
  EXPECT_NE(printFusion(*ok).find("%l = sdpa_lse(%q, %k, is_causal=true) : f32[1, 2, 5]"), std::string::npos);
  auto error = [&](const std::string& op) {
    try {
      parseFusion(head + op + "\n  output %l\n}\n", "bad.mf");
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error("  %l = sdpa_lse(%q, %k) : bf16[1, 2, 5]"),
            "bad.mf:5:27: the annotated type bf16[1, 2, 5] does not match the type f32[1, 2, 5] that sdpa_lse produces");
  EXPECT_EQ(error("  %l = sdpa_lse(%q, %v) : f32[1, 2, 5]"),
            "bad.mf:5:8: sdpa_lse: embedding dim (e) mismatch: %q has 4 but %v has 3");
}

}  // namespace
}  // namespace meshfuse
