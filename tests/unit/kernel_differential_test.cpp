// Generated kernels (the CPU backend: segmentation, kernel IR, LLVM JIT, BLAS) against the
// reference executor: every op of ops.def on its own, then random op chains (fixed seeds, f32 and
// bf16) with broadcasts, reductions over every axis, normalizations, layout changes and several
// outputs, which the segmenter fuses into multi-op kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "meshfuse/executor.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/ir/printer.h"
#include "meshfuse/ops.h"
#include "meshfuse/reference.h"
#include "random_chains.h"
#include "runtime/backend.h"

namespace meshfuse {
namespace {

// The fusion run on one device through the whole pipeline with the CPU backend.
std::vector<Tensor> runOnCpu(const Fusion& f, const std::vector<Tensor>& inputs) {
  std::unique_ptr<Communicator> comm = makeSelfCommunicator();
  MultiDeviceExecutor exec(f.clone(), *comm, makeCpuBackend());
  std::vector<ShardedTensor> in;
  for (const Tensor& t : inputs) in.push_back({t, DeviceMesh({0}), {Placement::replicate()}});
  std::vector<Tensor> out;
  for (ShardedTensor& s : exec.run(in)) out.push_back(s.local);
  return out;
}

// |actual - expected| <= atol + rtol |expected|, atol scaled by the output's magnitude (bf16
// results may differ from the reference by a rounding of an intermediate of that size).
void expectClose(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  ASSERT_EQ(actual.dtype(), expected.dtype()) << what;
  std::vector<double> a = actual.toValues(), b = expected.toValues();
  double scale = 1;
  for (double v : b) scale = std::max(scale, std::isfinite(v) ? std::fabs(v) : 0.0);
  const bool low = expected.dtype() == DataType::BFloat16 || expected.dtype() == DataType::Half;
  const double rtol = low ? 2e-2 : 1e-4, atol = (low ? 1.6e-2 : 1e-5) * scale;
  int bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool same_special = (std::isnan(a[i]) && std::isnan(b[i])) || (std::isinf(b[i]) && a[i] == b[i]);
    if (same_special || std::fabs(a[i] - b[i]) <= atol + rtol * std::fabs(b[i])) continue;
    if (++bad <= 3) ADD_FAILURE() << what << ": element " << i << " is " << a[i] << " but the reference gives " << b[i];
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << a.size() << " elements differ";
}

void checkAgainstReference(const Fusion& f, const std::vector<Tensor>& inputs, const std::string& what) {
  std::vector<Tensor> expected = evaluateReference(f, inputs);
  std::vector<Tensor> actual = runOnCpu(f, inputs);
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i)
    expectClose(actual[i], expected[i], fmt::format("{} output {}\n{}", what, i, printFusion(f)));
}

Tensor positive(DataType dt, std::vector<int64_t> shape, uint64_t seed) {
  Tensor t = Tensor::random(dt, shape, seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, std::fabs(t.get(i)) + 0.25);
  return t;
}

// ---- every op --------------------------------------------------------------------------------

struct OpCase {
  std::string name;
  std::function<std::vector<Tensor>(Fusion&, DataType)> build;  // defines inputs and outputs
};

// Inputs of random values; `pos` makes them positive.
struct Inputs {
  Fusion& f;
  DataType dt;
  std::vector<Tensor> values;
  TensorView* add(std::vector<int64_t> shape, bool pos = false, DataType dtype = DataType::Float) {
    DataType d = dtype == DataType::Float ? dt : dtype;
    std::vector<Extent> s(shape.begin(), shape.end());
    uint64_t seed = 100 + values.size();
    values.push_back(pos ? positive(d, shape, seed) : Tensor::random(d, shape, seed));
    return f.defineTensor(s, d, "in" + std::to_string(values.size() - 1));
  }
  // i64 indices in [lo, hi), repeats included.
  TensorView* indices(std::vector<int64_t> shape, int64_t lo, int64_t hi) {
    std::vector<Extent> s(shape.begin(), shape.end());
    std::vector<double> v(static_cast<size_t>(numel(shape)));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(lo + static_cast<int64_t>((i * 7 + values.size()) % (hi - lo)));
    values.push_back(Tensor::fromValues(DataType::Int64, shape, v));
    return f.defineTensor(s, DataType::Int64, "in" + std::to_string(values.size() - 1));
  }
};

std::vector<OpCase> opCases(OpKind k) {
  auto unary = [](std::function<TensorView*(TensorView*)> op, bool pos = false) {
    return [op, pos](Fusion& f, DataType dt) {
      Inputs in{f, dt, {}};
      f.addOutput(op(in.add({5, 37}, pos)));
      return in.values;
    };
  };
  auto binary = [](std::function<TensorView*(ops::Operand, ops::Operand)> op, bool pos = false) {
    return [op, pos](Fusion& f, DataType dt) {
      Inputs in{f, dt, {}};
      TensorView* a = in.add({5, 7}, pos);
      TensorView* b = in.add({5, 7}, pos);
      TensorView* row = in.add({1, 7}, pos);
      TensorView* col = in.add({5, 1}, pos);
      f.addOutput(op(a, b));
      f.addOutput(op(a, row));
      f.addOutput(op(col, a));
      f.addOutput(op(a, 0.5));
      f.addOutput(op(2.0, b));
      return in.values;
    };
  };
  const std::string n(opInfo(k).name);
  switch (k) {
    case OpKind::Neg: return {{n, unary(ops::neg)}};
    case OpKind::Abs: return {{n, unary(ops::abs)}};
    case OpKind::Exp: return {{n, unary(ops::exp)}};
    case OpKind::Log: return {{n, unary(ops::log, true)}};
    case OpKind::Sqrt: return {{n, unary(ops::sqrt, true)}};
    case OpKind::Rsqrt: return {{n, unary(ops::rsqrt, true)}};
    case OpKind::Reciprocal: return {{n, unary(ops::reciprocal, true)}};
    case OpKind::Tanh: return {{n, unary(ops::tanh)}};
    case OpKind::Sigmoid: return {{n, unary(ops::sigmoid)}};
    case OpKind::Relu: return {{n, unary(ops::relu)}};
    case OpKind::Gelu:
      return {{n + "_erf", unary([](TensorView* x) { return ops::gelu(ops::mul(x, 3.0), "none"); })},
              {n + "_tanh", unary([](TensorView* x) { return ops::gelu(ops::mul(x, 3.0), "tanh"); })}};
    case OpKind::Silu: return {{n, unary(ops::silu)}};
    case OpKind::Add: return {{n, binary(ops::add)}};
    case OpKind::Sub: return {{n, binary(ops::sub)}};
    case OpKind::Mul: return {{n, binary(ops::mul)}};
    case OpKind::Div: return {{n, binary(ops::div, true)}};
    case OpKind::Pow:
      return {{n, binary(ops::pow, true)}, {n + "_exponents", [](Fusion& f, DataType dt) {
                                              Inputs in{f, dt, {}};
                                              TensorView* x = in.add({4, 9});
                                              for (double e : {0.0, 1.0, 2.0, 3.0, -1.0}) f.addOutput(ops::pow(x, e));
                                              TensorView* p = in.add({4, 9}, true);
                                              for (double e : {0.5, -0.5, 1.5}) f.addOutput(ops::pow(p, e));
                                              return in.values;
                                            }}};
    case OpKind::Maximum: return {{n, binary(ops::maximum)}};
    case OpKind::Minimum: return {{n, binary(ops::minimum)}};
    case OpKind::Eq:
    case OpKind::Ne:
    case OpKind::Lt:
    case OpKind::Le:
    case OpKind::Gt:
    case OpKind::Ge:
      return {{n, [k](Fusion& f, DataType dt) {
                 Inputs in{f, dt, {}};
                 TensorView* a = in.add({6, 5});
                 TensorView* b = in.add({1, 5});
                 auto cmp = k == OpKind::Eq   ? ops::eq
                            : k == OpKind::Ne ? ops::ne
                            : k == OpKind::Lt ? ops::lt
                            : k == OpKind::Le ? ops::le
                            : k == OpKind::Gt ? ops::gt
                                              : ops::ge;
                 f.addOutput(cmp(a, b));
                 f.addOutput(cmp(a, a));
                 f.addOutput(cmp(a, 0.25));
                 return in.values;
               }}};
    case OpKind::Where:
      return {{n, [](Fusion& f, DataType dt) {
                 Inputs in{f, dt, {}};
                 TensorView* c = in.add({6, 5}, false, DataType::Bool);
                 TensorView* a = in.add({6, 5});
                 TensorView* b = in.add({1, 5});
                 f.addOutput(ops::where(c, a, b));
                 f.addOutput(ops::where(c, a, 1.5));
                 f.addOutput(ops::where(ops::gt(a, 0.0), 2.0, -1.0));
                 return in.values;
               }}};
    case OpKind::Cast:
      return {
          {n, [](Fusion& f, DataType dt) {
             Inputs in{f, dt, {}};
             TensorView* x = in.add({6, 5});
             for (DataType to : {DataType::Float, DataType::BFloat16, DataType::Half, DataType::Int64, DataType::Bool})
               f.addOutput(ops::cast(ops::mul(x, 7.0), to));
             f.addOutput(ops::cast(in.add({6, 5}, false, DataType::Bool), dt));
             f.addOutput(ops::cast(in.add({6, 5}, false, DataType::Int64), dt));
             return in.values;
           }}};
    case OpKind::Set: return {{n, unary(ops::set)}};
    case OpKind::Sum:
    case OpKind::Max:
    case OpKind::Mean:
      return {{n, [k](Fusion& f, DataType dt) {
                 Inputs in{f, dt, {}};
                 TensorView* x = in.add({3, 4, 17});
                 auto red = k == OpKind::Sum ? ops::sum : k == OpKind::Max ? ops::max : ops::mean;
                 for (std::vector<int64_t> dims :
                      std::vector<std::vector<int64_t>>{{0}, {1}, {2}, {-1}, {0, 2}, {0, 1}, {0, 1, 2}})
                   f.addOutput(red(x, dims, false));
                 f.addOutput(red(x, {1}, true));
                 return in.values;
               }}};
    case OpKind::Linear:
      return {
          {n, [](Fusion& f, DataType dt) {
             Inputs in{f, dt, {}};
             TensorView* x = in.add({6, 10});
             TensorView* w = in.add({7, 10});
             TensorView* b = in.add({7});
             TensorView* x3 = in.add({2, 3, 10});
             f.addOutput(ops::linear(x, w));
             f.addOutput(ops::linear(x, w, b));
             f.addOutput(ops::linear(x3, w, b));
             // Transposed operands (read in place by the GEMM).
             f.addOutput(ops::linear(ops::permute(in.add({10, 6}), {1, 0}), ops::permute(in.add({10, 7}), {1, 0}), b));
             return in.values;
           }}};
    case OpKind::Matmul:
      return {{n, [](Fusion& f, DataType dt) {
                 Inputs in{f, dt, {}};
                 TensorView* a = in.add({2, 3, 4});
                 TensorView* b2 = in.add({4, 5});
                 TensorView* b3 = in.add({2, 4, 5});
                 TensorView* a2 = in.add({3, 4});
                 f.addOutput(ops::matmul(a, b2));
                 f.addOutput(ops::matmul(a, b3));
                 f.addOutput(ops::matmul(a2, b2));
                 // Transposed operands (read in place by the GEMM), batched and shared.
                 TensorView* at = in.add({2, 4, 3});
                 TensorView* bt3 = in.add({2, 5, 4});
                 f.addOutput(ops::matmul(ops::permute(at, {0, 2, 1}), ops::permute(bt3, {0, 2, 1})));
                 f.addOutput(ops::matmul(ops::permute(in.add({2, 4, 3}), {0, 2, 1}), b2));
                 f.addOutput(ops::matmul(a2, ops::permute(in.add({5, 4}), {1, 0})));
                 return in.values;
               }}};
    case OpKind::BroadcastInDim:
      return {{n, [](Fusion& f, DataType dt) {
                 Inputs in{f, dt, {}};
                 TensorView* v = in.add({7});
                 TensorView* c = in.add({5, 1});
                 f.addOutput(ops::broadcastInDim(v, {5, 7}, {1}));
                 f.addOutput(ops::broadcastInDim(v, {7, 3}, {0}));
                 f.addOutput(ops::broadcastInDim(c, {5, 6}, {0, 1}));
                 f.addOutput(ops::broadcastInDim(c, {2, 5, 1, 3}, {1, 2}));
                 return in.values;
               }}};
    case OpKind::Reshape:
      return {{n, [](Fusion& f, DataType dt) {
                 Inputs in{f, dt, {}};
                 TensorView* x = in.add({6, 4});
                 f.addOutput(ops::reshape(x, {2, 3, 4}));
                 f.addOutput(ops::reshape(x, {24}));
                 f.addOutput(ops::reshape(x, {4, 6}));
                 f.addOutput(ops::reshape(ops::exp(x), {3, 8}));  // a computed value, re-indexed
                 return in.values;
               }}};
    case OpKind::Permute:
      return {{n, [](Fusion& f, DataType dt) {
                 Inputs in{f, dt, {}};
                 TensorView* x = in.add({2, 3, 4});
                 f.addOutput(ops::permute(x, {2, 0, 1}));
                 f.addOutput(ops::permute(ops::neg(x), {1, 0, 2}));
                 return in.values;
               }}};
    case OpKind::Slice:
      return {{n, [](Fusion& f, DataType dt) {
                 Inputs in{f, dt, {}};
                 TensorView* x = in.add({6, 8});
                 f.addOutput(ops::slice(x, {1, 2}, {5, 7}));
                 f.addOutput(ops::slice(ops::tanh(x), {0, 3}, {6, 4}));
                 return in.values;
               }}};
    case OpKind::Cat:
      return {{n, [](Fusion& f, DataType dt) {
                 Inputs in{f, dt, {}};
                 TensorView* a = in.add({3, 4});
                 TensorView* b = in.add({2, 4});
                 TensorView* c = in.add({3, 2});
                 f.addOutput(ops::cat({a, b}, 0));
                 f.addOutput(ops::cat({a, ops::exp(c), a}, 1));
                 return in.values;
               }}};
    case OpKind::Softmax:
      return {{n, [](Fusion& f, DataType dt) {
                 Inputs in{f, dt, {}};
                 TensorView* x = in.add({4, 3, 19});
                 for (int64_t d : {0, 1, 2}) f.addOutput(ops::softmax(ops::mul(x, 4.0), d));
                 return in.values;
               }}};
    case OpKind::LogSoftmax:
      return {{n, [](Fusion& f, DataType dt) {
                 Inputs in{f, dt, {}};
                 TensorView* x = in.add({4, 3, 19});
                 for (int64_t d : {0, 1, 2}) f.addOutput(ops::logSoftmax(ops::mul(x, 4.0), d));
                 return in.values;
               }}};
    case OpKind::Embedding:
      return {{n, [](Fusion& f, DataType dt) {
                 Inputs in{f, dt, {}};
                 TensorView* w = in.add({11, 6});
                 TensorView* idx = in.indices({3, 4}, -2, 13);  // rows outside [0, 11) read zeros
                 f.addOutput(ops::embedding(w, idx));
                 f.addOutput(ops::add(ops::embedding(ops::exp(w), idx), 1.0));  // a computed table, fused
                 f.addOutput(ops::embedding(in.add({2, 5, 6}), in.indices({2, 7}, 0, 5)));  // grouped
                 f.addOutput(ops::embedding(w, in.indices({}, 0, 11)));                    // one index
                 return in.values;
               }}};
    case OpKind::EmbeddingBackward:
      return {{n, [](Fusion& f, DataType dt) {
                 Inputs in{f, dt, {}};
                 TensorView* g = in.add({3, 4, 6});
                 TensorView* idx = in.indices({3, 4}, -1, 9);  // repeated rows; -1 adds nothing
                 f.addOutput(ops::embeddingBackward(g, idx, 11));
                 f.addOutput(ops::embeddingBackward(ops::mul(g, g), idx, 8));
                 f.addOutput(ops::embeddingBackward(in.add({2, 7, 6}), in.indices({2, 7}, 0, 5), 5, true));
                 return in.values;
               }}};
    case OpKind::OneHot:
      return {{n, [](Fusion& f, DataType dt) {
                 Inputs in{f, dt, {}};
                 TensorView* idx = in.indices({3, 4}, -1, 7);
                 f.addOutput(ops::oneHot(idx, 6));
                 f.addOutput(ops::cast(ops::oneHot(idx, 9), dt));
                 return in.values;
               }}};
    case OpKind::CrossEntropy:
      return {{n, [](Fusion& f, DataType dt) {
                 Inputs in{f, dt, {}};
                 TensorView* x = in.add({6, 11});
                 TensorView* t = in.indices({6}, 0, 11);
                 f.addOutput(ops::crossEntropy(ops::mul(x, 4.0), t));
                 f.addOutput(ops::crossEntropy(x, t, 3, "sum"));  // target 3 ignored
                 f.addOutput(ops::crossEntropy(x, t, 3, "none"));
                 TensorView* x3 = in.add({3, 5, 4});  // class dim 1 of [N, C, d]
                 f.addOutput(ops::crossEntropy(x3, in.indices({3, 4}, 0, 5), 1));
                 f.addOutput(ops::crossEntropy(in.add({7}), in.indices({}, 0, 7), -100, "sum"));  // unbatched
                 return in.values;
               }}};
    case OpKind::LayerNorm:
      return {{n, [](Fusion& f, DataType dt) {
                 Inputs in{f, dt, {}};
                 TensorView* x = in.add({4, 3, 40});
                 TensorView* w = in.add({40});
                 TensorView* b = in.add({40});
                 f.addOutput(ops::layerNorm(x, w, b));
                 f.addOutput(ops::layerNorm(x));
                 return in.values;
               }}};
    case OpKind::RmsNorm:
      return {{n, [](Fusion& f, DataType dt) {
                 Inputs in{f, dt, {}};
                 TensorView* x = in.add({5, 33});
                 TensorView* w = in.add({33});
                 f.addOutput(ops::rmsNorm(x, w));
                 f.addOutput(ops::rmsNorm(x));
                 return in.values;
               }}};
    case OpKind::Sdpa:
      return {{n, [](Fusion& f, DataType dt) {
                 Inputs in{f, dt, {}};
                 TensorView* q = in.add({2, 2, 5, 4});
                 TensorView* kk = in.add({2, 2, 6, 4});
                 TensorView* v = in.add({2, 2, 6, 3});
                 f.addOutput(ops::sdpa(q, kk, v, false));
                 f.addOutput(ops::sdpa(q, kk, v, true, 0.3));
                 return in.values;
               }}};
    case OpKind::SdpaLse:  // alone (its own kernel) and beside an sdpa (one kernel for both)
      return {{n, [](Fusion& f, DataType dt) {
                 Inputs in{f, dt, {}};
                 TensorView* q = in.add({2, 2, 5, 4});
                 TensorView* kk = in.add({2, 2, 6, 4});
                 TensorView* v = in.add({2, 2, 6, 3});
                 f.addOutput(ops::sdpaLse(q, kk, true));
                 f.addOutput(ops::sdpa(q, kk, v, false, 0.3));
                 f.addOutput(ops::sdpaLse(q, kk, false, 0.3));
                 return in.values;
               }}};
    case OpKind::SdpaGrad:  // expanded after propagation; dq, dk, dv of one attention share P
      return {{n, [](Fusion& f, DataType dt) {
                 Inputs in{f, dt, {}};
                 TensorView* q = in.add({2, 2, 5, 4});
                 TensorView* kk = in.add({2, 2, 6, 4});
                 TensorView* v = in.add({2, 2, 6, 3});
                 TensorView* g = in.add({2, 2, 5, 3});
                 for (const char* wrt : {"query", "key", "value"}) f.addOutput(ops::sdpaGrad(q, kk, v, g, wrt, true));
                 f.addOutput(ops::sdpaGrad(q, kk, v, g, "key", false, 0.3));
                 // With the forward's lse and delta, as autodiff writes it: P = exp(S - lse).
                 TensorView* lse = ops::sdpaLse(q, kk, true);
                 TensorView* delta = ops::sum(
                     ops::mul(ops::cast(ops::sdpa(q, kk, v, true), DataType::Float), ops::cast(g, DataType::Float)),
                     {3});
                 for (const char* wrt : {"query", "key", "value"})
                   f.addOutput(ops::sdpaGrad(q, kk, v, g, wrt, true, std::nullopt, lse, delta));
                 return in.values;
               }}};
  }
  return {};
}

class EveryOp : public ::testing::TestWithParam<DataType> {};

TEST_P(EveryOp, MatchesTheReference) {
  for (OpKind k : allOpKinds()) {
    std::vector<OpCase> cases = opCases(k);
    ASSERT_FALSE(cases.empty()) << "no differential test for op " << opInfo(k).name;
    for (const OpCase& c : cases) {
      Fusion f;
      std::vector<Tensor> inputs = c.build(f, GetParam());
      checkAgainstReference(f, inputs, fmt::format("{} ({})", c.name, dtypeName(GetParam())));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, EveryOp, ::testing::Values(DataType::Float, DataType::BFloat16, DataType::Half),
                         [](const auto& info) { return std::string(dtypeName(info.param)); });

// ---- random chains (random_chains.h) -------------------------------------------------------

using testing_helpers::ChainBuilder;

class RandomChains : public ::testing::TestWithParam<DataType> {};

TEST_P(RandomChains, MatchTheReference) {
  constexpr uint64_t kChains = 200;  // per dtype: 400 chains in all
  for (uint64_t seed = 1; seed <= kChains; ++seed) {
    Fusion f;
    std::vector<Tensor> inputs = ChainBuilder(f, GetParam(), seed).build();
    checkAgainstReference(f, inputs, fmt::format("chain {} ({})", seed, dtypeName(GetParam())));
    if (HasFailure()) return;  // one chain's report is enough to debug
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, RandomChains, ::testing::Values(DataType::Float, DataType::BFloat16),
                         [](const auto& info) { return std::string(dtypeName(info.param)); });

}  // namespace
}  // namespace meshfuse
