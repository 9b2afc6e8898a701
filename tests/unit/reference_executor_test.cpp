// The reference executor against independently computed values: every op, in f32 and bf16
// (bf16 inputs and outputs, math in f32 or better). Expected values come from hand-worked
// numbers or from naive formulas written here, never from the executor's own loops.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "meshfuse/ops.h"
#include "meshfuse/reference.h"

namespace meshfuse {
namespace {

using Values = std::vector<double>;
using Shape = std::vector<int64_t>;

class ReferenceOps : public ::testing::TestWithParam<DataType> {
 protected:
  DataType dt() const { return GetParam(); }
  // bf16 holds ~3 significant digits; f32 ~7.
  double tol(double expected) const {
    return dt() == DataType::BFloat16 ? 1e-2 * std::max(1.0, std::fabs(expected)) : 1e-5 * std::max(1.0, std::fabs(expected));
  }
  // Values as the dtype stores them (what the executor actually receives).
  Values rounded(const Values& v) const {
    Values out;
    for (double x : v) out.push_back(roundToDtype(x, dt()));
    return out;
  }
  Tensor tensor(const Shape& s, const Values& v) const { return Tensor::fromValues(dt(), s, v); }

  // Builds a fusion with inputs of the given shapes (dtype dt()), applies `body`, runs it.
  Tensor run(const std::vector<std::pair<Shape, Values>>& inputs,
             const std::function<TensorView*(Fusion&, const std::vector<TensorView*>&)>& body) {
    Fusion f;
    std::vector<TensorView*> tvs;
    std::vector<Tensor> values;
    for (const auto& [shape, v] : inputs) {
      std::vector<Extent> extents(shape.begin(), shape.end());
      tvs.push_back(f.defineTensor(extents, dt()));
      values.push_back(tensor(shape, v));
    }
    f.addOutput(body(f, tvs));
    return evaluateReference(f, values).at(0);
  }
  void expectValues(const Tensor& t, const Shape& shape, const Values& expected) {
    ASSERT_EQ(t.shape(), shape);
    ASSERT_EQ(t.numel(), static_cast<int64_t>(expected.size()));
    for (size_t i = 0; i < expected.size(); ++i)
      EXPECT_NEAR(t.get(static_cast<int64_t>(i)), expected[i], tol(expected[i])) << "element " << i;
  }
};

const Values kX = {-2.0, -0.5, 0.25, 1.5, 3.0, -1.25};  // shape [2, 3]
const Values kPos = {0.5, 1.0, 2.0, 4.0, 0.25, 9.0};
const Values kY = {1.0, -3.0, 0.5, 2.0, 2.0, -0.75};

TEST_P(ReferenceOps, Unary) {
  struct Case {
    std::function<TensorView*(TensorView*)> op;
    std::function<double(double)> f;
    bool positive;
  };
  auto gelu_erf = [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); };
  auto gelu_tanh = [](double x) {
    return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  };
  std::vector<Case> cases = {
      {ops::neg, [](double x) { return -x; }, false},
      {ops::abs, [](double x) { return std::fabs(x); }, false},
      {ops::exp, [](double x) { return std::exp(x); }, false},
      {ops::log, [](double x) { return std::log(x); }, true},
      {ops::sqrt, [](double x) { return std::sqrt(x); }, true},
      {ops::rsqrt, [](double x) { return 1 / std::sqrt(x); }, true},
      {ops::reciprocal, [](double x) { return 1 / x; }, false},
      {ops::tanh, [](double x) { return std::tanh(x); }, false},
      {ops::sigmoid, [](double x) { return 1 / (1 + std::exp(-x)); }, false},
      {ops::relu, [](double x) { return x > 0 ? x : 0.0; }, false},
      {ops::silu, [](double x) { return x / (1 + std::exp(-x)); }, false},
      {[](TensorView* x) { return ops::gelu(x, "none"); }, gelu_erf, false},
      {[](TensorView* x) { return ops::gelu(x, "tanh"); }, gelu_tanh, false},
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE("unary case " + std::to_string(c));
    Values in = rounded(cases[c].positive ? kPos : kX), expected;
    for (double x : in) expected.push_back(cases[c].f(x));
    expectValues(run({{{2, 3}, in}}, [&](Fusion&, auto t) { return cases[c].op(t[0]); }), {2, 3}, expected);
  }
}

TEST_P(ReferenceOps, BinaryWithBroadcastAndScalars) {
  Values a = rounded(kX), b = rounded({0.5, 2.0, -1.0});  // b: [1, 3], broadcast over rows
  struct Case {
    std::function<TensorView*(TensorView*, TensorView*)> op;
    std::function<double(double, double)> f;
  };
  std::vector<Case> cases = {
      {[](auto x, auto y) { return ops::add(x, y); }, [](double x, double y) { return x + y; }},
      {[](auto x, auto y) { return ops::sub(x, y); }, [](double x, double y) { return x - y; }},
      {[](auto x, auto y) { return ops::mul(x, y); }, [](double x, double y) { return x * y; }},
      {[](auto x, auto y) { return ops::div(x, y); }, [](double x, double y) { return x / y; }},
      {[](auto x, auto y) { return ops::maximum(x, y); }, [](double x, double y) { return std::max(x, y); }},
      {[](auto x, auto y) { return ops::minimum(x, y); }, [](double x, double y) { return std::min(x, y); }},
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE("binary case " + std::to_string(c));
    Values expected;
    for (int i = 0; i < 6; ++i) expected.push_back(cases[c].f(a[i], b[i % 3]));
    expectValues(run({{{2, 3}, a}, {{1, 3}, b}}, [&](Fusion&, auto t) { return cases[c].op(t[0], t[1]); }), {2, 3},
                 expected);
  }
  // pow with positive bases, and a scalar operand on either side.
  Values p = rounded(kPos), expected;
  for (double x : p) expected.push_back(std::pow(x, 1.5));
  expectValues(run({{{2, 3}, p}}, [](Fusion&, auto t) { return ops::pow(t[0], 1.5); }), {2, 3}, expected);
  expected.clear();
  for (double x : a) expected.push_back(3.0 - x);
  expectValues(run({{{2, 3}, a}}, [](Fusion&, auto t) { return ops::sub(3.0, t[0]); }), {2, 3}, expected);
}

TEST_P(ReferenceOps, ComparisonsWhereCastSet) {
  Values a = rounded(kX), b = rounded(kY);
  auto cmp = [&](std::function<TensorView*(TensorView*, TensorView*)> op, std::function<bool(double, double)> f) {
    Tensor t = run({{{2, 3}, a}, {{2, 3}, b}}, [&](Fusion&, auto v) { return op(v[0], v[1]); });
    EXPECT_EQ(t.dtype(), DataType::Bool);
    for (int i = 0; i < 6; ++i) EXPECT_EQ(t.get(i) != 0, f(a[i], b[i])) << "element " << i;
  };
  cmp([](auto x, auto y) { return ops::lt(x, y); }, [](double x, double y) { return x < y; });
  cmp([](auto x, auto y) { return ops::le(x, y); }, [](double x, double y) { return x <= y; });
  cmp([](auto x, auto y) { return ops::gt(x, y); }, [](double x, double y) { return x > y; });
  cmp([](auto x, auto y) { return ops::ge(x, y); }, [](double x, double y) { return x >= y; });
  cmp([](auto x, auto y) { return ops::eq(x, y); }, [](double x, double y) { return x == y; });
  cmp([](auto x, auto y) { return ops::ne(x, y); }, [](double x, double y) { return x != y; });
  // where(a > b, a, b) is the elementwise maximum.
  Values expected;
  for (int i = 0; i < 6; ++i) expected.push_back(std::max(a[i], b[i]));
  expectValues(run({{{2, 3}, a}, {{2, 3}, b}},
                   [](Fusion&, auto v) { return ops::where(ops::gt(v[0], v[1]), v[0], v[1]); }),
               {2, 3}, expected);
  // cast to i64 truncates toward zero; set copies.
  Tensor c = run({{{2, 3}, a}}, [](Fusion&, auto v) { return ops::cast(v[0], DataType::Int64); });
  EXPECT_EQ(c.toValues(), (Values{-2, 0, 0, 1, 3, -1}));
  expectValues(run({{{2, 3}, a}}, [](Fusion&, auto v) { return ops::set(v[0]); }), {2, 3}, a);
}

TEST_P(ReferenceOps, ReductionsOverEveryAxis) {
  Values a = rounded(kX);  // [[-2, -0.5, 0.25], [1.5, 3, -1.25]]
  auto sum = [](auto x, std::vector<int64_t> d) { return ops::sum(x, d); };
  expectValues(run({{{2, 3}, a}}, [&](Fusion&, auto v) { return sum(v[0], {0}); }), {3},
               {a[0] + a[3], a[1] + a[4], a[2] + a[5]});
  expectValues(run({{{2, 3}, a}}, [&](Fusion&, auto v) { return sum(v[0], {1}); }), {2},
               {a[0] + a[1] + a[2], a[3] + a[4] + a[5]});
  expectValues(run({{{2, 3}, a}}, [&](Fusion&, auto v) { return sum(v[0], {0, 1}); }), {},
               {a[0] + a[1] + a[2] + a[3] + a[4] + a[5]});
  expectValues(run({{{2, 3}, a}}, [](Fusion&, auto v) { return ops::max(v[0], {1}); }), {2},
               {std::max({a[0], a[1], a[2]}), std::max({a[3], a[4], a[5]})});
  expectValues(run({{{2, 3}, a}}, [](Fusion&, auto v) { return ops::max(v[0], {0}); }), {3},
               {std::max(a[0], a[3]), std::max(a[1], a[4]), std::max(a[2], a[5])});
  expectValues(run({{{2, 3}, a}}, [](Fusion&, auto v) { return ops::mean(v[0], {-1}); }), {2},
               {(a[0] + a[1] + a[2]) / 3, (a[3] + a[4] + a[5]) / 3});
  // keepdim keeps the reduced axis as a size-1 dim.
  expectValues(run({{{2, 3}, a}}, [](Fusion&, auto v) { return ops::sum(v[0], {1}, /*keepdim=*/true); }), {2, 1},
               {a[0] + a[1] + a[2], a[3] + a[4] + a[5]});
}

// Naive GEMM: out[i, j] = sum_k a[i, k] * b_at(k, j).
Values gemm(const Values& a, int64_t m, int64_t k, int64_t n, const std::function<double(int64_t, int64_t)>& b_at) {
  Values out(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p) out[i * n + j] += a[i * k + p] * b_at(p, j);
  return out;
}

TEST_P(ReferenceOps, LinearAndMatmul) {
  Values x = rounded({1, 2, -1, 0.5, 3, -2}), w = rounded({1, 0, 2, -1, 0.5, 1, 0, 2, 3, 1, -1, 0.25});
  Values bias = rounded({0.5, -1, 2, 0});
  // linear: x [2, 3], w [4, 3] -> [2, 4]; out = x w^T (+ bias)
  Values expected = gemm(x, 2, 3, 4, [&](int64_t p, int64_t j) { return w[j * 3 + p]; });
  expectValues(run({{{2, 3}, x}, {{4, 3}, w}}, [](Fusion&, auto v) { return ops::linear(v[0], v[1]); }), {2, 4},
               expected);
  for (int i = 0; i < 8; ++i) expected[i] += bias[i % 4];
  expectValues(run({{{2, 3}, x}, {{4, 3}, w}, {{4}, bias}},
                   [](Fusion&, auto v) { return ops::linear(v[0], v[1], v[2]); }),
               {2, 4}, expected);
  // matmul: x [2, 3] @ w viewed [3, 4] -> [2, 4]
  expectValues(run({{{2, 3}, x}, {{3, 4}, w}}, [](Fusion&, auto v) { return ops::matmul(v[0], v[1]); }), {2, 4},
               gemm(x, 2, 3, 4, [&](int64_t p, int64_t j) { return w[p * 4 + j]; }));
  // batched matmul: [2, 1, 3] @ [2, 3, 2]
  Values b = rounded({1, -1, 0.5, 2, 0, 1, -2, 1, 1, 0, 0.5, 0.5});
  Values expected_b;
  for (int64_t g = 0; g < 2; ++g) {
    Values row(x.begin() + g * 3, x.begin() + g * 3 + 3);
    Values r = gemm(row, 1, 3, 2, [&](int64_t p, int64_t j) { return b[g * 6 + p * 2 + j]; });
    expected_b.insert(expected_b.end(), r.begin(), r.end());
  }
  expectValues(run({{{2, 1, 3}, x}, {{2, 3, 2}, b}}, [](Fusion&, auto v) { return ops::matmul(v[0], v[1]); }),
               {2, 1, 2}, expected_b);
}

TEST_P(ReferenceOps, ShapeOps) {
  Values a = rounded(kX);  // [2, 3]
  // broadcast_in_dim [3] -> [2, 3]
  Values row = rounded({1, 2, 3});
  expectValues(run({{{3}, row}}, [](Fusion&, auto v) { return ops::broadcastInDim(v[0], {2, 3}, {1}); }), {2, 3},
               {row[0], row[1], row[2], row[0], row[1], row[2]});
  // reshape keeps the row-major order
  expectValues(run({{{2, 3}, a}}, [](Fusion&, auto v) { return ops::reshape(v[0], {3, 2}); }), {3, 2}, a);
  // permute transposes
  expectValues(run({{{2, 3}, a}}, [](Fusion&, auto v) { return ops::permute(v[0], {1, 0}); }), {3, 2},
               {a[0], a[3], a[1], a[4], a[2], a[5]});
  // slice [0:2, 1:3]
  expectValues(run({{{2, 3}, a}}, [](Fusion&, auto v) { return ops::slice(v[0], {0, 1}, {2, 3}); }), {2, 2},
               {a[1], a[2], a[4], a[5]});
  // cat along dim 1 and dim 0
  Values b = rounded({7, 8});
  expectValues(run({{{2, 3}, a}, {{2, 1}, b}}, [](Fusion&, auto v) { return ops::cat({v[0], v[1]}, 1); }), {2, 4},
               {a[0], a[1], a[2], b[0], a[3], a[4], a[5], b[1]});
  expectValues(run({{{2, 3}, a}, {{1, 3}, row}}, [](Fusion&, auto v) { return ops::cat({v[0], v[1]}, 0); }), {3, 3},
               {a[0], a[1], a[2], a[3], a[4], a[5], row[0], row[1], row[2]});
}

TEST_P(ReferenceOps, SoftmaxAndNormalizations) {
  Values a = rounded(kX);
  Values expected;
  for (int r = 0; r < 2; ++r) {
    double m = std::max({a[r * 3], a[r * 3 + 1], a[r * 3 + 2]}), s = 0;
    for (int j = 0; j < 3; ++j) s += std::exp(a[r * 3 + j] - m);
    for (int j = 0; j < 3; ++j) expected.push_back(std::exp(a[r * 3 + j] - m) / s);
  }
  expectValues(run({{{2, 3}, a}}, [](Fusion&, auto v) { return ops::softmax(v[0], -1); }), {2, 3}, expected);
  // softmax over dim 0: columns sum to 1
  Tensor s0 = run({{{2, 3}, a}}, [](Fusion&, auto v) { return ops::softmax(v[0], 0); });
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(s0.get(j) + s0.get(3 + j), 1.0, tol(1.0));
  // layer_norm and rms_norm over the last dim, with weight and bias
  Values w = rounded({2, 0.5, 1}), b = rounded({0, 1, -1});
  Values ln, rms;
  for (int r = 0; r < 2; ++r) {
    double mean = (a[r * 3] + a[r * 3 + 1] + a[r * 3 + 2]) / 3, var = 0, sq = 0;
    for (int j = 0; j < 3; ++j) var += (a[r * 3 + j] - mean) * (a[r * 3 + j] - mean) / 3, sq += a[r * 3 + j] * a[r * 3 + j] / 3;
    for (int j = 0; j < 3; ++j) {
      ln.push_back((a[r * 3 + j] - mean) / std::sqrt(var + 1e-5) * w[j] + b[j]);
      rms.push_back(a[r * 3 + j] / std::sqrt(sq + 1e-6) * w[j]);
    }
  }
  expectValues(run({{{2, 3}, a}, {{3}, w}, {{3}, b}}, [](Fusion&, auto v) { return ops::layerNorm(v[0], v[1], v[2]); }),
               {2, 3}, ln);
  expectValues(run({{{2, 3}, a}, {{3}, w}}, [](Fusion&, auto v) { return ops::rmsNorm(v[0], v[1]); }), {2, 3}, rms);
}

TEST_P(ReferenceOps, AttentionCausalAndNot) {
  // q, k, v: [1, 1, 3, 2]
  Values q = rounded({1, 0, 0, 1, 1, 1}), k = rounded({1, 1, -1, 0, 0, 2}), v = rounded({1, 2, 3, 4, 5, 6});
  for (bool causal : {false, true}) {
    Values expected;
    for (int i = 0; i < 3; ++i) {
      double scores[3], m = -INFINITY, sum = 0;
      for (int j = 0; j < 3; ++j) {
        scores[j] = (q[i * 2] * k[j * 2] + q[i * 2 + 1] * k[j * 2 + 1]) / std::sqrt(2.0);
        if (causal && j > i) scores[j] = -INFINITY;
        m = std::max(m, scores[j]);
      }
      for (double& s : scores) sum += (s = std::exp(s - m));
      for (int c = 0; c < 2; ++c) {
        double acc = 0;
        for (int j = 0; j < 3; ++j) acc += scores[j] / sum * v[j * 2 + c];
        expected.push_back(acc);
      }
    }
    SCOPED_TRACE(causal ? "causal" : "not causal");
    expectValues(run({{{1, 1, 3, 2}, q}, {{1, 1, 3, 2}, k}, {{1, 1, 3, 2}, v}},
                     [&](Fusion&, auto t) { return ops::sdpa(t[0], t[1], t[2], causal); }),
                 {1, 1, 3, 2}, expected);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ReferenceOps, ::testing::Values(DataType::Float, DataType::BFloat16),
                         [](const auto& info) { return std::string(dtypeName(info.param)); });

}  // namespace
}  // namespace meshfuse
