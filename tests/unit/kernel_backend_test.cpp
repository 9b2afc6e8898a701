// The CPU backend: its compile cache, the accuracy of its polynomial math against libm (with the
// special values), and 16-bit conversions bit for bit against meshfuse's own.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "meshfuse/executor.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/ops.h"
#include "runtime/backend.h"
#include "lower/segment.h"

namespace meshfuse {
namespace {

struct CpuRun {
  std::unique_ptr<Communicator> comm = makeSelfCommunicator();
  Backend* backend = nullptr;
  std::unique_ptr<MultiDeviceExecutor> exec;

  explicit CpuRun(std::unique_ptr<Fusion> f) {
    std::unique_ptr<Backend> b = makeCpuBackend();
    backend = b.get();
    exec = std::make_unique<MultiDeviceExecutor>(std::move(f), *comm, std::move(b));
  }
  std::vector<Tensor> run(const std::vector<Tensor>& inputs) {
    std::vector<ShardedTensor> in;
    for (const Tensor& t : inputs) in.push_back({t, DeviceMesh({0}), {Placement::replicate()}});
    std::vector<Tensor> out;
    for (ShardedTensor& s : exec->run(in)) out.push_back(s.local);
    return out;
  }
};

TEST(CompileCache, ASecondRunCompilesNothing) {
  auto f = std::make_unique<Fusion>();
  TensorView* x = f->defineTensor({-1, 16}, DataType::Float, "x");
  TensorView* w = f->defineTensor({16, 16}, DataType::Float, "w");
  f->addOutput(ops::softmax(ops::gelu(ops::linear(ops::layerNorm(x), w)), 1));
  CpuRun r(std::move(f));
  Tensor in = Tensor::random(DataType::Float, {8, 16}, 1), wt = Tensor::random(DataType::Float, {16, 16}, 2);
  r.run({in, wt});
  const Backend::Stats first = r.backend->stats();
  EXPECT_EQ(first.kernels_compiled, 2);  // layer_norm; gelu + softmax (the GEMM compiles nothing)
  EXPECT_GT(first.compile_seconds, 0);
  r.run({in, wt});
  EXPECT_EQ(r.backend->stats().kernels_compiled, first.kernels_compiled);
  EXPECT_EQ(r.backend->stats().compile_seconds, first.compile_seconds);
  // New local shapes are a new specialization.
  r.run({Tensor::random(DataType::Float, {4, 16}, 3), wt});
  EXPECT_EQ(r.backend->stats().kernels_compiled, 2 * first.kernels_compiled);
}

TEST(CompileCache, StructurallyEqualSegmentsShareCode) {
  // Two identical chains on two inputs: one compiled kernel serves both segments.
  auto f = std::make_unique<Fusion>();
  TensorView* x = f->defineTensor({4, 8}, DataType::Float, "x");
  TensorView* y = f->defineTensor({4, 8}, DataType::Float, "y");
  TensorView* w = f->defineTensor({8, 8}, DataType::Float, "w");
  f->addOutput(ops::linear(ops::tanh(ops::exp(x)), w));
  f->addOutput(ops::linear(ops::tanh(ops::exp(y)), w));
  CpuRun r(std::move(f));
  Tensor a = Tensor::random(DataType::Float, {4, 8}, 1);
  std::vector<Tensor> out = r.run({a, a, Tensor::random(DataType::Float, {8, 8}, 2)});
  EXPECT_EQ(r.backend->stats().kernels_compiled, 1);
  EXPECT_EQ(out[0].toValues(), out[1].toValues());
}

// f applied to `xs` by a one-op kernel.
std::vector<double> kernel(const std::function<TensorView*(TensorView*)>& op, const std::vector<double>& xs) {
  auto f = std::make_unique<Fusion>();
  TensorView* x = f->defineTensor({static_cast<int64_t>(xs.size())}, DataType::Float, "x");
  f->addOutput(op(x));
  CpuRun r(std::move(f));
  return r.run({Tensor::fromValues(DataType::Float, {static_cast<int64_t>(xs.size())}, xs)})[0].toValues();
}

// Dense f32 samples of [lo, hi].
std::vector<double> range(double lo, double hi, int n = 20001) {
  std::vector<double> xs;
  for (int i = 0; i < n; ++i) xs.push_back(static_cast<float>(lo + (hi - lo) * i / (n - 1)));
  return xs;
}

// Max |got - want| / max(|want|, floor) over the samples.
double maxError(const std::vector<double>& xs, const std::vector<double>& got, double (*want)(double), double floor) {
  double worst = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    double w = want(xs[i]);
    worst = std::max(worst, std::fabs(got[i] - w) / std::max(std::fabs(w), floor));
  }
  return worst;
}

TEST(KernelMath, ExpMatchesLibm) {
  std::vector<double> xs = range(-103, 88.7);
  double (*e)(double) = std::exp;
  EXPECT_LT(maxError(xs, kernel(ops::exp, xs), e, 1e-37), 5e-7);
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> got = kernel(ops::exp, {-inf, inf, NAN, 0, -200, 100});
  EXPECT_EQ(got[0], 0);
  EXPECT_EQ(got[1], inf);
  EXPECT_TRUE(std::isnan(got[2]));
  EXPECT_EQ(got[3], 1);
  EXPECT_EQ(got[4], 0);
  EXPECT_EQ(got[5], inf);
}

TEST(KernelMath, LogMatchesLibm) {
  std::vector<double> xs = range(1e-3, 50);
  std::vector<double> wide = {1e-30, 1e-40 /* subnormal */, 3e38, 0.5, 1, 2};
  xs.insert(xs.end(), wide.begin(), wide.end());
  for (double& x : xs) x = static_cast<float>(x);
  double (*l)(double) = std::log;
  EXPECT_LT(maxError(xs, kernel(ops::log, xs), l, 1e-2), 5e-7);
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> got = kernel(ops::log, {0, -1, inf, NAN});
  EXPECT_EQ(got[0], -inf);
  EXPECT_TRUE(std::isnan(got[1]));
  EXPECT_EQ(got[2], inf);
  EXPECT_TRUE(std::isnan(got[3]));
}

TEST(KernelMath, TanhMatchesLibm) {
  std::vector<double> xs = range(-12, 12);
  double (*t)(double) = std::tanh;
  EXPECT_LT(maxError(xs, kernel(ops::tanh, xs), t, 1e-30), 6e-7);
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> got = kernel(ops::tanh, {-inf, inf, NAN, 1e-20});
  EXPECT_NEAR(got[0], -1, 1e-6);
  EXPECT_NEAR(got[1], 1, 1e-6);
  EXPECT_TRUE(std::isnan(got[2]));
  EXPECT_FLOAT_EQ(got[3], 1e-20);
}

TEST(KernelMath, ErfGeluMatchesLibm) {
  // erf enters through the exact GELU: 0.5 x (1 + erf(x / sqrt 2)).
  std::vector<double> xs = range(-9, 9);
  auto gelu = [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); };
  std::vector<double> got = kernel([](TensorView* x) { return ops::gelu(x, "none"); }, xs);
  double worst = 0;
  for (size_t i = 0; i < xs.size(); ++i) worst = std::max(worst, std::fabs(got[i] - gelu(xs[i])));
  EXPECT_LT(worst, 2e-6);
}

TEST(KernelMath, SixteenBitStoresRoundLikeMeshfuse) {
  std::vector<double> xs = range(-70000, 70000, 4001);
  const double inf = std::numeric_limits<double>::infinity();
  for (double v : {0.0, -0.0, 1.0 + 1.0 / 256, 1.0 + 3.0 / 256, 65504.0, 65520.0, 1e-8, inf, -inf, 3.4e38})
    xs.push_back(v);
  for (DataType dt : {DataType::BFloat16, DataType::Half}) {
    std::vector<double> got = kernel([dt](TensorView* x) { return ops::cast(x, dt); }, xs);
    for (size_t i = 0; i < xs.size(); ++i)
      EXPECT_EQ(got[i], roundToDtype(xs[i], dt)) << xs[i] << " to " << dtypeName(dt);
    std::vector<double> nan = kernel([dt](TensorView* x) { return ops::cast(x, dt); }, {NAN});
    EXPECT_TRUE(std::isnan(nan[0]));
  }
}

// Generated kernels take their buffers as noalias/__restrict__ (CPU and CUDA): a launch whose
// output overlaps an input or another output is refused before it runs, not silently computed
// differently on each backend.
TEST(KernelBackend, OverlappingSegmentBuffersAreRefused) {
  Fusion f;
  TensorView* x = f.defineTensor({16}, DataType::Float, "x");
  f.addOutput(ops::neg(x));
  std::vector<Segment> segs = segmentFusion(f);
  ASSERT_EQ(segs.size(), 1u);
  std::unique_ptr<Backend> b = makeCpuBackend();
  Tensor buf = Tensor::random(DataType::Float, {32}, 1);
  auto shape = [](const TensorView*) { return std::vector<int64_t>{16}; };
  Tensor in = buf.slice0(0, 16), out = buf.slice0(8, 16);  // elements 8..15 shared
  std::vector<const Tensor*> ins = {&in};
  std::vector<Tensor*> outs = {&out};
  try {
    b->runSegment(segs[0], ins, outs, shape);
    FAIL() << "an output overlapping an input was launched";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("output 0 overlaps input 0"), std::string::npos) << e.what();
  }
  Tensor apart = buf.slice0(16, 16);  // adjacent, not overlapping: fine
  outs = {&apart};
  b->runSegment(segs[0], ins, outs, shape);
  EXPECT_EQ(apart.get(3), -in.get(3));
}

}  // namespace
}  // namespace meshfuse
