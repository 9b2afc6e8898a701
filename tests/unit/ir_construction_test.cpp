// Building fusions through Fusion::defineTensor / Fusion::apply: output shapes (user-visible and
// logical, with reduction dims), dtype promotion, default attributes, and the op table itself.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "meshfuse/ir/fusion.h"
#include "test_helpers.h"

namespace meshfuse {
namespace {

using testing_helpers::extents;
using testing_helpers::shapeOf;
using Strs = std::vector<std::string>;
using Ints = std::vector<int64_t>;

TEST(OpTable, EveryKindHasAUniqueNameThatRoundTrips) {
  const std::vector<OpKind>& kinds = allOpKinds();
  ASSERT_EQ(kinds.size(), 49u);  // ops.def: 12 unary, 7 binary, 6 compare, where, cast, set, ..., sdpa, sdpa_lse, sdpa_grad, 5 training ops
  std::set<std::string_view> names;
  for (size_t i = 0; i < kinds.size(); ++i) {
    OpKind k = kinds[i];
    EXPECT_EQ(static_cast<size_t>(k), i) << "allOpKinds() must list the enum in order";
    EXPECT_EQ(opInfo(k).kind, k);
    EXPECT_FALSE(opInfo(k).name.empty());
    EXPECT_TRUE(names.insert(opInfo(k).name).second) << "duplicate op name " << opInfo(k).name;
    std::optional<OpKind> parsed = parseOpKind(opInfo(k).name);
    ASSERT_TRUE(parsed.has_value()) << opInfo(k).name;
    EXPECT_EQ(*parsed, k);
  }
  EXPECT_FALSE(parseOpKind("nope").has_value());
  EXPECT_FALSE(parseOpKind("").has_value());
  EXPECT_FALSE(parseOpKind("Add").has_value()) << "op names are case-sensitive";
}

TEST(OpTable, SchemasComeFromOpsDef) {
  const OpInfo& linear = opInfo(OpKind::Linear);
  EXPECT_EQ(linear.name, "linear");
  EXPECT_EQ(linear.category, OpCategory::Gemm);
  ASSERT_EQ(linear.operands.size(), 3u);
  EXPECT_FALSE(linear.operands[1].optional);
  EXPECT_TRUE(linear.operands[2].optional);
  EXPECT_EQ(linear.findOperand("bias"), 2);
  EXPECT_EQ(linear.findOperand("nope"), -1);
  EXPECT_TRUE(opInfo(OpKind::Cat).operands[0].variadic);
  const AttrSpec* eps = opInfo(OpKind::LayerNorm).findAttr("eps");
  ASSERT_NE(eps, nullptr);
  EXPECT_EQ(eps->type, AttrType::Float);
  ASSERT_TRUE(eps->default_value.has_value());
  EXPECT_DOUBLE_EQ(std::get<double>(*eps->default_value), 1e-5);
  const AttrSpec* dims = opInfo(OpKind::Sum).findAttr("dims");
  ASSERT_NE(dims, nullptr);
  EXPECT_FALSE(dims->default_value.has_value()) << "sum's dims are required";
}

TEST(DefineTensor, DynamicAndBroadcastDims) {
  Fusion f;
  TensorView* x = f.defineTensor({-1, 1, Extent::symbolic("t"), 8}, DataType::BFloat16, "x");
  std::vector<Extent> xs = x->shape();
  ASSERT_EQ(xs.size(), 4u);
  EXPECT_FALSE(xs[0].isStatic()) << "-1 is a size bound at run time";
  EXPECT_EQ(xs[1], Extent(1));
  EXPECT_EQ(xs[2], Extent::symbolic("t"));
  EXPECT_EQ(xs[3], Extent(8));
  EXPECT_EQ(x->dtype(), DataType::BFloat16);
  EXPECT_TRUE(x->logical()[1]->isBroadcast());
  EXPECT_EQ(x->logical()[0]->iterType(), IterType::Iteration);
  EXPECT_EQ(x->loop(), x->logical());
  EXPECT_EQ(x->mesh(), nullptr);
  EXPECT_TRUE(f.isInput(x));
  TensorView* y = f.defineTensor({-1, -1}, DataType::Float);
  std::set<std::string> symbols = {xs[0].symbol(), "t", y->shape()[0].symbol(), y->shape()[1].symbol()};
  EXPECT_EQ(symbols.size(), 4u) << "every -1 gets its own symbol, distinct from the user's";
  EXPECT_EQ(f.displayName(x), "%x");
  EXPECT_EQ(f.displayName(y), "%0");
}

TEST(Apply, UnaryKeepsShapeAndDtype) {
  for (OpKind k : allOpKinds()) {
    if (opInfo(k).category != OpCategory::Unary) continue;
    Fusion f;
    TensorView* x = f.defineTensor({Extent::symbolic("t"), 64}, DataType::BFloat16, "x");
    TensorView* y = f.apply(k, {x});
    EXPECT_EQ(shapeOf(y), (Strs{"?t", "64"})) << opInfo(k).name;
    EXPECT_EQ(y->dtype(), DataType::BFloat16) << opInfo(k).name;
    ASSERT_NE(y->definition(), nullptr);
    EXPECT_EQ(y->definition()->kind(), k);
    EXPECT_NE(y->logical()[0], x->logical()[0]) << "outputs get their own IterDomains";
  }
  Fusion f;
  TensorView* i = f.defineTensor({4}, DataType::Int64);
  EXPECT_EQ(f.apply(OpKind::Neg, {i})->dtype(), DataType::Int64);
  EXPECT_EQ(f.apply(OpKind::Relu, {i})->dtype(), DataType::Int64);
  TensorView* g = f.apply(OpKind::Gelu, {f.defineTensor({4}, DataType::Float)});
  EXPECT_EQ(g->definition()->attr<std::string>("approximate"), "none");
  TensorView* gt = f.apply(OpKind::Gelu, {g}, {{"approximate", std::string("tanh")}});
  EXPECT_EQ(gt->definition()->attr<std::string>("approximate"), "tanh");
}

TEST(Apply, BinaryPromotesDtypesAndBroadcasts) {
  Fusion f;
  TensorView* a = f.defineTensor({4, 1}, DataType::BFloat16, "a");
  TensorView* b = f.defineTensor({1, 8}, DataType::Float, "b");
  TensorView* h = f.defineTensor({4, 8}, DataType::Half, "h");
  TensorView* i = f.defineTensor({4, 8}, DataType::Int64, "i");
  TensorView* p = f.defineTensor({4, 8}, DataType::Bool, "p");

  TensorView* ab = f.apply(OpKind::Add, {a, b});
  EXPECT_EQ(shapeOf(ab), (Strs{"4", "8"}));
  EXPECT_FALSE(ab->logical()[0]->isBroadcast());
  EXPECT_EQ(ab->dtype(), DataType::Float) << "bf16 + f32 -> f32";
  EXPECT_EQ(f.apply(OpKind::Mul, {a, h})->dtype(), DataType::Float) << "bf16 * f16 -> f32";
  EXPECT_EQ(f.apply(OpKind::Sub, {a, a})->dtype(), DataType::BFloat16);
  EXPECT_EQ(f.apply(OpKind::Add, {h, i})->dtype(), DataType::Half) << "float wins over int";
  EXPECT_EQ(f.apply(OpKind::Add, {i, p})->dtype(), DataType::Int64) << "i64 + bool -> i64";
  EXPECT_EQ(f.apply(OpKind::Div, {i, i})->dtype(), DataType::Float) << "true division of i64";
  EXPECT_EQ(f.apply(OpKind::Pow, {i, f.scalar(2, DataType::Int64)})->dtype(), DataType::Float);
  EXPECT_EQ(f.apply(OpKind::Maximum, {i, i})->dtype(), DataType::Int64);

  // Scalars: a float scalar makes an integer result float, but never widens a float tensor.
  EXPECT_EQ(f.apply(OpKind::Mul, {a, f.scalar(0.5)})->dtype(), DataType::BFloat16);
  EXPECT_EQ(f.apply(OpKind::Add, {i, f.scalar(0.5)})->dtype(), DataType::Float);
  EXPECT_EQ(f.apply(OpKind::Add, {i, f.scalar(2, DataType::Int64)})->dtype(), DataType::Int64);
  TensorView* sa = f.apply(OpKind::Sub, {f.scalar(1.0), a});
  EXPECT_EQ(shapeOf(sa), (Strs{"4", "1"}));
  EXPECT_TRUE(sa->logical()[1]->isBroadcast());
  EXPECT_TRUE(sa->definition()->input(0)->valKind() == ValKind::Scalar);
}

TEST(Apply, CompareAndWhere) {
  Fusion f;
  TensorView* x = f.defineTensor({Extent::symbolic("t"), 8}, DataType::Float, "x");
  TensorView* y = f.defineTensor({1, 8}, DataType::BFloat16, "y");
  TensorView* i = f.defineTensor({Extent::symbolic("t"), 8}, DataType::Int64, "i");
  for (OpKind k : {OpKind::Eq, OpKind::Ne, OpKind::Lt, OpKind::Le, OpKind::Gt, OpKind::Ge}) {
    TensorView* c = f.apply(k, {x, y});
    EXPECT_EQ(c->dtype(), DataType::Bool) << opInfo(k).name;
    EXPECT_EQ(shapeOf(c), (Strs{"?t", "8"}));
  }
  TensorView* cond = f.apply(OpKind::Gt, {i, f.scalar(0, DataType::Int64)});
  EXPECT_EQ(cond->dtype(), DataType::Bool);
  TensorView* w = f.apply(OpKind::Where, {cond, x, y});
  EXPECT_EQ(w->dtype(), DataType::Float) << "the condition does not take part in promotion";
  EXPECT_EQ(shapeOf(w), (Strs{"?t", "8"}));
  EXPECT_EQ(f.apply(OpKind::Where, {cond, y, y})->dtype(), DataType::BFloat16);
  EXPECT_EQ(f.apply(OpKind::Where, {cond, i, f.scalar(1.5)})->dtype(), DataType::Float);
  EXPECT_EQ(f.apply(OpKind::Where, {cond, i, f.scalar(0, DataType::Int64)})->dtype(), DataType::Int64);
}

TEST(Apply, WhereWithTwoFloatScalarsIsFloat) {
  // where(cond, 1.0, 0.0) selects between two float values: the result holds floats, not bools.
  Fusion f;
  TensorView* cond = f.defineTensor({4}, DataType::Bool, "cond");
  TensorView* w = f.apply(OpKind::Where, {cond, f.scalar(1.0), f.scalar(0.0)});
  EXPECT_EQ(shapeOf(w), (Strs{"4"}));
  EXPECT_EQ(std::string(dtypeName(w->dtype())), "f32");
}

TEST(Apply, CastAndSet) {
  Fusion f;
  TensorView* x = f.defineTensor({2, Extent::symbolic("t")}, DataType::Float, "x");
  TensorView* c = f.apply(OpKind::Cast, {x}, {{"dtype", DataType::BFloat16}});
  EXPECT_EQ(c->dtype(), DataType::BFloat16);
  EXPECT_EQ(shapeOf(c), (Strs{"2", "?t"}));
  EXPECT_EQ(c->definition()->attr<DataType>("dtype"), DataType::BFloat16);
  TensorView* s = f.apply(OpKind::Set, {c}, {}, "copy");
  EXPECT_EQ(s->dtype(), DataType::BFloat16);
  EXPECT_EQ(shapeOf(s), (Strs{"2", "?t"}));
  EXPECT_EQ(s->name(), "copy");
  EXPECT_EQ(f.findTensor("%copy"), s);
  EXPECT_EQ(f.findTensor("copy"), s);
}

TEST(Apply, ReductionsKeepReducedDimsInPlace) {
  Fusion f;
  TensorView* x = f.defineTensor({4, 8, 16}, DataType::BFloat16, "x");
  TensorView* s = f.apply(OpKind::Sum, {x}, {{"dims", Ints{1}}});
  EXPECT_EQ(extents(s->logical()), (Strs{"4", "r8", "16"}));
  EXPECT_EQ(shapeOf(s), (Strs{"4", "16"}));
  EXPECT_EQ(s->rank(), 2);
  EXPECT_EQ(s->dtype(), DataType::BFloat16);
  TensorView* m = f.apply(OpKind::Max, {x}, {{"dims", Ints{-1, 0}}});
  EXPECT_EQ(extents(m->logical()), (Strs{"r4", "8", "r16"}));
  EXPECT_EQ(shapeOf(m), (Strs{"8"}));
  TensorView* mean = f.apply(OpKind::Mean, {x}, {{"dims", Ints{0, 1, 2}}});
  EXPECT_EQ(extents(mean->logical()), (Strs{"r4", "r8", "r16"}));
  EXPECT_EQ(mean->rank(), 0);
  // A reduction of a reduction output only sees its remaining dims.
  TensorView* ss = f.apply(OpKind::Sum, {s}, {{"dims", Ints{1}}});
  EXPECT_EQ(extents(ss->logical()), (Strs{"4", "r16"}));

  TensorView* b = f.defineTensor({3, 5}, DataType::Bool, "b");
  EXPECT_EQ(f.apply(OpKind::Sum, {b}, {{"dims", Ints{0}}})->dtype(), DataType::Int64) << "sum of bool counts";
  TensorView* i = f.defineTensor({3, 5}, DataType::Int64, "i");
  EXPECT_EQ(f.apply(OpKind::Sum, {i}, {{"dims", Ints{0}}})->dtype(), DataType::Int64);
  EXPECT_EQ(f.apply(OpKind::Max, {i}, {{"dims", Ints{1}}})->dtype(), DataType::Int64);
}

TEST(Apply, LinearWithAndWithoutBias) {
  Fusion f;
  TensorView* x = f.defineTensor({Extent::symbolic("t"), 64}, DataType::BFloat16, "x");
  TensorView* w = f.defineTensor({256, 64}, DataType::BFloat16, "w");
  TensorView* bias = f.defineTensor({256}, DataType::BFloat16, "b");
  TensorView* y = f.apply(OpKind::Linear, {x, w});
  EXPECT_EQ(extents(y->logical()), (Strs{"?t", "256", "r64"}));
  EXPECT_EQ(shapeOf(y), (Strs{"?t", "256"}));
  EXPECT_EQ(y->dtype(), DataType::BFloat16);
  ASSERT_EQ(y->definition()->inputs().size(), 3u) << "absent optional operands are nullptr";
  EXPECT_EQ(y->definition()->input("bias"), nullptr);
  EXPECT_EQ(y->definition()->input("weight"), w);

  TensorView* yb = f.apply(OpKind::Linear, {x, w, bias});
  EXPECT_EQ(extents(yb->logical()), (Strs{"?t", "256", "r64"}));
  EXPECT_EQ(yb->definition()->input("bias"), bias);
  EXPECT_EQ(x->uses().size(), 2u);

  TensorView* x3 = f.defineTensor({2, 8, 64}, DataType::Float, "x3");
  TensorView* w3 = f.defineTensor({32, 64}, DataType::Float, "w3");
  EXPECT_EQ(extents(f.apply(OpKind::Linear, {x3, w3})->logical()), (Strs{"2", "8", "32", "r64"}));
}

TEST(Apply, MatmulBatchedAndBroadcastB) {
  Fusion f;
  TensorView* a = f.defineTensor({2, 3, 8, 16}, DataType::Float, "a");
  TensorView* b = f.defineTensor({2, 3, 16, 32}, DataType::Float, "b");
  TensorView* c = f.apply(OpKind::Matmul, {a, b});
  EXPECT_EQ(extents(c->logical()), (Strs{"2", "3", "8", "32", "r16"}));
  EXPECT_EQ(shapeOf(c), (Strs{"2", "3", "8", "32"}));
  TensorView* a3 = f.defineTensor({Extent::symbolic("t"), 8, 16}, DataType::Half, "a3");
  TensorView* b2 = f.defineTensor({16, 4}, DataType::Half, "b2");
  TensorView* d = f.apply(OpKind::Matmul, {a3, b2});
  EXPECT_EQ(extents(d->logical()), (Strs{"?t", "8", "4", "r16"}));
  EXPECT_EQ(d->dtype(), DataType::Half);
}

TEST(Apply, BroadcastInDim) {
  Fusion f;
  TensorView* x = f.defineTensor({8}, DataType::Float, "x");
  TensorView* y = f.apply(OpKind::BroadcastInDim, {x}, {{"shape", Ints{1, 8}}, {"broadcast_dims", Ints{1}}});
  EXPECT_EQ(shapeOf(y), (Strs{"1", "8"}));
  EXPECT_TRUE(y->logical()[0]->isBroadcast());
  EXPECT_FALSE(y->logical()[1]->isBroadcast());
  TensorView* e = f.apply(OpKind::BroadcastInDim, {y}, {{"shape", Ints{4, 8}}, {"broadcast_dims", Ints{0, 1}}});
  EXPECT_EQ(shapeOf(e), (Strs{"4", "8"})) << "a broadcast dim expands";
  EXPECT_FALSE(e->logical()[0]->isBroadcast());
  TensorView* t = f.defineTensor({Extent::symbolic("t")}, DataType::Float, "t");
  TensorView* z = f.apply(OpKind::BroadcastInDim, {t}, {{"shape", Ints{-1, 1, 3}}, {"broadcast_dims", Ints{0}}});
  EXPECT_EQ(shapeOf(z), (Strs{"?t", "1", "3"})) << "-1 keeps the input's size";
}

TEST(Apply, ReshapeStaticInferredAndSymbolic) {
  Fusion f;
  TensorView* x = f.defineTensor({4, 6}, DataType::Float, "x");
  EXPECT_EQ(shapeOf(f.apply(OpKind::Reshape, {x}, {{"shape", Ints{24}}})), (Strs{"24"}));
  EXPECT_EQ(shapeOf(f.apply(OpKind::Reshape, {x}, {{"shape", Ints{2, -1}}})), (Strs{"2", "12"}));
  TensorView* r1 = f.apply(OpKind::Reshape, {x}, {{"shape", Ints{4, 1, 6}}});
  EXPECT_TRUE(r1->logical()[1]->isBroadcast());

  TensorView* t = f.defineTensor({Extent::symbolic("t"), 64}, DataType::Float, "t");
  TensorView* heads = f.apply(OpKind::Reshape, {t}, {{"shape", Ints{-1, 4, 16}}});
  EXPECT_EQ(shapeOf(heads), (Strs{"?t", "4", "16"}));
  EXPECT_EQ(heads->shape()[0], Extent::symbolic("t"));
  TensorView* half = f.apply(OpKind::Reshape, {t}, {{"shape", Ints{-1, 128}}});
  EXPECT_EQ(half->shape()[0], Extent::symbolic("t", 1, 2));
  EXPECT_EQ(shapeOf(half), (Strs{"?t/2", "128"}));
  TensorView* dbl = f.apply(OpKind::Reshape, {t}, {{"shape", Ints{-1, 32}}});
  EXPECT_EQ(shapeOf(dbl), (Strs{"?t*2", "32"}));
  TensorView* back = f.apply(OpKind::Reshape, {heads}, {{"shape", Ints{-1, 64}}});
  EXPECT_EQ(shapeOf(back), (Strs{"?t", "64"}));
}

TEST(Apply, PermuteSliceCat) {
  Fusion f;
  TensorView* x = f.defineTensor({2, 3, 4}, DataType::Float, "x");
  EXPECT_EQ(shapeOf(f.apply(OpKind::Permute, {x}, {{"dims", Ints{2, 0, 1}}})), (Strs{"4", "2", "3"}));
  EXPECT_EQ(shapeOf(f.apply(OpKind::Permute, {x}, {{"dims", Ints{-1, -3, 1}}})), (Strs{"4", "2", "3"}));

  TensorView* s = f.defineTensor({Extent::symbolic("t"), 16}, DataType::Float, "s");
  TensorView* sl = f.apply(OpKind::Slice, {s}, {{"starts", Ints{0, 4}}, {"ends", Ints{-1, 12}}});
  EXPECT_EQ(shapeOf(sl), (Strs{"?t", "8"}));
  TensorView* sl2 = f.apply(OpKind::Slice, {x}, {{"starts", Ints{1, 0, 1}}, {"ends", Ints{2, 3, 4}}});
  EXPECT_EQ(shapeOf(sl2), (Strs{"1", "3", "3"}));

  TensorView* a = f.defineTensor({2, 8}, DataType::BFloat16, "a");
  TensorView* b = f.defineTensor({3, 8}, DataType::BFloat16, "b");
  TensorView* c = f.apply(OpKind::Cat, {a, b, a}, {{"dim", int64_t{0}}});
  EXPECT_EQ(shapeOf(c), (Strs{"7", "8"}));
  EXPECT_EQ(c->dtype(), DataType::BFloat16);
  EXPECT_EQ(c->definition()->inputs().size(), 3u) << "a variadic tail keeps every operand";
  TensorView* d = f.apply(OpKind::Cat, {a, a}, {{"dim", int64_t{-1}}});
  EXPECT_EQ(shapeOf(d), (Strs{"2", "16"}));
}

TEST(Apply, SoftmaxAndNormsFillDefaults) {
  Fusion f;
  TensorView* x = f.defineTensor({Extent::symbolic("t"), 64}, DataType::BFloat16, "x");
  TensorView* w = f.defineTensor({64}, DataType::BFloat16, "w");
  TensorView* b = f.defineTensor({64}, DataType::BFloat16, "b");
  TensorView* sm = f.apply(OpKind::Softmax, {x}, {{"dim", int64_t{-1}}});
  EXPECT_EQ(shapeOf(sm), (Strs{"?t", "64"}));
  EXPECT_EQ(sm->dtype(), DataType::BFloat16);

  TensorView* ln = f.apply(OpKind::LayerNorm, {x, w, b});
  EXPECT_EQ(shapeOf(ln), (Strs{"?t", "64"}));
  EXPECT_DOUBLE_EQ(ln->definition()->attr<double>("eps"), 1e-5);
  TensorView* ln_bias_only = f.apply(OpKind::LayerNorm, {x, nullptr, b}, {{"eps", int64_t{1}}});
  EXPECT_EQ(ln_bias_only->definition()->input("weight"), nullptr);
  EXPECT_EQ(ln_bias_only->definition()->input("bias"), b);
  EXPECT_DOUBLE_EQ(ln_bias_only->definition()->attr<double>("eps"), 1.0) << "an int literal is a float";
  TensorView* ln_plain = f.apply(OpKind::LayerNorm, {x});
  EXPECT_EQ(ln_plain->definition()->inputs().size(), 3u);

  TensorView* rms = f.apply(OpKind::RmsNorm, {x, w});
  EXPECT_EQ(shapeOf(rms), (Strs{"?t", "64"}));
  EXPECT_DOUBLE_EQ(rms->definition()->attr<double>("eps"), 1e-6);
}

TEST(Apply, Sdpa) {
  Fusion f;
  TensorView* q = f.defineTensor({2, 4, 16, 32}, DataType::Half, "q");
  TensorView* k = f.defineTensor({2, 4, 24, 32}, DataType::Half, "k");
  TensorView* v = f.defineTensor({2, 4, 24, 8}, DataType::Half, "v");
  TensorView* o = f.apply(OpKind::Sdpa, {q, k, v});
  EXPECT_EQ(extents(o->logical()), (Strs{"2", "4", "16", "8"}));
  EXPECT_EQ(o->dtype(), DataType::Half);
  EXPECT_FALSE(o->definition()->attr<bool>("is_causal"));
  EXPECT_DOUBLE_EQ(o->definition()->attr<double>("scale"), 0.0);
  TensorView* oc = f.apply(OpKind::Sdpa, {q, k, v}, {{"is_causal", true}, {"scale", 0.125}});
  EXPECT_TRUE(oc->definition()->attr<bool>("is_causal"));
  EXPECT_DOUBLE_EQ(oc->definition()->attr<double>("scale"), 0.125);
}

TEST(Fusion, ProgramOrderUsesAndPositionalNames) {
  Fusion f;
  TensorView* x = f.defineTensor({4}, DataType::Float, "x");
  TensorView* a = f.apply(OpKind::Exp, {x});
  TensorView* b = f.apply(OpKind::Add, {a, x}, {}, "b");
  TensorView* c = f.apply(OpKind::Mul, {b, b});
  f.addOutput(c);
  ASSERT_EQ(f.exprs().size(), 3u);
  EXPECT_EQ(f.exprs()[0]->output(), a);
  EXPECT_EQ(f.exprs()[2]->output(), c);
  EXPECT_EQ(f.tensorViews(), (std::vector<TensorView*>{x, a, b, c}));
  EXPECT_EQ(x->uses().size(), 2u);
  EXPECT_EQ(b->uses().size(), 1u) << "an Expr that uses a value twice is one use";
  EXPECT_EQ(f.displayName(a), "%0");
  EXPECT_EQ(f.displayName(b), "%b");
  EXPECT_EQ(f.displayName(c), "%1") << "named values do not consume a position";
  EXPECT_EQ(f.findTensor("%1"), c);
  EXPECT_EQ(f.findTensor("%2"), nullptr);
  EXPECT_TRUE(f.isOutput(c));
  EXPECT_FALSE(f.isOutput(b));
  EXPECT_EQ(f.displayName(f.scalar(2, DataType::Int64)), "2");
  EXPECT_EQ(f.displayName(f.scalar(0.5)), "0.5");
}

}  // namespace
}  // namespace meshfuse
