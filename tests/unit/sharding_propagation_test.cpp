// Sharding rules and propagation in isolation: which ops a pending sum (Partial) passes through,
// what an op needs of each operand, and the errors a pin that no operand can give raises.
#include <gmock/gmock-matchers.h>
#include <gtest/gtest.h>

#include "decompose/decompose_reshardings.h"
#include "meshfuse/ir/fusion.h"
#include "meshfuse/ir/parser.h"
#include "meshfuse/ir/placement.h"
#include "meshfuse/ops.h"
#include "propagation/propagate_shardings.h"
#include "propagation/required_sharding.h"
#include "test_helpers.h"

namespace meshfuse {
namespace {

using testing_helpers::userErrorMessage;

// The Partial output of `e` passing through from operand `source`.
OutputChoice pendingFrom(int64_t source) {
  OutputChoice c;
  c.state = Placement::partial();
  c.source_operand = source;
  return c;
}

// What `e` needs of operand `i` to give a pending sum passed through from operand `source`.
std::optional<Placement> need(const Expr* e, int64_t source, size_t i) {
  return requiredOperandState(e, shardingRuleOf(e), pendingFrom(source), i);
}

struct PendingSum {
  Fusion f;
  TensorView* q = f.defineTensor({8, 12}, DataType::Float, "q");
  TensorView* r = f.defineTensor({8, 12}, DataType::Float, "r");
};

TEST(ShardingRule, PendingSumPassesThroughAnOperandTheOpIsLinearIn) {
  PendingSum p;
  const Expr* scaled = ops::mul(p.q, 0.5)->definition();
  EXPECT_EQ(need(scaled, 0, 0), Placement::partial());
  EXPECT_EQ(need(scaled, 0, 1), Placement::replicate()) << "a scalar factor is the same on every device";
  const Expr* weighted = ops::mul(p.q, p.r)->definition();
  EXPECT_EQ(need(weighted, 0, 1), Placement::replicate());
  const Expr* numerator = ops::div(p.q, p.r)->definition();
  EXPECT_EQ(need(numerator, 0, 0), Placement::partial());
}

TEST(ShardingRule, NoPendingSumThroughANonLinearOperand) {
  PendingSum p;
  EXPECT_EQ(need(ops::div(p.r, p.q)->definition(), 1, 1), std::nullopt) << "div is not linear in its denominator";
  EXPECT_EQ(need(ops::div(2.0, p.q)->definition(), 1, 1), std::nullopt);
  EXPECT_EQ(need(ops::div(2.0, p.q)->definition(), -1, 0), std::nullopt) << "no source: nothing is pending";
  // One value in two operands: the op is quadratic in it.
  EXPECT_EQ(need(ops::mul(p.q, p.q)->definition(), 0, 0), std::nullopt);
  EXPECT_EQ(need(ops::div(p.q, p.q)->definition(), 0, 0), std::nullopt);
}

TEST(ShardingRule, NoScalarAddedToAPendingSum) {
  PendingSum p;
  for (const Expr* e :
       {ops::add(p.q, 1.0)->definition(), ops::sub(p.q, 1.0)->definition(), ops::sub(3.0, p.q)->definition()}) {
    OutputChoice pending;
    pending.state = Placement::partial();
    const size_t scalar = e->inputs()[0]->valKind() == ValKind::Scalar ? 0 : 1;
    EXPECT_EQ(requiredOperandState(e, shardingRuleOf(e), pending, scalar), std::nullopt) << e->name();
    EXPECT_EQ(requiredOperandState(e, shardingRuleOf(e), pending, 1 - scalar), Placement::partial()) << e->name();
  }
}

// linear's contracted dim is the last one before any Partial dims: a linear of a pending sum
// gets [t, n, r{k}, r{Partial}] and must not read the Partial dim as its contraction.
TEST(ShardingRule, LinearContractedDimSkipsPartialDims) {
  auto f = parseFusion(R"(fusion {
  mesh @m = [0, 1]
  %x = input f32[8, 16, r2] @m {parallelize(2, DIDx)}
  %w = input f32[12, 16] @m {}
  %y = linear(%x, %w) : f32[8, 12, r16, r2] @m {parallelize(3, DIDx)}
  output %y
})");
  ShardingRule rule = shardingRuleOf(f->exprs()[0]);
  EXPECT_EQ(rule.operand_maps[0], (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(rule.operand_maps[1], (std::vector<int64_t>{1, 2}));
}

// A pin that asks an op for a pending sum no operand can give: the op computes the whole value
// and a set after it makes it the pinned pending sum locally (Replicate -> Partial: the first
// rank keeps it, the others hold zeros), as DTensor's redistribute to Partial does.
TEST(ShardingPropagation, APinnedPendingSumNoOperandCanGiveIsPartitionedAfterTheOp) {
  for (const std::string op : {"add(%q, 1.0)", "mul(%q, %q)", "div(2.0, %q)", "relu(%q)"}) {
    auto f = parseFusion(R"(fusion {
  mesh @m = [0, 1]
  %a = input f32[8, 16] @m {split(1, 2), parallelize(1, DIDx)}
  %b = input f32[16, 12] @m {split(0, 2), parallelize(0, DIDx)}
  %q = matmul(%a, %b)
  %s = )" + op + R"( : f32[8, 12, r2] @m {parallelize(2, DIDx)}
  output %s
})",
                         "pin.mf");
    propagateShardings(*f);
    const TensorView* s = f->outputs()[0];
    ASSERT_EQ(s->definition()->kind(), OpKind::Set) << op;
    const auto* computed = static_cast<const TensorView*>(s->definition()->input(0));
    EXPECT_EQ(placementsOf(computed), std::vector<Placement>{Placement::replicate()}) << op;
    EXPECT_EQ(placementsOf(s), std::vector<Placement>{Placement::partial()}) << op;
    EXPECT_NO_THROW(decomposeReshardings(*f)) << op;
  }
}

// Decomposition alone (on a program already placed, as `meshfuse opt --pass=decompose-reshardings`
// reads one) says why an op cannot give a pending sum placed on its output.
std::string placedPartialError(const std::string& op) {
  auto f = parseFusion(R"(fusion {
  mesh @m = [0, 1]
  %q = input f32[8, 12, r2] @m {parallelize(2, DIDx)}
  %s = )" + op + R"( : f32[8, 12, r2] @m {parallelize(2, DIDx)}
  output %s
})",
                       "placed.mf");
  return userErrorMessage(ErrorKind::Unsupported, [&] { decomposeReshardings(*f); });
}

TEST(ShardingPropagation, APlacedPendingSumNoOperandCanGiveIsAnError) {
  EXPECT_EQ(placedPartialError("add(%q, 1.0)"),
            "add: its output %s is Partial() on mesh axis 0, which no sharding of operand 1.0 can give: a scalar "
            "would be added once per shard");
  EXPECT_EQ(placedPartialError("relu(%q)"),
            "relu: its output %s is Partial() on mesh axis 0, which no sharding of operand %q can give: relu is not "
            "linear, so a pending sum must be reduced before it");
}

// linear(%x Partial(), %w Partial()) needs one operand whole. Propagation keeps the pending sum
// of the parameter %w and makes %x whole (moving a parameter ranks last); the IR says so with a
// set of %x before the op, so decomposition all-reduces %x, not %w (placement fuzzer,
// s1-w2-c225: %w was all-reduced).
TEST(ShardingPropagation, TheKeptPendingOperandIsTheOneDecompositionKeeps) {
  auto f = parseFusion(R"(fusion {
  mesh @m = [0, 1]
  %x = input f32[2, 12, r2] @m {parallelize(2, DIDx)}
  %w = input f32[4, 12, r2] @m {parallelize(2, DIDx)}
  %y = linear(%x, %w)
  output %y
})");
  propagateShardings(*f);
  const Expr* linear = f->outputs()[0]->definition()->input(0)->definition();
  ASSERT_EQ(linear->kind(), OpKind::Linear);
  const Expr* made_whole = linear->input(0)->definition();
  ASSERT_NE(made_whole, nullptr);
  EXPECT_EQ(made_whole->kind(), OpKind::Set);
  EXPECT_EQ(made_whole->input(0), f->inputs()[0]);
  EXPECT_EQ(placementsOf(static_cast<const TensorView*>(linear->input(0))), std::vector<Placement>{Placement::replicate()});
  EXPECT_EQ(linear->input(1), f->inputs()[1]) << "the parameter keeps its pending sum";
  EXPECT_EQ(static_cast<const TensorView*>(linear->input(0))->provenanceNote().text,
            "linear keeps the pending sum of %w on mesh axis 0: {} is made Replicate() for it");
  decomposeReshardings(*f);
  int64_t reductions_of_w = 0;
  for (const Expr* e : f->exprs())
    if (e->kind() == OpKind::Set && e->input(0) == f->inputs()[1]) ++reductions_of_w;
  EXPECT_EQ(reductions_of_w, 0);
}

TEST(ShardingPropagation, PinnedTensorsRecordWhy) {
  auto f = parseFusion(R"(fusion {
  mesh @m = [0, 1]
  %x = input f32[8, 12] @m {split(0, 2), parallelize(0, DIDx)}
  %a = set(%x) : f32[8, 12] @m {split(1, 2), parallelize(1, DIDx)}
  output %a
})");
  propagateShardings(*f);
  EXPECT_EQ(f->inputs()[0]->provenance(), "pinned by the user: input %x placed [Shard(0)]");
  EXPECT_EQ(f->outputs()[0]->provenance(), "pinned by the user: %a set to [Shard(1)]");
}

TEST(FusionMutation, ReplaceOperandAtKeepsTheOtherSlot) {
  Fusion f;
  TensorView* a = f.defineTensor({8, 8}, DataType::Float, "a");
  TensorView* b = f.defineTensor({8, 8}, DataType::Float, "b");
  Expr* mm = ops::matmul(a, a)->definition();
  f.replaceOperandAt(mm, 1, b);
  EXPECT_EQ(mm->input(size_t{0}), a);
  EXPECT_EQ(mm->input(size_t{1}), b);
  EXPECT_THAT(a->uses(), ::testing::ElementsAre(mm)) << "%a is still read by slot 0";
  EXPECT_THAT(b->uses(), ::testing::ElementsAre(mm));
  f.replaceOperandAt(mm, 0, b);
  EXPECT_TRUE(a->uses().empty());
}

}  // namespace
}  // namespace meshfuse
