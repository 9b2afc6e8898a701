// autodiff: every op's gradient against central finite differences (f64, reference executor),
// the rule table's completeness, the save policy, placements, round-trip and errors.
#include "meshfuse/autodiff.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <set>

#include "meshfuse/grad_check.h"
#include "meshfuse/ir/device_mesh.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/ir/placement.h"
#include "meshfuse/ir/printer.h"
#include "meshfuse/ops.h"
#include "test_helpers.h"

namespace meshfuse {
namespace {

using testing_helpers::userErrorMessage;

// Ops a case below differentiates (for the coverage test).
std::set<std::string>& covered() {
  static std::set<std::string> s;
  return s;
}

struct Case {
  std::string name;
  std::function<void(Fusion&)> build;  // defines inputs and one output
  SymbolBindings sizes = {};
  double low = -1, high = 1;
  std::vector<int64_t> wrt = {};  // empty: every floating-point input
};

void checkCase(const Case& c) {
  Fusion f;
  c.build(f);
  for (const Expr* e : f.exprs()) covered().insert(std::string(e->name()));
  std::vector<int64_t> wrt = c.wrt;
  if (wrt.empty())
    for (size_t i = 0; i < f.inputs().size(); ++i)
      if (isFloatingPoint(f.inputs()[i]->dtype())) wrt.push_back(static_cast<int64_t>(i));
  GradCheckResult r = gradCheck(f, {0}, wrt, randomInputs(f, c.sizes, 7, c.low, c.high));
  for (const auto& in : r.inputs)
    EXPECT_TRUE(in.pass) << c.name << ": input " << in.name << " rel err " << in.rel_err << " (abs " << in.max_abs_err
                         << ", max |fd| " << in.max_fd << ")\n"
                         << printFusion(*differentiate(f, {0}, wrt).backward);
}

using namespace ops;  // NOLINT

TensorView* in(Fusion& f, std::vector<Extent> shape, const char* name, DataType dt = DataType::Float) {
  return f.defineTensor(shape, dt, name);
}

std::vector<Case> cases() {
  std::vector<Case> cs;
  auto unaryCase = [&](const char* name, std::function<TensorView*(TensorView*)> op, double lo = -1, double hi = 1) {
    cs.push_back({name, [op](Fusion& f) { f.addOutput(op(in(f, {3, 4}, "x"))); }, {}, lo, hi});
  };
  unaryCase("neg", [](TensorView* x) { return neg(x); });
  unaryCase("abs", [](TensorView* x) { return ops::abs(x); });
  unaryCase("exp", [](TensorView* x) { return ops::exp(x); });
  unaryCase("log", [](TensorView* x) { return ops::log(x); }, 0.5, 2);
  unaryCase("sqrt", [](TensorView* x) { return ops::sqrt(x); }, 0.5, 2);
  unaryCase("rsqrt", [](TensorView* x) { return rsqrt(x); }, 0.5, 2);
  unaryCase("reciprocal", [](TensorView* x) { return reciprocal(x); }, 0.5, 2);
  unaryCase("tanh", [](TensorView* x) { return ops::tanh(x); });
  unaryCase("sigmoid", [](TensorView* x) { return sigmoid(x); });
  unaryCase("relu", [](TensorView* x) { return relu(x); });
  unaryCase("gelu", [](TensorView* x) { return gelu(x); }, -3, 3);
  unaryCase("gelu_tanh", [](TensorView* x) { return gelu(x, "tanh"); }, -3, 3);
  unaryCase("silu", [](TensorView* x) { return silu(x); }, -3, 3);
  unaryCase("set", [](TensorView* x) { return set(x); });
  unaryCase("cast_bf16_round_trip", [](TensorView* x) { return cast(cast(x, DataType::BFloat16), DataType::Float); });
  // Binary ops with broadcasting: y [1, 4] against x [3, 4]; a scalar operand.
  auto binaryCase = [&](const char* name, std::function<TensorView*(TensorView*, TensorView*)> op, double lo = -1,
                        double hi = 1) {
    cs.push_back({name, [op](Fusion& f) { f.addOutput(op(in(f, {3, 4}, "x"), in(f, {1, 4}, "y"))); }, {}, lo, hi});
  };
  binaryCase("add_broadcast", [](TensorView* x, TensorView* y) { return add(x, y); });
  binaryCase("sub_broadcast", [](TensorView* x, TensorView* y) { return sub(y, x); });
  binaryCase("mul_broadcast", [](TensorView* x, TensorView* y) { return mul(x, y); });
  binaryCase("div_broadcast", [](TensorView* x, TensorView* y) { return div(x, y); }, 0.5, 2);
  binaryCase("pow", [](TensorView* x, TensorView* y) { return pow(x, y); }, 0.5, 2);
  binaryCase("maximum", [](TensorView* x, TensorView* y) { return maximum(x, y); });
  binaryCase("minimum", [](TensorView* x, TensorView* y) { return minimum(x, y); });
  binaryCase("scalars", [](TensorView* x, TensorView* y) { return add(mul(x, 2.0), div(1.0, add(mul(y, y), 1.0))); });
  binaryCase("where_compare", [](TensorView* x, TensorView* y) {
    return add(where(gt(x, y), x, mul(y, 3.0)), add(add(cast(eq(x, y), DataType::Float), cast(ne(x, y), DataType::Float)),
                                                     add(cast(lt(x, y), DataType::Float),
                                                         add(cast(le(x, y), DataType::Float), cast(ge(x, y), DataType::Float)))));
  });
  // Reductions, a symbolic dim included.
  cs.push_back({"sum", [](Fusion& f) { f.addOutput(sum(in(f, {3, 4, 2}, "x"), {0, 2})); }});
  cs.push_back({"mean_symbolic", [](Fusion& f) { f.addOutput(mean(in(f, {Extent::symbolic("t"), 4}, "x"), {0})); }, {{"t", 5}}});
  cs.push_back({"sum_symbolic_loss", [](Fusion& f) {
                  TensorView* x = in(f, {Extent::symbolic("t"), 4}, "x");
                  f.addOutput(sum(mul(x, x), {0, 1}));
                }, {{"t", 3}}});
  cs.push_back({"max", [](Fusion& f) { f.addOutput(ops::max(in(f, {3, 5}, "x"), {1})); }});
  cs.push_back({"mean", [](Fusion& f) { f.addOutput(mean(in(f, {3, 5}, "x"), {-1})); }});
  // GEMMs.
  cs.push_back({"linear_bias_rank3", [](Fusion& f) {
                  f.addOutput(linear(in(f, {2, 3, 4}, "x"), in(f, {5, 4}, "w"), in(f, {5}, "b")));
                }});
  cs.push_back({"linear_rank1", [](Fusion& f) { f.addOutput(linear(in(f, {4}, "x"), in(f, {5, 4}, "w"), in(f, {5}, "b"))); }});
  cs.push_back({"linear_symbolic_batch", [](Fusion& f) {
                  f.addOutput(linear(in(f, {Extent::symbolic("t"), 4}, "x"), in(f, {3, 4}, "w")));
                }, {{"t", 3}}});
  cs.push_back({"matmul_batched", [](Fusion& f) { f.addOutput(matmul(in(f, {2, 3, 4}, "a"), in(f, {2, 4, 5}, "b"))); }});
  cs.push_back({"matmul_shared_b", [](Fusion& f) { f.addOutput(matmul(in(f, {2, 3, 4}, "a"), in(f, {4, 5}, "b"))); }});
  // Layout ops; a permute makes the matmul read a non-contiguous view.
  cs.push_back({"broadcast_in_dim", [](Fusion& f) {
                  f.addOutput(broadcastInDim(in(f, {3, 1}, "x"), {2, 3, 4}, {1, 2}));
                }});
  cs.push_back({"reshape_symbolic", [](Fusion& f) {
                  f.addOutput(reshape(in(f, {Extent::symbolic("t"), 6}, "x"), {-1, 3}));
                }, {{"t", 2}}});
  cs.push_back({"permute_matmul", [](Fusion& f) {
                  f.addOutput(matmul(permute(in(f, {4, 3}, "a"), {1, 0}), in(f, {4, 2}, "b")));
                }});
  cs.push_back({"slice", [](Fusion& f) { f.addOutput(slice(in(f, {4, 5}, "x"), {1, 0}, {3, 4})); }});
  cs.push_back({"cat", [](Fusion& f) { f.addOutput(cat({in(f, {2, 3}, "x"), in(f, {2, 2}, "y")}, 1)); }});
  // Normalizations.
  cs.push_back({"softmax", [](Fusion& f) { f.addOutput(softmax(in(f, {3, 5}, "x"), 1)); }});
  cs.push_back({"softmax_dim0", [](Fusion& f) { f.addOutput(softmax(in(f, {3, 5}, "x"), 0)); }});
  cs.push_back({"layer_norm", [](Fusion& f) {
                  f.addOutput(layerNorm(in(f, {2, 3, 6}, "x"), in(f, {6}, "w"), in(f, {6}, "b")));
                }});
  cs.push_back({"layer_norm_plain", [](Fusion& f) { f.addOutput(layerNorm(in(f, {3, 6}, "x"))); }});
  cs.push_back({"rms_norm", [](Fusion& f) { f.addOutput(rmsNorm(in(f, {3, 6}, "x"), in(f, {6}, "w"))); }});
  // Attention.
  cs.push_back({"sdpa", [](Fusion& f) {
                  f.addOutput(sdpa(in(f, {1, 2, 3, 4}, "q"), in(f, {1, 2, 5, 4}, "k"), in(f, {1, 2, 5, 3}, "v")));
                }});
  cs.push_back({"sdpa_causal", [](Fusion& f) {
                  f.addOutput(sdpa(in(f, {2, 2, 4, 4}, "q"), in(f, {2, 2, 4, 4}, "k"), in(f, {2, 2, 4, 4}, "v"), true));
                }});
  cs.push_back({"sdpa_causal_uneven_scaled", [](Fusion& f) {
                  f.addOutput(sdpa(in(f, {1, 1, 3, 4}, "q"), in(f, {1, 1, 5, 4}, "k"), in(f, {1, 1, 5, 2}, "v"), true, 0.3));
                }});
  cs.push_back({"sdpa_lse", [](Fusion& f) { f.addOutput(sdpaLse(in(f, {1, 2, 3, 4}, "q"), in(f, {1, 2, 5, 4}, "k"))); }});
  cs.push_back({"sdpa_lse_causal_uneven_scaled", [](Fusion& f) {
                  f.addOutput(sdpaLse(in(f, {1, 1, 3, 4}, "q"), in(f, {1, 1, 5, 4}, "k"), true, 0.3));
                }});
  // Training ops (integer inputs are indices in [0, 4)).
  cs.push_back({"log_softmax", [](Fusion& f) { f.addOutput(logSoftmax(in(f, {3, 5}, "x"), 1)); }});
  cs.push_back({"log_softmax_dim0", [](Fusion& f) { f.addOutput(logSoftmax(in(f, {3, 5}, "x"), 0)); }});
  cs.push_back({"embedding", [](Fusion& f) {
                  f.addOutput(embedding(in(f, {6, 3}, "w"), in(f, {2, 5}, "i", DataType::Int64)));
                }});
  cs.push_back({"embedding_grouped", [](Fusion& f) {
                  f.addOutput(embedding(in(f, {2, 5, 3}, "w"), in(f, {2, 4}, "i", DataType::Int64)));
                }});
  cs.push_back({"embedding_backward", [](Fusion& f) {
                  f.addOutput(embeddingBackward(in(f, {2, 5, 3}, "g"), in(f, {2, 5}, "i", DataType::Int64), 6));
                }});
  cs.push_back({"embedding_backward_grouped", [](Fusion& f) {
                  f.addOutput(embeddingBackward(in(f, {2, 5, 3}, "g"), in(f, {2, 5}, "i", DataType::Int64), 4, true));
                }});
  cs.push_back({"one_hot_weights", [](Fusion& f) {  // one_hot has no gradient; x's flows through the mul
                  TensorView* x = in(f, {3, 4}, "x");
                  f.addOutput(mul(x, cast(oneHot(in(f, {3}, "t", DataType::Int64), 4), DataType::Float)));
                }});
  cs.push_back({"cross_entropy_mean", [](Fusion& f) {
                  f.addOutput(crossEntropy(in(f, {5, 4}, "x"), in(f, {5}, "t", DataType::Int64)));
                }, {}, -2, 2});
  cs.push_back({"cross_entropy_sum_ignored", [](Fusion& f) {  // targets 2 are ignored
                  f.addOutput(crossEntropy(in(f, {6, 4}, "x"), in(f, {6}, "t", DataType::Int64), 2, "sum"));
                }, {}, -2, 2});
  cs.push_back({"cross_entropy_mean_ignored", [](Fusion& f) {
                  f.addOutput(crossEntropy(in(f, {6, 4}, "x"), in(f, {6}, "t", DataType::Int64), 1));
                }, {}, -2, 2});
  cs.push_back({"cross_entropy_none_spatial", [](Fusion& f) {  // [N, C, d]: class dim 1
                  f.addOutput(crossEntropy(in(f, {2, 4, 3}, "x"), in(f, {2, 3}, "t", DataType::Int64), 3, "none"));
                }, {}, -2, 2});
  cs.push_back({"cross_entropy_unbatched", [](Fusion& f) {
                  f.addOutput(crossEntropy(in(f, {4}, "x"), in(f, {}, "t", DataType::Int64)));
                }, {}, -2, 2});
  cs.push_back({"cross_entropy_symbolic_batch", [](Fusion& f) {
                  f.addOutput(crossEntropy(in(f, {Extent::symbolic("t"), 4}, "x"),
                                           in(f, {Extent::symbolic("t")}, "t", DataType::Int64)));
                }, {{"t", 5}}, -2, 2});
  cs.push_back({"embedding_lm_loss", [](Fusion& f) {  // embedding -> layer_norm -> tied LM head -> loss
                  TensorView* w = in(f, {4, 6}, "w");
                  TensorView* tok = in(f, {2, 3}, "tok", DataType::Int64);
                  TensorView* h = layerNorm(embedding(w, tok), in(f, {6}, "g"), nullptr);
                  TensorView* logits = reshape(linear(h, w), {6, 4});
                  f.addOutput(crossEntropy(logits, reshape(tok, {6})));
                }});
  // A value used twice (accumulation) and an integer input that is not differentiated.
  cs.push_back({"mlp", [](Fusion& f) {
                  TensorView* x = in(f, {3, 4}, "x");
                  TensorView* h = gelu(linear(x, in(f, {8, 4}, "w1"), in(f, {8}, "b1")), "tanh");
                  TensorView* y = linear(h, in(f, {4, 8}, "w2"));
                  f.addOutput(mean(mul(add(y, x), add(y, x)), {0, 1}));
                }});
  return cs;
}

class OpGradient : public ::testing::TestWithParam<Case> {};
TEST_P(OpGradient, MatchesFiniteDifferences) { checkCase(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Autodiff, OpGradient, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// The compile-time check (grad_rules.cpp static_asserts) makes an op without a rule a build
// failure; this lists the rules at run time and requires a finite-difference case for every
// differentiable op.
TEST(AutodiffRules, EveryOpHasARuleAndAGradientTest) {
  const auto& rules = gradientRules();
  ASSERT_EQ(rules.size(), allOpKinds().size());
  for (const Case& c : cases()) {
    Fusion f;
    c.build(f);
    for (const Expr* e : f.exprs()) covered().insert(std::string(e->name()));
  }
  for (size_t i = 0; i < rules.size(); ++i) {
    EXPECT_EQ(rules[i].op, opInfo(allOpKinds()[i]).name);
    EXPECT_FALSE(rules[i].rule.empty());
    // sdpa_grad (attention's gradient) is tested by every sdpa case, and refuses to be
    // differentiated again (AttentionGradientIsNotDifferentiatedAgain).
    if (rules[i].formula.starts_with("not differentiable")) continue;
    EXPECT_TRUE(covered().count(std::string(rules[i].op))) << "no gradient test exercises " << rules[i].op;
  }
}

TEST(Autodiff, SdpaGradientsAreSdpaGradOpsSharingTheirOperands) {
  Fusion f;
  TensorView* q = in(f, {1, 2, 3, 4}, "q");
  TensorView* k = in(f, {1, 2, 5, 4}, "k");
  f.addOutput(sdpa(q, k, in(f, {1, 2, 5, 3}, "v"), true));
  Gradients g = differentiate(f, {0}, {0, 1});  // no dv: no op for it
  std::string text = printFusion(*g.backward);
  // With the forward's log-sum-exp (recomputed) and delta = rowsum(grad * output) (saved output).
  EXPECT_NE(text.find("%0 = sdpa_lse(%q, %k, is_causal=true) : f32[1, 2, 3]"), std::string::npos) << text;
  EXPECT_NE(text.find("%1 = mul(%saved3, %grad_out0) : f32[1, 2, 3, 3]"), std::string::npos) << text;
  EXPECT_NE(text.find("%2 = sum(%1, dims=[3]) : f32[1, 2, 3, r3]"), std::string::npos) << text;
  EXPECT_NE(text.find("%grad_q = sdpa_grad(%q, %k, %v, %grad_out0, lse=%0, delta=%2, wrt=\"query\", is_causal=true) "
                      ": f32[1, 2, 3, 4]"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("%grad_k = sdpa_grad(%q, %k, %v, %grad_out0, lse=%0, delta=%2, wrt=\"key\", is_causal=true) "
                      ": f32[1, 2, 5, 4]"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("wrt=\"value\""), std::string::npos) << text;
}

TEST(Autodiff, SdpaGradChecksItsOperands) {
  Fusion f;
  TensorView* q = in(f, {1, 2, 3, 4}, "q");
  TensorView* kv = in(f, {1, 2, 5, 4}, "kv");
  TensorView* g = in(f, {1, 2, 3, 4}, "g");
  EXPECT_EQ(userErrorMessage(ErrorKind::Value, [&] { sdpaGrad(q, kv, kv, g, "keys"); }),
            "sdpa_grad: wrt must be \"query\", \"key\" or \"value\" but is \"keys\"");
  EXPECT_THAT(userErrorMessage(ErrorKind::Shape, [&] { sdpaGrad(q, kv, kv, kv, "query"); }),
              ::testing::HasSubstr("query sequence dim"));
  EXPECT_THAT(userErrorMessage(ErrorKind::Dtype,
                               [&] {
                                 sdpaGrad(q, kv, kv, in(f, {1, 2, 3, 4}, "h", DataType::BFloat16), "key");
                               }),
              ::testing::HasSubstr("sdpa_grad: %h is bf16 but query %q is f32"));
  EXPECT_EQ(sdpaGrad(q, kv, kv, g, "value")->dtype(), DataType::Float);
  // The forward's lse and delta: both or neither, f32 [b, heads, s].
  TensorView* lse = in(f, {1, 2, 3}, "lse");
  EXPECT_EQ(userErrorMessage(ErrorKind::Value, [&] { sdpaGrad(q, kv, kv, g, "key", false, std::nullopt, lse); }),
            "sdpa_grad: lse and delta are given together or not at all, but only lse is");
  EXPECT_EQ(userErrorMessage(
                ErrorKind::Dtype,
                [&] {
                  sdpaGrad(q, kv, kv, g, "key", false, std::nullopt, lse, in(f, {1, 2, 3}, "d16", DataType::BFloat16));
                }),
            "sdpa_grad: %d16 must be f32 but is bf16");
  EXPECT_THAT(userErrorMessage(ErrorKind::Shape,
                               [&] {
                                 sdpaGrad(q, kv, kv, g, "key", false, std::nullopt, lse, in(f, {1, 2, 5}, "d5"));
                               }),
              ::testing::HasSubstr("query sequence dim"));
  EXPECT_EQ(sdpaGrad(q, kv, kv, g, "key", false, std::nullopt, lse, in(f, {1, 2, 3}, "delta"))->dtype(),
            DataType::Float);
}

TEST(Autodiff, AttentionGradientIsNotDifferentiatedAgain) {
  Fusion f;
  TensorView* q = in(f, {1, 1, 3, 4}, "q");
  f.addOutput(sdpaGrad(q, q, q, q, "query"));
  EXPECT_EQ(userErrorMessage(ErrorKind::Unsupported, [&] { differentiate(f, {0}, {0}); }),
            "autodiff: sdpa_grad (the gradient of attention) cannot be differentiated again");
}

TEST(Autodiff, Bf16GradientsAreBf16AndAccumulateInF32) {
  Fusion f;
  TensorView* x = in(f, {3, 8}, "x", DataType::BFloat16);
  f.addOutput(softmax(x, 1));
  Gradients g = differentiate(f, {0}, {0});
  ASSERT_EQ(g.backward->outputs().size(), 1u);
  EXPECT_EQ(g.backward->outputs()[0]->dtype(), DataType::BFloat16);
  std::string text = printFusion(*g.backward);
  EXPECT_NE(text.find("cast(%grad_out0, dtype=f32)"), std::string::npos) << text;
  // The f64 check ignores the dtype: the formulas are the same.
  GradCheckResult r = gradCheck(f, {0}, {0}, randomInputs(f, {}, 3));
  EXPECT_TRUE(r.pass) << r.inputs[0].rel_err;
}

TEST(Autodiff, Bf16ContributionsToOneGradientAreSummedInF32) {
  Fusion f;
  TensorView* x = in(f, {4}, "x", DataType::BFloat16);
  f.addOutput(add(add(mul(x, 2.0), mul(x, 3.0)), mul(x, 4.0)));
  Gradients g = differentiate(f, {0}, {0});
  const Fusion& b = *g.backward;
  // Three contributions: two adds in f32, one cast back to bf16 for the output.
  int f32_adds = 0;
  for (const Expr* e : b.exprs()) f32_adds += e->kind() == OpKind::Add && e->output()->dtype() == DataType::Float;
  EXPECT_EQ(f32_adds, 2) << printFusion(b);
  EXPECT_EQ(b.outputs()[0]->dtype(), DataType::BFloat16);
  EXPECT_EQ(b.outputs()[0]->definition()->kind(), OpKind::Cast);
  EXPECT_TRUE(gradCheck(f, {0}, {0}, randomInputs(f, {}, 1)).pass);
}

TEST(Autodiff, DefaultPolicySavesGemmsAndRecomputesPointwise) {
  Fusion f;
  TensorView* x = in(f, {3, 4}, "x");
  TensorView* w = in(f, {8, 4}, "w");
  TensorView* h = linear(x, w);
  f.addOutput(sum(gelu(h, "tanh"), {0, 1}));
  Gradients g = differentiate(f, {0}, {1});
  // Backward reads x (for dW) and the linear's output (to recompute gelu' at it), then the seed.
  ASSERT_EQ(g.backward_inputs.size(), 3u);
  EXPECT_EQ(g.backward_inputs[0].kind, BackwardInput::ForwardInput);
  EXPECT_EQ(g.backward_inputs[1].kind, BackwardInput::ForwardOutput);
  EXPECT_EQ(g.backward_inputs[1].reason, "GEMM output (linear)");
  EXPECT_EQ(g.backward_inputs[2].kind, BackwardInput::Seed);
  EXPECT_EQ(g.forward->outputs().size(), 2u);
  EXPECT_TRUE(g.recomputed.empty());  // gelu' needs x of gelu only, which is saved
  std::string d = describeSaves(g);
  EXPECT_NE(d.find("GEMM output (linear)"), std::string::npos) << d;

  Fusion f2;
  TensorView* x2 = in(f2, {3, 4}, "x");
  TensorView* y2 = ops::exp(mul(x2, x2));
  f2.addOutput(sum(mul(y2, 2.0), {0, 1}));
  Gradients def = differentiate(f2, {0}, {0});
  EXPECT_EQ(def.recomputed.size(), 2u) << describeSaves(def);  // mul, exp recomputed from x
  Gradients all = differentiate(f2, {0}, {0}, {SavePolicy::All});
  EXPECT_TRUE(all.recomputed.empty()) << describeSaves(all);
  EXPECT_GT(all.forward->outputs().size(), def.forward->outputs().size());
}

TEST(Autodiff, BothFusionsRoundTripThroughText) {
  Fusion f;
  TensorView* x = in(f, {Extent::symbolic("t"), 4}, "x");
  TensorView* q = in(f, {1, 2, 4, 4}, "q");
  TensorView* a = sdpa(q, q, q, true);
  f.addOutput(add(sum(layerNorm(linear(x, in(f, {4, 4}, "w")), nullptr, nullptr), {0, 1}), sum(a, {0, 1, 2, 3})));
  Gradients g = differentiate(f, {0}, {0, 1, 2});
  for (const Fusion* p : {g.forward.get(), g.backward.get()}) {
    std::string text = printFusion(*p);
    EXPECT_EQ(printFusion(*parseFusion(text)), text);
  }
}

TEST(Autodiff, GradientsTakeTheirInputsPlacements) {
  Fusion f;
  DeviceMesh mesh({0, 1});
  TensorView* x = in(f, {4, 6}, "x");
  TensorView* w = in(f, {8, 6}, "w");
  applyPlacements(x, mesh, {Placement::replicate()});
  applyPlacements(w, mesh, {Placement::shard(0)});
  f.addOutput(sum(relu(linear(x, w)), {0, 1}));
  Gradients g = differentiate(f, {0}, {0, 1});
  const Fusion& b = *g.backward;
  ASSERT_EQ(b.outputs().size(), 2u);
  EXPECT_EQ(placementsOf(b.outputs()[0]), std::vector<Placement>{Placement::replicate()});
  EXPECT_EQ(placementsOf(b.outputs()[1]), std::vector<Placement>{Placement::shard(0)});
  EXPECT_TRUE(b.outputs()[1]->pinned());
  EXPECT_EQ(*b.outputs()[1]->mesh(), mesh);
  EXPECT_EQ(b.outputs()[1]->name(), "grad_w");
}

TEST(AutodiffErrors, IntegerInputCannotBeDifferentiated) {
  Fusion f;
  TensorView* x = in(f, {3}, "x");
  TensorView* n = in(f, {3}, "n", DataType::Int64);
  f.addOutput(sum(mul(x, n), {0}));
  std::string msg = userErrorMessage(ErrorKind::Dtype, [&] { differentiate(f, {0}, {1}); });
  EXPECT_EQ(msg,
            "differentiate: cannot differentiate with respect to input 1 (%n) of dtype i64: only floating-point "
            "(f32, bf16, f16) inputs have gradients");
  EXPECT_EQ(userErrorMessage(ErrorKind::Value, [&] { differentiate(f, {0}, {2}); }),
            "differentiate: input index 2 is out of range (the fusion has 2)");
  // The integer input is still usable when not differentiated.
  EXPECT_TRUE(gradCheck(f, {0}, {0}, randomInputs(f, {}, 1)).pass);
}

TEST(Autodiff, UnreachedInputGetsZeroGradient) {
  Fusion f;
  TensorView* x = in(f, {3}, "x");
  in(f, {2}, "unused");
  f.addOutput(sum(x, {0}));
  GradCheckResult r = gradCheck(f, {0}, {0, 1}, randomInputs(f, {}, 1));
  EXPECT_TRUE(r.pass);
  EXPECT_EQ(r.inputs[1].max_abs_err, 0.0);
}

}  // namespace
}  // namespace meshfuse
