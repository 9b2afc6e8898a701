// The training ops of ops.def (embedding, embedding_backward, one_hot, log_softmax, cross_entropy):
// shapes and dtypes, errors by their text, the text form, sharding rules and what compiling a
// sharded program gives (the collectives, expand-for-sharding). Numerics: kernel_differential_test
// (CPU kernels vs the reference), cuda_emitter_test (CUDA kernels, emulated), autodiff_test
// (gradients vs finite differences), tests/python/test_training_ops.py (against torch) and
// tests/mpi/training_ops_test.cpp (sharded runs vs one device).
#include <gmock/gmock-matchers.h>
#include <gtest/gtest.h>

#include "decompose/expand_for_sharding.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/ir/placement.h"
#include "meshfuse/ir/printer.h"
#include "meshfuse/ops.h"
#include "lower/pipeline.h"
#include "meshfuse/reference.h"
#include "propagation/sharding_rule.h"
#include "test_helpers.h"

namespace meshfuse {
namespace {

using ::testing::HasSubstr;
using testing_helpers::extents;
using testing_helpers::userErrorMessage;
using Strings = std::vector<std::string>;

TensorView* in(Fusion& f, std::vector<Extent> shape, const char* name, DataType dt = DataType::Float) {
  return f.defineTensor(shape, dt, name);
}

// ---- shapes and dtypes ---------------------------------------------------------------------

TEST(TrainingOpShapes, Embedding) {
  Fusion f;
  TensorView* w = in(f, {11, 6}, "w", DataType::BFloat16);
  TensorView* y = ops::embedding(w, in(f, {Extent::symbolic("b"), 4}, "i", DataType::Int64));
  EXPECT_EQ(extents(y->logical()), (Strings{"?b", "4", "6"}));
  EXPECT_EQ(y->dtype(), DataType::BFloat16);
  TensorView* one = ops::embedding(w, in(f, {}, "j", DataType::Int64));
  EXPECT_EQ(extents(one->logical()), (Strings{"6"}));
  TensorView* grouped = ops::embedding(in(f, {2, 5, 6}, "w3"), in(f, {2, 7}, "i3", DataType::Int64));
  EXPECT_EQ(extents(grouped->logical()), (Strings{"2", "7", "6"}));
}

TEST(TrainingOpShapes, EmbeddingBackwardContractsTheIndexDims) {
  Fusion f;
  TensorView* g = in(f, {3, 4, 6}, "g");
  TensorView* i = in(f, {3, 4}, "i", DataType::Int64);
  EXPECT_EQ(extents(ops::embeddingBackward(g, i, 11)->logical()), (Strings{"11", "6", "r3", "r4"}));
  EXPECT_EQ(extents(ops::embeddingBackward(g, i, 5, /*grouped=*/true)->logical()), (Strings{"3", "5", "6", "r4"}));
}

TEST(TrainingOpShapes, OneHotLogSoftmaxCrossEntropy) {
  Fusion f;
  TensorView* t = in(f, {6}, "t", DataType::Int64);
  TensorView* oh = ops::oneHot(t, 9);
  EXPECT_EQ(extents(oh->logical()), (Strings{"6", "9"}));
  EXPECT_EQ(oh->dtype(), DataType::Int64);
  TensorView* x = in(f, {6, 9}, "x", DataType::BFloat16);
  EXPECT_EQ(ops::logSoftmax(x, -1)->dtype(), DataType::BFloat16);
  TensorView* mean = ops::crossEntropy(x, t);
  EXPECT_EQ(extents(mean->logical()), (Strings{"r6"}));
  EXPECT_EQ(mean->dtype(), DataType::Float) << "the loss is f32 whatever the logits' dtype";
  EXPECT_EQ(extents(ops::crossEntropy(x, t, -100, "none")->logical()), (Strings{"6"}));
  TensorView* x3 = in(f, {2, 9, 5}, "x3");
  EXPECT_EQ(extents(ops::crossEntropy(x3, in(f, {2, 5}, "t3", DataType::Int64), 0, "sum")->logical()),
            (Strings{"r2", "r5"}));
  EXPECT_EQ(extents(ops::crossEntropy(in(f, {9}, "x1"), in(f, {}, "t0", DataType::Int64))->logical()), Strings{});
}

// ---- errors, by their text -------------------------------------------------------------------

TEST(TrainingOpErrors, Embedding) {
  Fusion f;
  TensorView* w = in(f, {11, 6}, "w");
  TensorView* fi = in(f, {3}, "fi");
  EXPECT_EQ(userErrorMessage(ErrorKind::Dtype, [&] { ops::embedding(w, fi); }),
            "embedding: indices %fi must be i64 but is f32");
  TensorView* i = in(f, {3}, "i", DataType::Int64);
  EXPECT_EQ(userErrorMessage(ErrorKind::Shape, [&] { ops::embedding(in(f, {11}, "v"), i); }),
            "embedding: weight %v must have rank 2 ([V, H]) or 3 ([G, V, H]) but has shape [11]");
  EXPECT_EQ(userErrorMessage(ErrorKind::Dtype,
                             [&] {
                               ops::embedding(in(f, {4, 2}, "wi", DataType::Int64), i);
                             }),
            "embedding: expected a floating-point tensor (f32, bf16, f16) but %wi is i64");
  EXPECT_EQ(userErrorMessage(ErrorKind::Shape,
                             [&] {
                               ops::embedding(in(f, {2, 4, 6}, "w3"), in(f, {3, 5}, "i3", DataType::Int64));
                             }),
            "embedding: group dim mismatch: %w3 has 2 but %i3 has 3");
}

TEST(TrainingOpErrors, EmbeddingBackwardAndOneHot) {
  Fusion f;
  TensorView* i = in(f, {3, 4}, "i", DataType::Int64);
  EXPECT_EQ(userErrorMessage(ErrorKind::Shape,
                             [&] {
                               ops::embeddingBackward(in(f, {3, 6}, "g"), i, 8);
                             }),
            "embedding_backward: grad %g must have the shape of indices %i plus a last (hidden) dim, but has shape "
            "[3, 6] for indices of shape [3, 4]");
  EXPECT_EQ(userErrorMessage(ErrorKind::Shape,
                             [&] {
                               ops::embeddingBackward(in(f, {3, 5, 6}, "g2"), i, 8);
                             }),
            "embedding_backward: dim 1 mismatch: %g2 has 5 but %i has 4");
  EXPECT_EQ(userErrorMessage(ErrorKind::Value,
                             [&] {
                               ops::embeddingBackward(in(f, {3, 4, 6}, "g3"), i, -1);
                             }),
            "embedding_backward: num_weights must not be negative but is -1");
  EXPECT_EQ(userErrorMessage(ErrorKind::Value, [&] { ops::oneHot(i, 0); }),
            "one_hot: num_classes must be at least 1 but is 0");
  EXPECT_EQ(userErrorMessage(ErrorKind::Dtype, [&] { ops::oneHot(in(f, {3}, "b", DataType::Bool), 4); }),
            "one_hot: indices %b must be i64 but is bool");
}

TEST(TrainingOpErrors, CrossEntropy) {
  Fusion f;
  TensorView* x = in(f, {6, 9}, "x");
  TensorView* t = in(f, {6}, "t", DataType::Int64);
  EXPECT_EQ(userErrorMessage(ErrorKind::Shape, [&] { ops::crossEntropy(x, in(f, {5}, "t5", DataType::Int64)); }),
            "cross_entropy: batch dim 0 (logits without the class dim) mismatch: %x has 6 but %t5 has 5");
  EXPECT_EQ(userErrorMessage(ErrorKind::Shape,
                             [&] {
                               ops::crossEntropy(x, in(f, {6, 9}, "t2", DataType::Int64));
                             }),
            "cross_entropy: target %t2 must have the shape of logits %x without its class dim 1 (1 dims) but has "
            "shape [6, 9] for logits of shape [6, 9]");
  EXPECT_EQ(userErrorMessage(ErrorKind::Dtype, [&] { ops::crossEntropy(x, in(f, {6}, "tf")); }),
            "cross_entropy: target %tf must be i64 but is f32");
  EXPECT_EQ(userErrorMessage(ErrorKind::Value, [&] { ops::crossEntropy(x, t, -100, "avg"); }),
            "cross_entropy: reduction must be \"mean\", \"sum\" or \"none\" but is \"avg\"");
  EXPECT_EQ(userErrorMessage(ErrorKind::Dtype,
                             [&] {
                               ops::crossEntropy(in(f, {6, 9}, "xi", DataType::Int64), t);
                             }),
            "cross_entropy: expected a floating-point tensor (f32, bf16, f16) but %xi is i64");
  EXPECT_EQ(userErrorMessage(ErrorKind::Shape, [&] { ops::logSoftmax(x, 2); }),
            "log_softmax: dim: dim 2 is out of range for rank 2");
}

TEST(TrainingOpErrors, InTextTheyHaveTheLocation) {
  EXPECT_EQ(userErrorMessage(ErrorKind::Value,
                             [] {
                               parseFusion(R"(fusion {
  %x = input f32[6, 9]
  %t = input i64[6]
  %l = cross_entropy(%x, %t, reduction="avg")
}
)",
                                           "bad.mf");
                             }),
            "bad.mf:4:8: cross_entropy: reduction must be \"mean\", \"sum\" or \"none\" but is \"avg\"");
  EXPECT_THAT(userErrorMessage(
                  ErrorKind::Dtype,
                  [] {
                    parseFusion("fusion {\n  %w = input f32[8, 4]\n  %i = input f32[3]\n  %y = embedding(%w, %i)\n}\n",
                                "bad.mf");
                  }),
              HasSubstr("bad.mf:4:8: embedding: indices %i must be i64 but is f32"));
}

// ---- text form -------------------------------------------------------------------------------

TEST(TrainingOpText, RoundTrips) {
  const char* text = R"(fusion {
  %w = input bf16[11, 6]
  %i = input i64[?b, 4]
  %x = input f32[?b, 9, 4]
  %t = input i64[?b, 4]
  %0 = embedding(%w, %i) : bf16[?b, 4, 6]
  %1 = embedding_backward(%0, %i, num_weights=11) : bf16[11, 6, r?b, r4]
  %2 = embedding_backward(%0, %i, num_weights=3, grouped=true) : bf16[?b, 3, 6, r4]
  %3 = one_hot(%t, num_classes=9) : i64[?b, 4, 9]
  %4 = log_softmax(%x, dim=1) : f32[?b, 9, 4]
  %5 = cross_entropy(%x, %t) : f32[r?b, r4]
  %6 = cross_entropy(%4, %t, ignore_index=0, reduction="sum") : f32[r?b, r4]
  %7 = cross_entropy(%x, %t, reduction="none") : f32[?b, 4]
  output %1, %2, %3, %5, %6, %7
}
)";
  std::string printed = printFusion(*parseFusion(text, "t.mf"));
  EXPECT_EQ(printed, text);
  EXPECT_EQ(printFusion(*parseFusion(printed, "t.mf")), printed);
}

// ---- sharding rules ----------------------------------------------------------------------------

TEST(TrainingOpSharding, Rules) {
  Fusion f;
  TensorView* w = in(f, {11, 6}, "w");
  TensorView* i = in(f, {3, 4}, "i", DataType::Int64);
  ShardingRule emb = shardingRuleOf(ops::embedding(w, i)->definition());
  EXPECT_EQ(emb.operand_maps[0], (std::vector<int64_t>{-1, 2})) << "the table's rows stay whole; H passes";
  EXPECT_EQ(emb.operand_maps[1], (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(emb.weight_operand, 0);
  ShardingRule back = shardingRuleOf(ops::embeddingBackward(in(f, {3, 4, 6}, "g"), i, 11)->definition());
  EXPECT_EQ(back.operand_maps[0], (std::vector<int64_t>{2, 3, 1})) << "index dims contracted (Partial when sharded)";
  EXPECT_EQ(back.contracted_dim, 2);
  TensorView* x = in(f, {3, 9, 4}, "x");
  ShardingRule sum = shardingRuleOf(ops::crossEntropy(x, i, -100, "sum")->definition());
  EXPECT_EQ(sum.operand_maps[0], (std::vector<int64_t>{0, -1, 1})) << "the class dim stays whole";
  EXPECT_TRUE(sum.contraction_ok);
  EXPECT_FALSE(shardingRuleOf(ops::crossEntropy(x, i)->definition()).contraction_ok)
      << "a mean over shards' means is not the mean";
}

// Compiles `text` and returns rank 0's collectives as "kind:tensor" strings.
Strings collectivesOf(const std::string& text, const SymbolBindings& sizes = {}) {
  CompiledProgram p = compile(parseFusion(text, "t.mf"));
  Strings out;
  for (const CollectiveInfo& c : collectives(programForRank(p, 0), sizes)) out.push_back(commKindName(c.kind));
  return out;
}

TEST(TrainingOpSharding, DataParallelLossIsASumOverACountEachAllreduced) {
  // Logits and targets sharded on the batch: mean = sum / count, each a pending sum (one scalar
  // allreduce each); the logits are never gathered.
  EXPECT_EQ(collectivesOf(R"(fusion {
  mesh @dp = [0, 1]
  %x = input f32[8, 5] @dp {split(0, 2), parallelize(0, DIDx)}
  %t = input i64[8] @dp {split(0, 2), parallelize(0, DIDx)}
  %l = cross_entropy(%x, %t)
  output %l
})"),
            (Strings{"allreduce", "allreduce"}));
  EXPECT_EQ(collectivesOf(R"(fusion {
  mesh @dp = [0, 1]
  %x = input f32[8, 5] @dp {split(0, 2), parallelize(0, DIDx)}
  %t = input i64[8] @dp {split(0, 2), parallelize(0, DIDx)}
  %l = cross_entropy(%x, %t, reduction="sum")
  output %l
})"),
            (Strings{"allreduce"}));
}

TEST(TrainingOpSharding, VocabParallelEmbeddingIsOneAllreduce) {
  EXPECT_EQ(collectivesOf(R"(fusion {
  mesh @tp = [0, 1]
  %w = input f32[8, 4] @tp {split(0, 2), parallelize(0, DIDx)}
  %i = input i64[3, 5] @tp {}
  %y = embedding(%w, %i)
  output %y
})"),
            (Strings{"allreduce"}));
  // Hidden-sharded: no communication until the output is asked for whole.
  EXPECT_EQ(collectivesOf(R"(fusion {
  mesh @tp = [0, 1]
  %w = input f32[8, 4] @tp {split(1, 2), parallelize(1, DIDx)}
  %i = input i64[3, 5] @tp {}
  %y = embedding(%w, %i) : f32[3, 5, 4] @tp {split(2, 2), parallelize(2, DIDx)}
  output %y
})"),
            Strings{});
  // Indices sharded on the batch with a replicated table: local.
  EXPECT_EQ(collectivesOf(R"(fusion {
  mesh @dp = [0, 1]
  %w = input f32[8, 4] @dp {}
  %i = input i64[4, 5] @dp {split(0, 2), parallelize(0, DIDx)}
  %y = embedding(%w, %i) : f32[4, 5, 4] @dp {split(0, 2), parallelize(0, DIDx)}
  output %y
})"),
            Strings{});
}

TEST(TrainingOpSharding, ExpandForShardingKeepsNamesAndValues) {
  const char* text = R"(fusion {
  mesh @tp = [0, 1]
  %w = input f32[8, 4] @tp {split(0, 2), parallelize(0, DIDx)}
  %i = input i64[3] @tp {}
  %x = input f32[3, 5] @tp {}
  %y = embedding(%w, %i)
  %loss = cross_entropy(%x, %i, ignore_index=2)
  output %y, %loss
})";
  std::unique_ptr<Fusion> f = parseFusion(text, "t.mf");
  std::unique_ptr<Fusion> expanded = parseFusion(text, "t.mf");
  expandForSharding(*expanded);
  std::string printed = printFusion(*expanded);
  EXPECT_THAT(printed, HasSubstr("reshape(%w, shape=[2, 4, 4])"));
  EXPECT_THAT(printed, HasSubstr("cross_entropy(%x, %i, ignore_index=2, reduction=\"sum\")"));
  EXPECT_THAT(printed, HasSubstr("%y = sum("));
  EXPECT_THAT(printed, HasSubstr("%loss = div("));
  EXPECT_THAT(printed, HasSubstr("output %y, %loss"));
  std::vector<Tensor> inputs = {Tensor::random(DataType::Float, {8, 4}, 1),
                                Tensor::fromValues(DataType::Int64, {3}, {7, 2, 3}),
                                Tensor::random(DataType::Float, {3, 5}, 2)};
  std::vector<Tensor> want = evaluateReference(*f, inputs), got = evaluateReference(*expanded, inputs);
  for (size_t o = 0; o < want.size(); ++o) EXPECT_TRUE(compareWithReference(got[o], want[o]).pass) << o;
}

}  // namespace
}  // namespace meshfuse
